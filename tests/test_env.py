"""Tests of ringreduce/_env/ (loaded by path, without the extension): launch detection, SLURM hostlists, tunables, addresses.

The module is loaded from its file so these tests need neither the built extension nor the
package's __init__."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import socket
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "ringreduce" / "_env" / "__init__.py"
_spec = importlib.util.spec_from_file_location("_ringreduce_env_under_test", _PATH,
                                               submodule_search_locations=[str(_PATH.parent)])
env_mod = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = env_mod  # dataclasses look their module up here
_spec.loader.exec_module(env_mod)

detect = env_mod.detect_launch
LaunchInfo = env_mod.LaunchInfo

# --------------------------------------------------------------------------- detect_launch


@pytest.mark.timeout(60)
def test_single_process_default() -> None:
    assert detect({}) == LaunchInfo(0, 1, 0, 1, None, None, "default")
    info = detect({"MASTER_ADDR": "h0", "MASTER_PORT": "1234"})
    assert (info.master_addr, info.master_port, info.source) == ("h0", 1234, "default")


@pytest.mark.timeout(60)
def test_torchrun() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"}
    assert detect(env) == LaunchInfo(5, 8, 1, 4, "10.0.0.1", 29500, "torchrun")


@pytest.mark.timeout(60)
def test_explicit_rank_without_local_values() -> None:
    info = detect({"RANK": "2", "WORLD_SIZE": "3"})
    assert info == LaunchInfo(2, 3, 2, 3, None, None, "explicit")


@pytest.mark.timeout(60)
def test_openmpi() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "MASTER_ADDR": "node7"}
    assert detect(env) == LaunchInfo(3, 4, 1, 2, "node7", None, "openmpi")


@pytest.mark.timeout(60)
def test_pmi() -> None:
    env = {"PMI_RANK": "2", "PMI_SIZE": "6", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "3"}
    assert detect(env) == LaunchInfo(2, 6, 0, 3, None, None, "pmi")
    assert detect({"PMI_RANK": "1", "PMI_SIZE": "2"}) == LaunchInfo(1, 2, 1, 2, None, None,
                                                                    "pmi")


def _slurm(**extra: str) -> dict[str, str]:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "node[01-03]", "SLURM_JOB_ID": "4242"}
    env.update(extra)
    return env


@pytest.mark.timeout(60)
def test_slurm_tasks_per_node_forms() -> None:
    info = detect(_slurm(SLURM_TASKS_PER_NODE="2(x3)"))
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 6, 1, 2)
    assert info.source == "slurm" and info.master_addr == "node01"
    assert detect(_slurm(SLURM_TASKS_PER_NODE="4,2")).local_world_size == 2
    assert detect(_slurm(SLURM_TASKS_PER_NODE="1,3(x2)")).local_world_size == 3
    assert detect(_slurm(SLURM_NTASKS_PER_NODE="3")).local_world_size == 3
    # The step's layout wins over the job's.
    env = _slurm(SLURM_TASKS_PER_NODE="8(x2)", SLURM_STEP_TASKS_PER_NODE="5,2")
    assert detect(env).local_world_size == 2
    # Nothing about the layout: one node means all tasks are local.
    assert detect(_slurm(SLURM_JOB_NUM_NODES="1")).local_world_size == 6


@pytest.mark.timeout(60)
def test_slurm_master_addr_and_port() -> None:
    info = detect(_slurm(SLURM_NTASKS_PER_NODE="2", SLURM_STEP_NODELIST="gpu[7-8],cpu1"))
    assert info.master_addr == "gpu7"  # the step's first node, not the job's
    assert info.master_port is not None and 1024 < info.master_port < 65536
    assert detect(_slurm(SLURM_NTASKS_PER_NODE="2")).master_port == info.master_port
    info = detect(_slurm(SLURM_NTASKS_PER_NODE="2", MASTER_ADDR="head", MASTER_PORT="1111"))
    assert (info.master_addr, info.master_port) == ("head", 1111)
    env = _slurm(SLURM_NTASKS_PER_NODE="2")
    del env["SLURM_JOB_NODELIST"], env["SLURM_JOB_ID"]
    assert (detect(env).master_addr, detect(env).master_port) == (None, None)


def test_messages_name_the_launcher_variables_that_gave_the_values() -> None:
    """Under srun (or mpirun) without WORLD_SIZE/MASTER_*, a wait's question names what
    did give them (a rank started outside srun in a 4-task allocation was asked about a
    WORLD_SIZE and MASTER_ADDR nobody set; a helper); torchrun's and init()'s stay."""
    env = _slurm(SLURM_NTASKS_PER_NODE="2", SLURM_STEP_NODELIST="gpu[7-8]")
    try:
        env_mod.note_launch(detect(env), world_given=False, addr_given=False,
                            port_given=False, env=env)
        assert env_mod.same_launch_hint() == (
            "did every rank start, with the same world size (SLURM_NTASKS=6) and MASTER_ADDR "
            "(unset: the first host of SLURM_STEP_NODELIST)/MASTER_PORT (unset: derived from "
            "SLURM_JOB_ID and SLURM_STEP_ID)?")
        env_mod.note_launch(detect(env), world_given=True, addr_given=True, port_given=False,
                            env={**env, "MASTER_PORT": "1234"})
        assert env_mod.same_launch_hint() == ("did every rank start, with the same WORLD_SIZE "
                                              "and MASTER_ADDR/MASTER_PORT?")
        ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3",
                "PMIX_NAMESPACE": "prterun-x-1@1"}
        env_mod.note_launch(detect(ompi), world_given=False, addr_given=False,
                            port_given=False, env=ompi)
        assert env_mod.origin("WORLD_SIZE") == "world size (OMPI_COMM_WORLD_SIZE=3)"
        torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "5",
                    "TORCHELASTIC_RUN_ID": "x"}
        env_mod.note_launch(detect(torchrun), world_given=False, addr_given=False,
                            port_given=False, env=torchrun)
        assert [env_mod.origin(n) for n in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")] == [
            "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    finally:
        env_mod.launch._ORIGIN.clear()


def test_slurm_steps_get_their_own_port_and_job_id() -> None:
    """Each srun step derives its own port and run id: neighbouring job ids (job arrays
    share nodes) met on one port (job J step s + 7 = job J + 1 step s: a helper) and then
    blamed a duplicate RANK instead of naming the other job."""
    def step(job: int, s: int) -> dict[str, str]:
        return _slurm(SLURM_NTASKS_PER_NODE="2", SLURM_JOB_ID=str(job), SLURM_STEP_ID=str(s))
    ports = {(j, s): detect(step(j, s)).master_port for j in range(100, 140) for s in range(8)}
    assert all(20000 <= p < 40000 for p in ports.values())
    assert ports[(101, 0)] != ports[(100, 7)]
    assert len(set(ports.values())) > 0.95 * len(ports)  # a hash: collisions are chance
    def rid(env: dict[str, str], info: object = None) -> str:  # as init fixes it
        env_mod.note_launch(info or detect(env), world_given=False, addr_given=False,
                            port_given=False, env=env)
        return env_mod.run_id(env)
    try:
        assert rid(step(101, 0)) == "slurm-101.0" != rid(step(100, 7))
        # A launcher's own id wins; processes srun did not start take none from SLURM: the
        # batch script's (no step id; its port is its own), an MPI launcher's inside an
        # allocation (MPICH's mpiexec in a batch script: rank 0's PMI rank equals SLURM's
        # task id, the others' do not -- every rank must take the same id: none), and
        # hand-given ranks (init(rank=, world_size=), torch's init_process_group).
        assert rid({**step(1, 2), "TORCHELASTIC_RUN_ID": "abc"}) == "abc"
        batch = _slurm(SLURM_NTASKS_PER_NODE="2")  # no SLURM_STEP_ID
        assert rid(batch) == "" and detect(batch).master_port != detect(
            {**batch, "SLURM_STEP_ID": "0"}).master_port
        ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
        assert rid({**step(1, 2), **ompi}) == ""
        hydra = step(5, 1)  # (a step id too: the MPI launcher's variables decide)
        ids = {rid({**hydra, "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "PMI_RANK": str(r),
                    "PMI_SIZE": "4"}) for r in range(4)}
        assert ids == {""}, ids
        assert rid(step(1, 2), env_mod.launch_given(3, 6)) == ""
    finally:
        env_mod.launch._SRUN_ID[0] = ""
        env_mod.launch._ORIGIN.clear()


@pytest.mark.timeout(60)
def test_precedence() -> None:
    torchrun = {"RANK": "1", "WORLD_SIZE": "8"}  # >= the MPI counts (torchrun under mpirun)
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    pmi = {"PMI_RANK": "3", "PMI_SIZE": "4"}
    assert detect({**pmi, **slurm, **ompi, **torchrun}).source == "explicit"
    assert detect({**pmi, **slurm, **ompi}).source == "openmpi"
    # mpiexec (MPICH, Intel MPI) inside a SLURM allocation: the batch step's (or Hydra's
    # srun-started proxies') SLURM_PROCID/NTASKS disagree with PMI's, which describe the
    # job -- each process became rank 0 of 1 before (found by a helper).
    assert detect({**pmi, **slurm}).source == "pmi"
    assert detect({**pmi, **slurm}).rank == 3 and detect({**pmi, **slurm}).world_size == 4
    assert detect({**pmi, "SLURM_PROCID": "1", "SLURM_NTASKS": "4"}).source == "pmi"
    # srun --mpi=pmi2 sets both alike: SLURM's (with its node list and port) are read.
    assert detect({**pmi, "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}).source == "slurm"
    assert detect(pmi).source == "pmi"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env, message", [
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 but WORLD_SIZE=2: RANK must be in [0, WORLD_SIZE)"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 but WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0: WORLD_SIZE must be at least 1"),
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not an integer"),
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     "LOCAL_RANK=2 but LOCAL_WORLD_SIZE=2"),
    # LOCAL_WORLD_SIZE unset (it defaults to WORLD_SIZE): named it all the same before.
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "3"}, "LOCAL_RANK=3 but WORLD_SIZE=2"),
    ({"RANK": "", "WORLD_SIZE": "2"}, "RANK is empty"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
    ({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"},
     "OMPI_COMM_WORLD_RANK=4 but OMPI_COMM_WORLD_SIZE=4"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE is not set"),
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, "SLURM_PROCID='x' is not an integer"),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "2"}, "SLURM_PROCID=2 but SLURM_NTASKS=2"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2(3)"},
     "SLURM_TASKS_PER_NODE='2(3)'"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "2",
      "SLURM_NTASKS_PER_NODE": "2"}, "SLURM_LOCALID=2 but SLURM_NTASKS_PER_NODE=2"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-"},
     "SLURM_JOB_NODELIST='n[1-'"),
    ({"PMI_RANK": "1", "PMI_SIZE": "1.5"}, "PMI_SIZE='1.5' is not an integer"),
    # More ranks on a host than in the job (was accepted; found by a helper).
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "8"},
     "LOCAL_WORLD_SIZE=8 but WORLD_SIZE=2: a host cannot run more ranks"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, "OMPI_COMM_WORLD_LOCAL_SIZE=4 but OMPI_COMM_WORLD_SIZE=2"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "3"},
     "MPI_LOCALNRANKS=3 but PMI_SIZE=2"),
])
def test_bad_launch_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        detect(env)
    assert message in str(exc.value)


# --------------------------------------------------------------------------- hostlists


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hostlist, hosts", [
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("single", ["single"]),
    ("a,b , c", ["a", "b", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("r[1-2]n[1,3]", ["r1n1", "r1n3", "r2n1", "r2n3"]),
    ("gpu[2]-ib", ["gpu2-ib"]),
    ("x[1-2],y[01-02].cluster", ["x1", "x2", "y01.cluster", "y02.cluster"]),
])
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert list(env_mod.expand_hostlist(hostlist)) == hosts


@pytest.mark.timeout(60)
def test_first_host_of_a_huge_hostlist_is_cheap() -> None:
    assert next(env_mod.expand_hostlist("n[0000000-9999999]")) == "n0000000"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hostlist", ["n[1-", "n]1[", "n[]", "n[3-1]", "n[a-b]", "n[[1]]"])
def test_bad_hostlist(hostlist: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        list(env_mod.expand_hostlist(hostlist))


# --------------------------------------------------------------------------- tunables


@pytest.mark.timeout(60)
def test_tunable_defaults() -> None:
    t = env_mod.tunables({})
    assert (t.timeout, t.connect_timeout, t.segment_bytes) == (600.0, 120.0, 524288)
    assert (t.transport, t.algo, t.debug, t.checksum, t.use_agent_store) == (
        "auto", "auto", "WARN", False, False)
    assert t.socket_ifname is t.secret is t.tree_threshold_bytes is None
    assert t.tuning_file is t.trace is None


@pytest.mark.timeout(60)
def test_tunables_parsed() -> None:
    t = env_mod.tunables({
        "RINGREDUCE_TIMEOUT": "2.5", "RINGREDUCE_CONNECT_TIMEOUT": "30",
        "RINGREDUCE_SOCKET_IFNAME": "eth0", "RINGREDUCE_SECRET": "hunter2",
        "RINGREDUCE_DEBUG": "info", "RINGREDUCE_TRANSPORT": "SHM", "RINGREDUCE_ALGO": "tree",
        "RINGREDUCE_SEGMENT_BYTES": "1M", "RINGREDUCE_TREE_THRESHOLD_BYTES": "0",
        "RINGREDUCE_TUNING_FILE": "/tmp/t.json", "RINGREDUCE_TRACE": "/tmp/trace-{rank}",
        "RINGREDUCE_CHECKSUM": "yes", "TORCHELASTIC_USE_AGENT_STORE": "True",
        "RINGREDUCE_HALF_WIRE": " 32",
    })
    assert t.half_wire == 32 and env_mod.tunables({}).half_wire == 16
    assert (t.timeout, t.connect_timeout, t.socket_ifname) == (2.5, 30.0, "eth0")
    assert (t.secret, t.debug, t.transport, t.algo) == ("hunter2", "INFO", "shm", "tree")
    assert (t.segment_bytes, t.tree_threshold_bytes) == (1 << 20, 0)
    assert (t.tuning_file, t.trace) == ("/tmp/t.json", "/tmp/trace-{rank}")
    assert t.checksum is True and t.use_agent_store is True
    assert "hunter2" not in repr(t), "the secret must not show up in logs"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("raw, value", [
    ("1", True), ("TRUE", True), ("on", True), ("0", False), ("False", False), ("no", False),
])
def test_tunable_bools(raw: str, value: bool) -> None:
    assert env_mod.tunables({"RINGREDUCE_CHECKSUM": raw}).checksum is value
    assert env_mod.tunables({"TORCHELASTIC_USE_AGENT_STORE": raw}).use_agent_store is value


@pytest.mark.timeout(60)
def test_empty_values_mean_default() -> None:
    t = env_mod.tunables({"RINGREDUCE_TIMEOUT": "", "RINGREDUCE_ALGO": " ",
                          "RINGREDUCE_SOCKET_IFNAME": "", "RINGREDUCE_DEBUG": ""})
    assert (t.timeout, t.algo, t.socket_ifname, t.debug) == (600.0, "auto", None, "WARN")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, raw, allowed", [
    ("RINGREDUCE_TIMEOUT", "soon", "positive number of seconds"),
    ("RINGREDUCE_TIMEOUT", "-1", "positive number of seconds"),
    ("RINGREDUCE_TIMEOUT", "nan", "positive number of seconds"),
    ("RINGREDUCE_CONNECT_TIMEOUT", "0", "positive number of seconds"),
    ("RINGREDUCE_DEBUG", "verbose", "'WARN', 'INFO', 'DEBUG', 'TRACE'"),
    ("RINGREDUCE_TRANSPORT", "ib", "'auto', 'tcp', 'shm'"),
    ("RINGREDUCE_ALGO", "butterfly", "'auto', 'ring', 'tree'"),
    ("RINGREDUCE_SEGMENT_BYTES", "0", "positive number of bytes"),
    ("RINGREDUCE_SEGMENT_BYTES", "1.5M", "whole number of bytes"),
    ("RINGREDUCE_SEGMENT_BYTES", "99999999999G", "below 4 EiB"),  # was a pybind cast error
    ("RINGREDUCE_TREE_THRESHOLD_BYTES", "-5", "whole number of bytes"),
    ("RINGREDUCE_HALF_WIRE", "8", "16 (16-bit partial sums on the wire) or 32"),
    ("RINGREDUCE_CHECKSUM", "maybe", "true"),
    ("TORCHELASTIC_USE_AGENT_STORE", "2", "false"),
    ("RINGREDUCE_CALL_SITES", "sometimes", "true"),
    ("RINGREDUCE_FAULT", "collective=allreduce", "rank=R"),          # no rank
    ("RINGREDUCE_FAULT", "rank=1,action=explode", "action=kill|stop|exit|hang"),
    ("RINGREDUCE_FAULT", "rank=1,at=middle", "at=begin|mid|end"),
    ("RINGREDUCE_FAULT", "rank=1,seq=0", "seq=N"),
    ("RINGREDUCE_FAULT", "rank=1,collective=alltoall", "collective=any|allreduce"),
    ("RINGREDUCE_FAULT", "rank=1;seq=2", "rank=R"),
])
def test_bad_tunables(name: str, raw: str, allowed: str) -> None:
    with pytest.raises(ValueError) as exc:
        env_mod.tunables({name: raw})
    message = str(exc.value)
    assert message.startswith(f"{name}={raw!r} is not valid; allowed: ")
    assert allowed in message


@pytest.mark.parametrize("env, message", [
    ({"RINGREDUCE_SEGMENT_BYTES": "1"}, "RINGREDUCE_SEGMENT_BYTES=1: expected 64 bytes to 1G"),
    # was accepted: std::bad_alloc at the first ring step, blaming the buffer (a helper)
    ({"RINGREDUCE_SEGMENT_BYTES": "100G"}, "RINGREDUCE_SEGMENT_BYTES=107374182400: expected"),
    ({"RINGREDUCE_FULL_MESH_MAX": "99999999999999999999"}, "RINGREDUCE_FULL_MESH_MAX="),
    ({"RINGREDUCE_HEARTBEAT_INTERVAL": "10"},
     "RINGREDUCE_HEARTBEAT_INTERVAL=10 must be shorter than RINGREDUCE_HEARTBEAT_TIMEOUT=4"),
    ({"RINGREDUCE_HEARTBEAT_INTERVAL": "1", "RINGREDUCE_HEARTBEAT_TIMEOUT": "1"},
     "must be shorter"),
    ({"RINGREDUCE_HEARTBEAT_INTERVAL": "1e-9"},  # was accepted: a quarter core per idle rank
     "RINGREDUCE_HEARTBEAT_INTERVAL=1e-09: expected at least 0.01 seconds"),
    ({"RINGREDUCE_ALGO": "shm", "RINGREDUCE_TRANSPORT": "tcp"},  # was refused at the first
     "RINGREDUCE_ALGO=shm needs shared memory, which RINGREDUCE_TRANSPORT=tcp"),  # call, as algo=
])
def test_values_the_core_or_each_other_refuse(env: dict, message: str) -> None:
    """Refused when read, naming the variables (were: a ValueError at connect naming no
    variable, a pybind11 cast error, or a healthy peer declared dead every few seconds)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        env_mod.tunables(env)
    env_mod.tunables({"RINGREDUCE_HEARTBEAT_INTERVAL": "10", "RINGREDUCE_HEARTBEAT_TIMEOUT": "0"})


def test_fault_spec_parsed() -> None:
    f = env_mod.tunables({"RINGREDUCE_FAULT": "rank=2, collective=broadcast, seq=7, at=end, "
                                             "action=stop, stamp=/tmp/t"}).fault
    assert f == {"rank": 2, "collective": "broadcast", "seq": 7, "at": "end", "action": "stop",
                 "stamp": "/tmp/t"}
    assert env_mod.tunables({"RINGREDUCE_FAULT": "rank=0"}).fault == {
        "rank": 0, "collective": "any", "seq": 1, "at": "mid", "action": "kill", "stamp": ""}
    assert env_mod.tunables({}).fault is None and env_mod.tunables({}).call_sites is True


def test_fault_rank_outside_the_job_is_refused_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault for a rank the job does not have would never fire: init says so."""
    import ringreduce as rr
    monkeypatch.setenv("RINGREDUCE_FAULT", "rank=1,action=stop")
    with pytest.raises(ValueError, match=r"RINGREDUCE_FAULT names rank 1, but this job has "
                                         r"ranks 0-0: no fault would fire"):
        rr.init(rank=0, world_size=1)
    assert not rr.is_initialized()
    monkeypatch.setenv("RINGREDUCE_FAULT", "rank=0,action=stop")
    rr.init(rank=0, world_size=1)  # (a 1-rank job has no peer to fail against: none armed)
    try:
        assert rr.is_initialized()
    finally:
        rr.destroy()


@pytest.mark.timeout(60)
def test_describe_tunables_lists_every_knob() -> None:
    text = env_mod.describe_tunables()
    for name in ("RINGREDUCE_TIMEOUT", "RINGREDUCE_CONNECT_TIMEOUT", "RINGREDUCE_SOCKET_IFNAME",
                 "RINGREDUCE_SECRET", "RINGREDUCE_DEBUG", "RINGREDUCE_TRANSPORT",
                 "RINGREDUCE_ALGO", "RINGREDUCE_SEGMENT_BYTES",
                 "RINGREDUCE_TREE_THRESHOLD_BYTES", "RINGREDUCE_TUNING_FILE", "RINGREDUCE_TRACE",
                 "RINGREDUCE_CHECKSUM", "RINGREDUCE_HALF_WIRE", "TORCHELASTIC_USE_AGENT_STORE"):
        assert name in text
    assert "default 600.0" in text


# --------------------------------------------------------------------------- addresses


def _has_interface(name: str) -> bool:
    try:
        return name in [n for _, n in socket.if_nameindex()]
    except OSError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.skipif(not _has_interface("lo"), reason="no interface named lo")
def test_interface_lo() -> None:
    assert env_mod.select_interface_address(None, "lo") == "127.0.0.1"
    # IPv6's loopback as given (a host may have no 127.0.0.1); other loopback names: IPv4
    assert env_mod.select_interface_address("::1", None) == "::1"
    assert env_mod.select_interface_address("localhost", None) == "127.0.0.1"
    assert env_mod.select_interface_address("10.1.2.3", "lo") == "127.0.0.1"  # ifname wins
    assert env_mod.select_interface_address(None, "no_such0,lo") == "127.0.0.1"
    for empty in (",", " , "):  # a list of nothing: said so (was a bare ValueError(''))
        with pytest.raises(ValueError, match=r"names no interface.*available: .*\blo\b"):
            env_mod.select_interface_address(None, empty)


def test_ifname_is_read_as_nccl_reads_its_own() -> None:
    """RINGREDUCE_SOCKET_IFNAME as NCCL_SOCKET_IFNAME: prefixes, "=" exact, "^" excludes."""
    groups = env_mod.netif._ifname_groups
    names = ["lo", "eth0", "eth10", "eth2", "ib0", "docker0", "lo2"]
    assert groups("eth", names) == ([["eth0", "eth2", "eth10"]], False)  # eth2 before eth10
    assert groups("eth1", names) == ([["eth10"]], False)
    assert groups("eth10", names) == ([["eth10"]], False)  # the exact name first
    assert groups("=eth0", names) == ([["eth0"]], False)
    assert groups("ib, eth2", names) == ([["ib0"], ["eth2"]], False)  # entries in turn
    assert groups("eth, eth2", names) == ([["eth0", "eth2", "eth10"]], False)
    assert groups("^docker,=lo", names) == ([["eth0", "eth10", "eth2", "ib0", "lo2"]], True)
    assert groups("^eth,ib,docker,lo", names) == ([], True)
    # tried as given (refused there: "does not exist") when nothing matches or none listed
    assert groups("=et", names) == ([["et"]], False) and groups("wlan", names) == (
        [["wlan"]], False)
    assert groups("eth0", []) == ([["eth0"]], False) and groups("^lo", []) == ([], True)


def test_ifname_entry_matching_several_takes_the_one_routing_to_master(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefix (or the rest after "^") matching several interfaces: the one that routes to
    MASTER_ADDR (the review: a prefix took the first, maybe a management network the other
    hosts cannot reach), else the first (after "^": the first that is not loopback)."""
    netif = env_mod.netif
    addrs = {"lo": "127.0.0.1", "eth0": "10.0.0.1", "eth1": "10.1.0.1", "ib0": "10.2.0.1"}
    monkeypatch.setattr(netif, "_interface_names", lambda: list(addrs))
    monkeypatch.setattr(netif, "_ioctl_ipv4", lambda name: addrs[name])
    monkeypatch.setattr(netif, "_route_source", lambda master, timeout: {
        "10.1.0.9": "10.1.0.1", "10.2.0.9": "10.2.0.1"}[master])
    select = netif.select_interface_address
    assert select("10.1.0.9", "eth") == "10.1.0.1" and select("10.1.0.9", "^lo") == "10.1.0.1"
    assert select(None, "eth") == "10.0.0.1" and select(None, "^lo,eth0") == "10.1.0.1"
    assert select("10.2.0.9", "eth") == "10.0.0.1"  # the route leaves by another: the first
    assert select("10.1.0.9", "eth0,eth1") == "10.0.0.1"  # a list's entries: in turn
    assert select("127.0.0.1", "^eth,ib") == "127.0.0.1"
    monkeypatch.setattr(netif, "_interface_names", list)  # cannot list them
    with pytest.raises(ValueError, match="needs this host's list of interfaces"):
        select(None, "^lo")
    assert select(None, "eth1") == "10.1.0.1"  # a name still works


@pytest.mark.timeout(60)
@pytest.mark.skipif(not _has_interface("lo"), reason="no interface named lo")
def test_ifname_prefixes_and_exclusions_pick_an_address() -> None:
    select = env_mod.select_interface_address
    assert select(None, "l") == "127.0.0.1"  # a prefix of lo
    with pytest.raises(ValueError, match=r"'l' does not exist.*available interfaces: .*lo "):
        select(None, "=l")
    every = ",".join(sorted({n[0] for _, n in socket.if_nameindex()}))
    with pytest.raises(ValueError, match=r"excludes every interface.*available: .*\blo\b"):
        select(None, "^" + every)
    others = []  # the other interfaces with an IPv4 address, in the host's order
    for _, name in socket.if_nameindex():
        try:
            if name != "lo":
                others.append(env_mod.netif._ioctl_ipv4(name))
        except OSError:
            pass
    if others:  # excluding loopback: the first other one (no MASTER_ADDR to route to)
        assert select(None, "^lo") == next(a for a in others if not a.startswith("127."))
        assert select("127.0.0.1", "^=lo") != "127.0.0.1"
    else:
        with pytest.raises(ValueError, match="has no IPv4 address|excludes every interface"):
            select(None, "^lo")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("master", [None, "127.0.0.1", "127.0.1.1", "localhost"])
def test_loopback_master(master: str | None) -> None:
    assert env_mod.select_interface_address(master, None) == "127.0.0.1"


@pytest.mark.timeout(60)
def test_master_on_this_host_routes_to_itself() -> None:
    local = env_mod.select_interface_address("127.0.0.2", None)
    assert local == "127.0.0.1"
    try:
        own = socket.gethostbyname(socket.gethostname())
    except OSError:
        pytest.skip("this host's name does not resolve")
    assert env_mod.select_interface_address(own, None) == own


@pytest.mark.timeout(60)
def test_missing_interface_lists_available_ones() -> None:
    with pytest.raises(ValueError) as exc:
        env_mod.select_interface_address(None, "no_such_if0")
    message = str(exc.value)
    assert "'no_such_if0' does not exist" in message and "RINGREDUCE_SOCKET_IFNAME" in message
    if _has_interface("lo"):  # with its address: one without cannot be used (a helper)
        assert "available interfaces: " in message and "lo (127.0.0.1)" in message


@pytest.mark.timeout(60)
def test_host_identity() -> None:
    ident = env_mod.host_identity()
    assert ident == env_mod.host_identity()
    assert ident.startswith(socket.gethostname() + "/")
    assert len(ident) == len(socket.gethostname()) + 22  # host/12 hex digits/8 (network)


def test_a_loopback_address_other_hosts_cannot_reach_is_found() -> None:
    """A rank whose MASTER_ADDR resolves to loopback on its own host (Debian's '127.0.1.1
    <hostname>' line) listens there; ranks on other hosts would dial their own host."""
    find = env_mod.netif.unreachable_loopback
    one, two = "a/x/n1", "b/y/n2"
    assert find(["127.0.0.1:5", "10.0.0.2:6"], [one, two]) == [(0, [1])]
    assert find(["[::1]:5", "10.0.0.2:6", "10.0.0.2:7"], [one, two, two]) == [(0, [1, 2])]
    assert find(["127.0.0.1:5", "127.0.0.1:6"], [one, one]) == []  # one host
    # Another /dev/shm, the same network (a container on the host's network): reachable.
    assert find(["127.0.0.1:5", "127.0.0.1:6"], [one, "a/z/n1"]) == []
    assert find(["10.0.0.1:5", "10.0.0.2:6"], [one, two]) == []


@pytest.mark.timeout(60)
def test_tunables_are_the_core_table() -> None:
    """One declaration (csrc/core/tunables.def): Tunables' fields, defaults and variables are
    the extension's table, the core accepts every value Python passes it, and the README
    lists every variable."""
    import dataclasses

    C = env_mod.tunables.__globals__["_C"]
    rows = list(C.TUNABLES)
    assert [f.name for f in dataclasses.fields(env_mod.Tunables)] == [r["name"] for r in rows]
    assert len({r["env"] for r in rows}) == len(rows)
    defaults = env_mod.tunables({})
    for r in rows:
        if r["core"]:
            assert getattr(defaults, r["name"]) == r["default"], r
    opts = env_mod.core_options(defaults)
    assert set(opts) == {r["name"] for r in rows if r["core"] and r["default"] is not None}
    assert C.choose_allreduce(2, 8, opts) >= 0  # the core parses every key Python sends
    assert C.choose_allreduce(2, 8, {**opts, "tree_threshold_bytes": 0}) >= 0
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        C.choose_allreduce(2, 8, {"bogus": 1})
    with pytest.raises(ValueError, match="stall_warn=-1 is out of range"):
        C.choose_allreduce(2, 8, {"stall_warn": -1.0})
    readme = (_PATH.parents[2] / "README.md").read_text()
    section = readme[readme.index("## Environment variables"):readme.index("## GPU status")]
    missing = [r["env"] for r in rows if r["env"].replace("RINGREDUCE_HEARTBEAT_TIMEOUT",
                                                          "_TIMEOUT") not in section]
    assert not missing, f"README's Environment variables section lacks {missing}"
    assert {k: v for k, v in env_mod.FAULT_COLLECTIVES.items() if k != "any"} == \
        dict(C.COLLECTIVE_CODES)
    # RINGREDUCE_DEBUG's choices are the core's log levels, in order
    debug = next(r for r in rows if r["env"] == "RINGREDUCE_DEBUG")
    assert [c.strip() for c in debug["shown"].split("|")] == list(C.LOG_LEVELS), debug
    assert list(C.LOG_LEVELS.values()) == list(range(len(C.LOG_LEVELS)))


@pytest.mark.timeout(60)
def test_no_module_reads_a_tunable_itself() -> None:
    """Only ringreduce/_env reads RINGREDUCE_* variables (the launcher passes the secret on)."""
    import re

    pkg = _PATH.parents[1]
    pattern = re.compile(r"environ\.get\(\s*[\"']RINGREDUCE_"
                         r"|environ\[\s*[\"']RINGREDUCE_\w+[\"']\](?!\s*=[^=])")
    readers = [str(p.relative_to(pkg)) for p in pkg.rglob("*.py")
               if "_env" not in p.parts and pattern.search(p.read_text())]
    assert readers == ["run.py"], readers


def test_launch_given_wins_over_the_environment():
    """torch hands rank and world size to the backend: the environment only adds the local
    rank, and nothing in it can fail the init (Lightning never sets RANK)."""
    given = env_mod.launch_given
    lightning = {"WORLD_SIZE": "4", "LOCAL_RANK": "1", "NODE_RANK": "1"}
    info = given(3, 4, lightning)
    assert (info.rank, info.world_size, info.local_rank, info.source) == (3, 4, 1, "given")
    assert info.local_world_size == 2  # unknown: the least that fits local rank 1
    info = given(2, 4, {"RANK": "7", "WORLD_SIZE": "9", "LOCAL_RANK": "x",
                        "MASTER_PORT": "bad", "MASTER_ADDR": "h"})
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (2, 4, 2, 4)
    assert (info.master_addr, info.master_port) == ("h", None)
    info = given(5, 8, {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (info.local_rank, info.local_world_size) == (1, 4)
    assert given(0, 1, {}).local_world_size == 1
    with pytest.raises(ValueError, match="rank 4 is out of range for world_size 4"):
        given(4, 4, {})


def test_open_mpi_on_one_host_needs_no_master_variables() -> None:
    """`mpirun -n 3 python train.py` works as written: one host -> 127.0.0.1 and a port
    every process of the job derives from its PMIx namespace (MASTER_* still win); across
    hosts nothing can be guessed, so the rendezvous asks for -x MASTER_ADDR."""
    base = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
            "PMIX_NAMESPACE": "prterun-vm-29868@1"}
    a = env_mod.detect_launch(base)
    b = env_mod.detect_launch({**base, "OMPI_COMM_WORLD_RANK": "2"})
    c = env_mod.detect_launch({**base, "PMIX_NAMESPACE": "prterun-vm-4242@1"})
    assert a.master_addr == "127.0.0.1" and 20000 <= a.master_port < 40000
    assert (a.master_addr, a.master_port) == (b.master_addr, b.master_port)
    assert c.master_port != a.master_port  # another job, another port
    assert env_mod.detect_launch({**base, "MASTER_PORT": "2345"}).master_port == 2345
    multi = env_mod.detect_launch({**base, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert multi.master_addr is None and multi.master_port is None


def test_leftover_rank_variables_under_mpirun_are_an_error() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "1",
           "OMPI_COMM_WORLD_SIZE": "2"}
    with pytest.raises(ValueError, match="WORLD_SIZE=1 but OMPI_COMM_WORLD_SIZE=2"):
        env_mod.detect_launch(env)
    # torchrun under mpirun (one agent per host): WORLD_SIZE >= the MPI process count
    info = env_mod.detect_launch({**env, "RANK": "5", "WORLD_SIZE": "8"})
    assert (info.rank, info.world_size) == (5, 8)


@pytest.mark.parametrize("text,message", [
    ("5", "expected a JSON object"),  # was TypeError: argument of type 'int' is not iterable
    ('{"alpha_us": "fast"}', "alpha_us='fast': expected a finite number >= 0"),  # pybind cast
    ('{"beta_ns_per_byte": -1}', "beta_ns_per_byte=-1: expected"),  # was accepted
    ('{"alpha_us": NaN}', "alpha_us=nan: expected"),
])
def test_bad_tuning_files_are_refused_naming_the_variable(tmp_path, text, message) -> None:
    from ringreduce import api

    f = tmp_path / "tuning.json"
    f.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"RINGREDUCE_TUNING_FILE={f}: ")) as e:
        api._load_tuning(str(f))
    assert message in str(e.value)
    f.write_text('{"alpha_us": 12.5, "tree_threshold_bytes": 65536, "other": 1}')
    assert api._load_tuning(str(f)) == {"alpha_us": 12.5, "tree_threshold_bytes": 65536}


def test_an_explicit_tree_threshold_beats_the_tuning_file(tmp_path, monkeypatch) -> None:
    """The tuning file's fit applies unless RINGREDUCE_TREE_THRESHOLD_BYTES is set (the
    file overrode it, unlike every other explicit setting)."""
    import ringreduce as rr
    from ringreduce import _state

    f = tmp_path / "tuning.json"
    f.write_text('{"alpha_us": 12.5, "tree_threshold_bytes": 65536}')
    monkeypatch.setenv("RINGREDUCE_TUNING_FILE", str(f))
    for given, expected in [(None, 65536), ("1234", 1234)]:
        if given is not None:
            monkeypatch.setenv("RINGREDUCE_TREE_THRESHOLD_BYTES", given)
        rr.init(rank=0, world_size=1)
        try:
            opts = _state._DEFAULT[0].options
            assert (opts["tree_threshold_bytes"], opts["alpha_us"]) == (expected, 12.5)
        finally:
            rr.destroy()


def test_a_misspelt_variable_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    """RINGREDUCE_TIMEOUTS=2 was ignored without a word, leaving the 600 s default (found by
    a helper): an unknown RINGREDUCE_* name is warned about, once, with the closest one."""
    tmod = importlib.import_module("ringreduce._env.tunables")  # the package's name is a function
    tmod._WARNED.discard("RINGREDUCE_TIMEOUTS")
    env = {"RINGREDUCE_TIMEOUTS": "2", "RINGREDUCE_CUDA": "0", "RINGREDUCE_TIMEOUT": "5"}
    with caplog.at_level(logging.WARNING, logger="ringreduce"):
        assert tmod.tunables(env).timeout == 5.0
        tmod.tunables(env)
    said = [r.getMessage() for r in caplog.records]
    want = ("RINGREDUCE_TIMEOUTS is not a ringreduce setting and is ignored; did you mean "
            "RINGREDUCE_TIMEOUT? (ringreduce-run --help lists them)")
    assert said == [want], said


def test_an_abbreviated_setting_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """RINGREDUCE_SEGMENT=1M got no hint (no close spelling): the setting it begins is."""
    tmod = importlib.import_module("ringreduce._env.tunables")
    tmod._WARNED.discard("RINGREDUCE_SEGMENT")
    with caplog.at_level(logging.WARNING, logger="ringreduce"):
        tmod.tunables({"RINGREDUCE_SEGMENT": "1M"})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "did you mean RINGREDUCE_SEGMENT_BYTES?" in said[0], said


def test_job_wide_line_has_the_tuning_fit_and_bools_as_numbers() -> None:
    t = env_mod.tunables({"RINGREDUCE_CHECKSUM": "1"})
    line = dict(kv.split("=", 1) for kv in env_mod.job_wide(t, {"alpha_us": 3.5}).split(";"))
    assert line["RINGREDUCE_CHECKSUM"] == "1" and line["RINGREDUCE_CMA"] == "1", line
    assert line["RINGREDUCE_TUNING_FILE's alpha_us"] == "3.5", line
    assert line["RINGREDUCE_TUNING_FILE's beta_ns_per_byte"] == "built-in", line


@pytest.mark.parametrize("env,want", [
    ({"LOCAL_RANK": "2", "SLURM_LOCALID": "5"}, 2),  # torchrun's first
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 1),
    ({"SLURM_LOCALID": "3"}, 3),
    ({"PMI_LOCAL_RANK": "4"}, 4),
    ({}, 0),
    ({"LOCAL_RANK": "x"}, 0),
])
def test_local_rank_from_any_launcher(env: dict, want: int) -> None:
    """NcclCommunicator's default device: it read LOCAL_RANK only (GPU 0 for every rank of
    an mpirun or srun job)."""
    assert env_mod.local_rank(env) == want
