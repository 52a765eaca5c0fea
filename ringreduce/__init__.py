"""ringreduce: collective communication for data-parallel deep learning.

The collective set (all-reduce, broadcast, barrier, all-gather, reduce-scatter, reduce,
gather, scatter, all-to-all), point-to-point messages and groups, in a C++ core over shared
memory within a host and TCP across hosts, callable on torch tensors and numpy arrays; a
DistributedDataParallel wrapper (ringreduce.ddp) and a torch.distributed backend
("ringreduce")::

    import ringreduce as rr
    rr.init()                       # RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the launcher
    rr.allreduce(tensor, op="avg")  # in place, on every rank
    rr.destroy()
"""

try:
    from . import _C
except ImportError as _e:  # a source folder built for another Python, or not built
    import importlib.machinery as _machinery
    import os as _os
    import sys as _sys
    import sysconfig as _sysconfig

    _here = _os.path.dirname(_os.path.abspath(__file__))
    _lib = "_C" + str(_sysconfig.get_config_var("EXT_SUFFIX"))
    _found = [f"_C{x}" for x in _machinery.EXTENSION_SUFFIXES
              if _os.path.exists(_os.path.join(_here, f"_C{x}"))]
    _what = (f"{_found[0]} in {_here} does not load" if _found
             else f"{_here} has no {_lib} for this Python ({_sys.version.split()[0]}): a "
                  f"source tree not built for it")
    raise ImportError(
        f"ringreduce's compiled core: {_what}. Install ringreduce (pip install .) and run "
        f"from another folder, or rebuild it in place (python setup.py build_ext --inplace). "
        f"({_e})") from _e
from . import _state
from ._blame import mark_peer_failures as _mark_peer_failures
from ._C import CollectiveMismatch, CollectiveTimeout, PeerFailure, RingReduceError
from ._rooted import all_to_all, gather, reduce, scatter
from ._state import Group
from .api import (
    Work,
    abort,
    allgather,
    allreduce,
    allreduce_coalesced,
    barrier,
    broadcast,
    destroy,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    reduce_scatter,
)
from .groups import new_group, world_group
from .p2p import irecv, isend, recv, send

# rr.barrier() and rr.allreduce(ndarray) on the world, rr.send / rr.recv(ndarray, peer) on
# tag 0 run without a Python frame (the latency floor); any other call goes to the Python
# functions above, unchanged.
barrier = _C.FastCall(0, barrier, _state._FAST)
allreduce = _C.FastCall(1, allreduce, _state._FAST)
send = _C.FastCall(2, send, _state._SEND)
recv = _C.FastCall(3, recv, _state._RECV)

_mark_peer_failures(PeerFailure)  # in ringreduce-run's ranks only
# (pybind's exceptions say "Unspecified run-time error." in help())
RingReduceError.__doc__ = (
    "A collective, point-to-point call or group operation failed (a RuntimeError). A "
    "communicator whose collective failed refuses further calls: destroy() and init() "
    "again.")
PeerFailure.__doc__ = (
    "Another rank failed: .peer_rank names it (a world rank), .cause says how (closed, "
    "silent, network, aborted, left, ...), .relayed_by the rank that told this one (None: "
    "seen here).")
CollectiveTimeout.__doc__ = (
    "A collective or message waited past its deadline (RINGREDUCE_TIMEOUT, or the group's): "
    ".waiting_for names the rank it waited for, .peer_rank the rank its wait chain ended at, "
    ".relayed_by the rank that told this one. Also a builtins.TimeoutError.")
CollectiveMismatch.__doc__ = (
    "Ranks called different collectives, or the same one with different sizes, dtypes, ops "
    "or roots: .peer_rank names the rank that disagreed.")

__version__ = "0.1.0"

__all__ = [
    "CollectiveMismatch",
    "CollectiveTimeout",
    "Group",
    "PeerFailure",
    "RingReduceError",
    "Work",
    "abort",
    "all_to_all",
    "allgather",
    "allreduce",
    "allreduce_coalesced",
    "barrier",
    "broadcast",
    "destroy",
    "gather",
    "get_rank",
    "get_world_size",
    "init",
    "irecv",
    "is_initialized",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
    "world_group",
]

try:
    import torch as _torch  # noqa: F401
except ImportError:  # numpy-only install: no DDP, no torch.distributed backend
    pass
else:
    from . import backend as _backend  # noqa: F401  (registers the "ringreduce" backend)
    from .ddp import DistributedDataParallel, UnevenInputsError  # exported via __all__

    __all__ += ["DistributedDataParallel", "UnevenInputsError"]
