"""CUDA inputs in ringreduce's collectives (ringreduce/_gpu_route.py, _gpu_staging.py).

Checked here without a GPU: the routing decisions (auto/nccl/staged, the group-wide NCCL
verdict), the errors when no device exists, the argument checks on CUDA inputs (they raise
before any byte moves), and the whole staged orchestration -- copy in, CPU collective, copy
back, async Work, pool reuse -- on 1 and 2 ranks with fake CUDA buffers that live in host
memory and a stager that copies with memmove. Marked ``gpu``: the same on real devices
(staged on 1 GPU; NCCL only with >= 2 GPUs).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from _spawn import run_world
from gpu_common import _CUDA_OK, _CUDA_REASON

import ringreduce as rr
from ringreduce import gpu
from ringreduce.gpu import arrays as gpu_arrays
from ringreduce.gpu import device as gpu_device
from ringreduce.gpu import route as _gpu_route
from ringreduce.gpu import staging as _gpu_staging

# ---------------------------------------------------------------------------------------
# Fakes: CUDA-looking buffers in host memory, and a stager that memmoves
# ---------------------------------------------------------------------------------------


class NpCuda:
    """A numpy array presented through __cuda_array_interface__ (v3) as a CUDA array."""

    def __init__(self, a: np.ndarray, device: int = 0, stream: int = 1):
        self.a = a
        self.__cuda_array_interface__ = {
            "shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
            "version": 3, "strides": None if a.flags.c_contiguous else a.strides,
            "stream": stream}
        self.device = type("Dev", (), {"id": device})()


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it is on cuda:<dev> (the adapters only read metadata)."""

    _dev = 0

    @staticmethod
    def of(t: torch.Tensor, dev: int = 0) -> FakeCudaTensor:
        x = torch.Tensor._make_subclass(FakeCudaTensor, t)
        x._dev = dev
        return x

    @property
    def device(self):
        return torch.device("cuda", self._dev)

    @property
    def is_cuda(self):
        return True


class MemmoveStager(_gpu_staging.Stager):
    """Staging with memmove: the fakes' "device" memory is host memory. Logs every step."""

    name = "memmove"

    def __init__(self):
        self.log: list = []

    def stream_of(self, b):
        return f"s{b.stream}"

    def alloc(self, dtype, count, device):
        a = np.zeros(max(count, 1) * gpu_arrays._ITEMSIZE[dtype], dtype=np.uint8)
        self.log.append(("alloc", dtype, count))
        return _gpu_staging.HostBuf(a, a.ctypes.data, dtype, count)

    def to_host(self, host, offset, b, stream):
        self.log.append(("to_host", offset, b.count, stream))
        ctypes.memmove(host.ptr + offset * gpu_arrays._ITEMSIZE[b.dtype], b.ptr, b.nbytes)

    def to_device(self, b, host, offset, stream):
        self.log.append(("to_device", offset, b.count, stream))
        ctypes.memmove(b.ptr, host.ptr + offset * gpu_arrays._ITEMSIZE[b.dtype], b.nbytes)

    def synchronize(self, stream):
        self.log.append(("sync", stream))


def _fake_gpu(monkeypatch, nccl=(False, "no NCCL (test)"), staging=(True, "fake")):
    stager = MemmoveStager()
    monkeypatch.setattr(_gpu_staging, "make_stager", lambda torch_tensor: stager)
    monkeypatch.setattr(_gpu_staging, "stager_status", lambda torch_tensor: staging)
    monkeypatch.setattr(gpu_device, "nccl_available", lambda: nccl)
    return stager


@pytest.fixture
def world1():
    rr.init(0, 1)
    yield
    rr.destroy()


# ---------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------


def test_decide_matrix():
    yes, no = (True, "ok"), (False, "libnccl.so.2 not found")
    assert _gpu_route.decide("auto", yes, yes) == "nccl"
    assert _gpu_route.decide("auto", no, yes) == "staged"
    assert _gpu_route.decide("staged", yes, yes) == "staged"
    assert _gpu_route.decide("nccl", yes, no) == "nccl"
    with pytest.raises(gpu.NcclUnavailable, match="backend='nccl' cannot be used: libnccl"):
        _gpu_route.decide("nccl", no, yes)
    with pytest.raises(gpu.CudaUnavailable, match="cannot be staged.*no dev.*NCCL is not usable"):
        _gpu_route.decide("auto", no, (False, "no dev"))
    with pytest.raises(gpu.CudaUnavailable, match="cannot be staged.*no dev; move"):
        _gpu_route.decide("staged", yes, (False, "no dev"))
    assert _gpu_route.normalize_backend("HOST") == "staged"
    with pytest.raises(ValueError, match="unknown backend 'gloo'"):
        _gpu_route.normalize_backend("gloo")


def test_auto_stages_what_nccl_cannot_run(world1, monkeypatch):
    """backend="auto" sent every call to NCCL once NCCL was usable, so bool/int16/uint16
    tensors, bitwise ops and coalesced CuPy arrays raised (NCCL has none of them) instead of
    staging, and an integer avg would have wrapped (NCCL sums in the type); a review."""
    _fake_gpu(monkeypatch, nccl=(True, "fake NCCL"))

    def no_nccl(self, device):
        raise AssertionError("NCCL used")

    monkeypatch.setattr(_gpu_route.CudaState, "communicator", no_nccl)
    for dt, op in (("bool", "sum"), ("int16", "max"), ("uint16", "sum"), ("int32", "band"),
                   ("uint8", "bxor"), ("int32", "avg"), ("int64", "avg")):
        rr.allreduce(NpCuda(np.ones(4, dt)), op=op)  # staged: no NCCL communicator asked for
        rr.reduce_scatter(NpCuda(np.ones(4, dt)), NpCuda(np.zeros(4, dt)), op=op)
    rr.broadcast(NpCuda(np.ones(4, np.bool_)), src=0)
    rr.allgather(NpCuda(np.ones(4, np.int16)), NpCuda(np.zeros((1, 4), np.int16)))
    rr.allreduce_coalesced([NpCuda(np.ones(4, np.float32))])  # not torch tensors
    class CupyLike(NpCuda):  # iterable, as CuPy's arrays are: list() made rows of it
        def __iter__(self):
            return iter(self.a)

    with pytest.raises(TypeError, match="takes a list"):  # one CUDA array is not a list
        rr.allreduce_coalesced(CupyLike(np.ones(4, np.float32)))
    assert gpu.select_backend(NpCuda(np.ones(4, np.int16))) == "staged"  # as the calls do
    with pytest.raises(AssertionError, match="NCCL used"):  # what NCCL can run goes there
        rr.allreduce(NpCuda(np.ones(4, np.float32)), op="avg")
    with pytest.raises(ValueError, match="op=band is bitwise"):  # one rank checks too
        rr.allreduce(NpCuda(np.ones(4, np.float32)), op="band")
    assert _gpu_route.nccl_cannot("float16", rr._buffers.OP_CODES["avg"]) is None
    assert "wraps" in _gpu_route.nccl_cannot("int8", rr._buffers.OP_CODES["avg"])


def test_agree_needs_every_rank_and_distinct_devices():
    hosts = ["a", "a", "b"]
    assert _gpu_route.agree([(True, 0, ""), (True, 1, ""), (True, 0, "")], hosts)[0]
    ok, why = _gpu_route.agree([(True, 0, ""), (False, 1, "no NCCL"), (True, 0, "")], hosts)
    assert not ok and why == "rank 1: no NCCL"
    ok, why = _gpu_route.agree([(True, 0, ""), (True, 0, ""), (True, 0, "")], hosts)
    assert not ok and "ranks 0 and 1 share cuda:0" in why


def test_select_backend_with_fakes(monkeypatch):
    monkeypatch.setattr(gpu_device, "nccl_available", lambda: (True, "NCCL 2.x"))
    monkeypatch.setattr(_gpu_staging, "stager_status", lambda t: (True, ""))
    x = NpCuda(np.zeros(4, np.float32))
    assert gpu.select_backend(x) == "nccl"
    assert gpu.select_backend(x, "staged") == "staged"
    assert gpu.select_backend(FakeCudaTensor.of(torch.zeros(3)), "host") == "staged"
    assert gpu.select_backend(np.zeros(3), "staged") == "cpu"
    monkeypatch.setattr(gpu_device, "nccl_available", lambda: (False, "no libnccl"))
    assert gpu.select_backend(x) == "staged"
    with pytest.raises(gpu.NcclUnavailable, match="no libnccl"):
        gpu.select_backend(x, "nccl")
    with pytest.raises(ValueError, match="host memory only"):
        gpu.select_backend(x, "tcp")
    # Host arrays: a host path name comes back, an unknown name is refused (was returned).
    assert gpu.select_backend(np.zeros(3), "tcp") == "tcp"
    with pytest.raises(ValueError, match="unknown backend 'gloo'"):
        gpu.select_backend(np.zeros(3), "gloo")
    with pytest.raises(ValueError, match="meta device and has no memory"):
        gpu.select_backend(torch.empty(3, device="meta"), "nccl")


def test_nccl_verdict_names_the_missing_device_first(monkeypatch):
    # A CUDA build on a machine without a driver or NCCL: the device is the blocker to name
    # (was "NCCL not found", then, once NCCL was installed, the missing driver).
    monkeypatch.setattr(gpu_device, "built_with_cuda", lambda: True)
    monkeypatch.setattr(gpu_device, "cuda_status", lambda: (False, "no NVIDIA driver"))

    def no_nccl(environ=None):
        raise gpu.NcclUnavailable("NCCL not found")
    monkeypatch.setattr(gpu_device, "load_nccl", no_nccl)
    assert gpu_device.nccl_available() == (False, "no NVIDIA driver")


def test_gpu_work_wait_with_a_timeout():
    from ringreduce.gpu.nccl import GpuWork

    class CWork:
        def wait(self, timeout):
            return timeout == 1.5

    assert GpuWork(CWork(), ()).wait(1.5) is True  # was ModuleNotFoundError
    with pytest.raises(ValueError):
        GpuWork(CWork(), ()).wait(-1)


def test_no_device_errors_are_clear(world1):
    """Without fakes: CUDA-looking inputs on this machine get the real verdict."""
    if _CUDA_OK:
        pytest.skip("a CUDA device is present: the no-device errors cannot show")
    x = NpCuda(np.ones(4, np.float32))
    with pytest.raises(gpu.CudaUnavailable, match="cannot be staged through host memory"):
        rr.allreduce(x)
    with pytest.raises((gpu.NcclUnavailable, gpu.CudaUnavailable)):
        rr.allreduce(x, backend="nccl")
    t = FakeCudaTensor.of(torch.ones(4))
    with pytest.raises(gpu.CudaUnavailable, match="torch sees no CUDA device"):
        rr.allreduce(t, backend="staged")
    assert np.all(x.a == 1)  # nothing moved


# ---------------------------------------------------------------------------------------
# Argument checks before any byte moves
# ---------------------------------------------------------------------------------------


def test_cuda_argument_checks_raise_before_data_moves(world1, monkeypatch):
    st = _fake_gpu(monkeypatch)
    a = NpCuda(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="different devices.*cuda:0, cuda:1"):
        rr.allgather(a, NpCuda(np.zeros(8, np.float32), device=1))
    with pytest.raises(ValueError, match="one dtype"):
        rr.allgather(a, NpCuda(np.zeros(8, np.float64)))
    with pytest.raises(ValueError, match="host memory but the other buffers"):
        rr.allgather(a, np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="host memory but the other buffers"):
        rr.allreduce_coalesced([FakeCudaTensor.of(torch.ones(2)), torch.ones(2)])
    with pytest.raises(ValueError, match="not C-contiguous"):
        rr.allreduce(NpCuda(np.ones((4, 4), np.float32)[:, ::2]))
    with pytest.raises(ValueError, match="typestr '<c8' is not supported"):
        rr.allreduce(NpCuda(np.ones(4, np.complex64)))
    with pytest.raises(ValueError, match="not contiguous"):
        rr.broadcast(FakeCudaTensor.of(torch.ones(4, 4).t()))
    with pytest.raises(ValueError, match="dtype torch.complex64 is not supported"):
        rr.broadcast(FakeCudaTensor.of(torch.ones(4, dtype=torch.complex64)))
    with pytest.raises(ValueError, match="different devices"):
        rr.allreduce_coalesced([FakeCudaTensor.of(torch.ones(2), 0),
                                FakeCudaTensor.of(torch.ones(2), 1)])
    with pytest.raises(ValueError, match="mixes torch CUDA tensors"):
        rr.allreduce_coalesced([FakeCudaTensor.of(torch.ones(2)), NpCuda(np.ones(2, np.float32))])
    with pytest.raises(ValueError, match="out must hold 8 elements"):
        rr.allgather(a, NpCuda(np.zeros(5, np.float32)))
    with pytest.raises(ValueError, match="pass out="):
        rr.allgather(a)
    with pytest.raises(ValueError, match="unknown backend"):
        rr.allreduce(a, backend="mpi")
    assert st.log == []


def test_host_arrays_with_backends(world1):
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="backend='nccl' needs CUDA tensors"):
        rr.allreduce(x, backend="nccl")
    with pytest.raises(ValueError, match="meta device and has no memory"):
        rr.allreduce(torch.ones(4, device="meta"), backend="nccl")
    rr.allreduce(x, backend="staged")  # host arrays: the CPU path whatever the backend
    rr.allreduce(torch.ones(3), backend="host")
    assert rr.allgather(x, backend="staged").shape == (1, 4)


# ---------------------------------------------------------------------------------------
# The staged path on fakes
# ---------------------------------------------------------------------------------------


def test_staged_world1_copies_and_pool(world1, monkeypatch):
    st = _fake_gpu(monkeypatch)
    a = NpCuda(np.arange(6, dtype=np.float32), stream=7)
    out = NpCuda(np.zeros((1, 6), np.float32), stream=7)
    assert rr.allgather(a, out) is out
    assert np.array_equal(out.a[0], a.a)
    assert [e[0] for e in st.log] == ["alloc", "to_host", "sync", "to_device", "sync"]
    assert st.log[2] == ("sync", "s7")
    st.log.clear()
    w = rr.reduce_scatter(a, NpCuda(np.zeros(6, np.float32)), async_op=True)
    assert w.wait() and w.result().a.tolist() == a.a.tolist()
    assert "alloc" not in [e[0] for e in st.log]  # the pinned buffer was reused
    rr.allreduce(a)  # world 1: nothing to move
    rr.allreduce_coalesced([a, a])


def _ranks_staged(rank: int, world: int) -> dict:
    """Runs in each rank: every collective through the staged path on fake CUDA buffers."""
    import numpy as np
    import test_gpu_route as T

    mp = pytest.MonkeyPatch()
    st = T._fake_gpu(mp)
    x = T.NpCuda(np.arange(8, dtype=np.float32) + rank)
    rr.allreduce(x, op="sum")
    t = T.FakeCudaTensor.of(torch.full((4,), float(rank + 1)))
    w = rr.allreduce(t, op="max", async_op=True)
    before = t.tolist()
    w.wait()
    b = T.NpCuda(np.full(3, rank, np.int64))
    rr.broadcast(b, src=world - 1)
    g = rr.allgather(T.NpCuda(np.full(2, rank, np.int32)), T.NpCuda(np.zeros((world, 2), np.int32)))
    rs = rr.reduce_scatter(T.FakeCudaTensor.of(torch.arange(2 * world, dtype=torch.float64)),
                           T.FakeCudaTensor.of(torch.zeros(2, dtype=torch.float64)))
    xs = [T.FakeCudaTensor.of(torch.full((2,), float(rank))),
          T.FakeCudaTensor.of(torch.full((3,), float(2 * rank)))]
    wc = rr.allreduce_coalesced(xs, op="sum", async_op=True)
    wc.wait()
    # dtypes the GPU tables lacked (CuPy's |b1, <i2, <u8: "typestr not supported")
    i16 = T.NpCuda(np.array([rank + 1, -rank], np.int16))
    rr.allreduce(i16, op="max")
    u64 = T.NpCuda(np.full(2, 2**63 + rank, np.uint64))
    rr.allreduce(u64, op="bxor")
    flags = T.NpCuda(np.array([rank == 0, True]))
    rr.allreduce(flags, op="min")  # and
    verdict = _gpu_route.state(rr._state._DEFAULT[0]).verdict
    mp.undo()
    return {"x": x.a.tolist(), "t": torch.Tensor.as_subclass(t, torch.Tensor).tolist(),
            "before": before, "b": b.a.tolist(), "g": g.a.tolist(),
            "rs": torch.Tensor.as_subclass(rs, torch.Tensor).tolist(),
            "xs": [torch.Tensor.as_subclass(v, torch.Tensor).tolist() for v in xs],
            "verdict": list(verdict), "syncs": sum(e[0] == "sync" for e in st.log),
            "i16": i16.a.tolist(), "u64": [int(v) for v in u64.a], "flags": flags.a.tolist()}


@pytest.mark.parametrize("world", [2, 3])
def test_staged_collectives_across_ranks(world):
    res = run_world(world, _ranks_staged, timeout=90)
    s = world * (world - 1) / 2
    for r, out in enumerate(res):
        assert out["x"] == [world * i + s for i in range(8)]
        assert out["t"] == [float(world)] * 4
        assert out["before"] == [float(r + 1)] * 4  # the copy back waits for wait()
        assert out["b"] == [world - 1] * 3
        assert out["g"] == [[q, q] for q in range(world)]
        assert out["rs"] == [world * (2 * r), world * (2 * r + 1)]
        assert out["xs"] == [[s] * 2, [2 * s] * 3]
        assert out["i16"] == [world, 0]
        want = 0
        for q in range(world):
            want ^= 2**63 + q
        assert out["u64"] == [want] * 2 and out["flags"] == [world == 1, True]
        assert out["verdict"][0] is False and out["verdict"][1].startswith("rank 0: no NCCL")
        assert out["syncs"] > 0


# ---------------------------------------------------------------------------------------
# On real devices (skipped here)
# ---------------------------------------------------------------------------------------


def _ranks_real(rank: int, world: int, backend: str) -> dict:
    import torch

    ngpu = torch.cuda.device_count()
    dev = rank % ngpu
    torch.cuda.set_device(dev)
    x = torch.arange(1000, dtype=torch.float32, device=dev) + rank
    rr.allreduce(x, backend=backend)
    out = rr.allgather(torch.full((5,), float(rank), device=dev), backend=backend)
    y = torch.full((7,), float(rank), device=dev, dtype=torch.bfloat16)
    w = rr.allreduce(y, op="max", async_op=True, backend=backend)
    w.wait()
    torch.cuda.synchronize()
    return {"x": x.cpu().tolist(), "out": out.cpu().tolist(), "y": y.float().cpu().tolist()}


def _check_real(res, world):
    s = world * (world - 1) / 2
    ref = (np.arange(1000) * world + s).tolist()
    for out in res:
        assert out["x"] == ref
        assert out["out"] == [[float(r)] * 5 for r in range(world)]
        assert out["y"] == [float(world - 1)] * 7


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA_OK, reason=_CUDA_REASON)
def test_real_staged_two_ranks_one_gpu():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    _check_real(run_world(2, _ranks_real, "staged", timeout=120), 2)


@pytest.mark.gpu
@pytest.mark.timeout(400)  # two run_world calls of up to 180 s each
@pytest.mark.skipif(not _CUDA_OK, reason=_CUDA_REASON)
def test_real_nccl_two_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs one device per rank: fewer than 2 GPUs visible")
    ok, why = gpu.nccl_available()
    if not ok:
        pytest.skip(why)
    _check_real(run_world(2, _ranks_real, "nccl", timeout=180), 2)
    _check_real(run_world(2, _ranks_real, "auto", timeout=180), 2)


def test_a_failed_tracked_work_does_not_fail_the_next_call(world1):
    """A tracked Work whose is_completed() raises (an NCCL Work of a failed or destroyed
    communicator) made the unrelated async call that pruned the registry raise."""
    from ringreduce import _work

    class Failed:
        def is_completed(self):
            raise rr.RingReduceError("NCCL communicator was destroyed; create a new one")

    class Running:
        def is_completed(self):
            return False

    saved = _work._PRUNE_AT
    _work._PRUNE_AT = _work._PRUNE_MIN  # an earlier test may have raised it
    failed = [Failed() for _ in range(_work._PRUNE_MIN)]
    running = Running()
    try:
        for f in failed:
            _work._track(f, ())
        _work._track(running, ())  # what an async call does: prunes here, must not raise
        assert not any(isinstance(e[0], Failed) for e in _work._INFLIGHT)
    finally:
        for w in [*failed, running]:
            _work._untrack(w)
        _work._PRUNE_AT = saved
