"""The one package that reads the environment (split by concern: launch, tunables, netif).

Everything ringreduce learns from environment variables comes through here:

* :func:`detect_launch` -- rank / world size / local rank and the rendezvous address, from
  torchrun (and ``ringreduce-run``), Open MPI, SLURM or MPICH/Hydra PMI variables (and
  :func:`local_rank`, :func:`run_id`, :func:`restart_count`, :func:`peer_failures_folder`);
* :func:`tunables` -- every ``RINGREDUCE_*`` knob as :class:`Tunables`, built from the one
  table declaring each with its variable name, default, type and meaning
  (``csrc/core/tunables.def``, exported by the extension as ``_C.TUNABLES``);
* :func:`select_interface_address` and :func:`host_identity` -- what this process tells its
  peers through the rendezvous store.

This package imports nothing from the rest of ringreduce but its extension, which it loads by
path (so the launcher and tests can use it without importing the package -- and torch) --
and nothing outside the standard library.
"""

from __future__ import annotations

from .launch import (
    PEER_FAILURES_VAR,
    RUN_ID_VARS,
    LaunchInfo,
    detect_launch,
    expand_hostlist,
    launch_given,
    local_rank,
    note_launch,
    origin,
    peer_failures_folder,
    restart_count,
    run_id,
    same_launch_hint,
)
from .netif import host_identity, resolve, select_interface_address
from .tunables import (
    FAULT_COLLECTIVES,
    MAX_WAIT_S,
    Tunables,
    check_seconds,
    core_options,
    describe_tunables,
    is_set,
    job_wide,
    store_tunables,
    tunables,
)

__all__ = [
    "FAULT_COLLECTIVES",
    "MAX_WAIT_S",
    "PEER_FAILURES_VAR",
    "RUN_ID_VARS",
    "LaunchInfo",
    "Tunables",
    "check_seconds",
    "core_options",
    "describe_tunables",
    "detect_launch",
    "expand_hostlist",
    "host_identity",
    "is_set",
    "job_wide",
    "launch_given",
    "local_rank",
    "note_launch",
    "origin",
    "peer_failures_folder",
    "resolve",
    "restart_count",
    "run_id",
    "same_launch_hint",
    "select_interface_address",
    "store_tunables",
    "tunables",
]
