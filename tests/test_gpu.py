"""GPU path: what can be checked without a GPU runs everywhere; the rest is marked ``gpu``
and skipped (with the reason) when no CUDA device is visible.

Runs here: the kernel dispatch table, the staging planner (exhaustively), the device-side
float16/bfloat16 conversions (compiled for the host and compared with reduce/half.h), the
CUDA adapters' argument checks (fake ``__cuda_array_interface__`` / DLPack objects, torch
meta tensors), the NCCL loader's errors and a real load of the nvidia-nccl wheel when it is
installed, the "no CUDA device" errors, and an nvcc compile of the .cu files when nvcc is
present. RINGREDUCE_TEST_CUDA_BUILD=1 adds a full CUDA build of the extension in a scratch
copy plus a 2-rank CPU all-reduce with it (minutes).
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import numpy as np
import pytest
from gpu_common import (  # noqa: F401
    _CUDA_OK,
    _CUDA_REASON,
    _HAS_MODULE,
    _NVCC,
    CSRC,
    DTYPES,
    OPS,
    ROOT,
    TAGS,
    _py,
    needs_gpu,
)

from ringreduce import _C, gpu
from ringreduce.gpu import arrays as gpu_arrays

# ---------------------------------------------------------------------------------------
# Dispatch table
# ---------------------------------------------------------------------------------------


def test_every_build_has_the_gpu_submodule():
    assert _HAS_MODULE, "ringreduce._C has no gpu submodule (module.cc must call registerGpu)"


def test_kernel_table_covers_every_dtype_and_op():
    table = gpu_arrays._gpu.kernel_table()
    got = {(k["dtype"], k["op"]): k for k in table}
    assert len(table) == len(got) == len(DTYPES) * len(OPS)
    for dt in DTYPES:
        half = dt in ("float16", "bfloat16")
        for op in OPS:
            k = got[(dt, op)]
            kernel_op = "sum" if op == "avg" else op
            tag = TAGS[dt]
            assert k["accumulate"] == ("float32" if half else dt)
            if half:
                assert k["reduce_kernel"] == f"accumulate_{tag}_{kernel_op}"
                assert k["finalize_kernel"] == f"narrow_{tag}"
                assert k["widen_kernel"] == f"widen_{tag}"
            else:
                assert k["reduce_kernel"] == f"reduce_{tag}_{kernel_op}"
                assert k["finalize_kernel"] == (f"divide_{tag}" if op == "avg" else "")
                assert k["widen_kernel"] == ""
            assert k["compiled"] == gpu.built_with_cuda()
    # Ordered by dtype code, then op code (the codes of ringreduce/_buffers.py).
    from ringreduce._buffers import DTYPE_CODES, OP_CODES

    keys = [(DTYPE_CODES[k["dtype"]], OP_CODES[k["op"]]) for k in table]
    assert keys == sorted(keys)


def test_kernel_table_matches_kernel_list_header():
    text = (CSRC / "cuda" / "kernel_list.h").read_text()
    direct = re.findall(r"X\((\w+), k\w+, \w+, (\w+), k\w+\)", text)
    halves = re.findall(r"X\((\w+), k\w+, (\w+), k\w+\)", text)
    names = {k["reduce_kernel"] for k in gpu_arrays._gpu.kernel_table()}
    assert {f"reduce_{t}_{o}" for t, o in direct} | {f"accumulate_{t}_{o}" for t, o in halves} \
        == names


def test_cuda_reduce_argument_checks_come_first():
    g = gpu_arrays._gpu
    codes = {n: i for i, n in enumerate(DTYPES)}
    with pytest.raises(ValueError, match="reduced in float32"):
        g.cuda_reduce(codes["float16"], 0, 0x1000, 0x2000, 4, 0)
    with pytest.raises(ValueError, match="not a 16-bit float"):
        g.cuda_accumulate(codes["float32"], 0, 0x1000, 0x2000, 4, 0)
    with pytest.raises(ValueError, match="unknown dtype code"):
        g.cuda_reduce(99, 0, 0x1000, 0x2000, 4, 0)
    with pytest.raises(ValueError, match="unknown reduce op code"):
        g.cuda_reduce(0, 17, 0x1000, 0x2000, 4, 0)
    with pytest.raises(ValueError, match="null device buffer"):
        g.cuda_reduce(0, 0, 0, 0x2000, 4, 0)
    with pytest.raises(ValueError, match="world size"):
        g.cuda_finalize(0, 1, 0, 0x1000, 0x2000, 4, 0)
    with pytest.raises(ValueError, match="separate from the output"):
        g.cuda_finalize(codes["bfloat16"], 0, 2, 0x1000, 0x1000, 4, 0)


@pytest.mark.skipif(_CUDA_OK, reason="a CUDA device is present: the no-device error cannot show")
def test_cuda_kernels_without_device_raise_cuda_unavailable():
    # Valid arguments, no device: "no CUDA device" (CUDA build) or "built without CUDA".
    with pytest.raises(gpu.CudaUnavailable, match="CUDA"):
        gpu_arrays._gpu.cuda_reduce(0, 0, 0x1000, 0x2000, 4, 0)
    # Zero elements launch nothing, so they succeed even here.
    gpu_arrays._gpu.cuda_reduce(0, 0, 0, 0, 0, 0)


# ---------------------------------------------------------------------------------------
# Staging planner
# ---------------------------------------------------------------------------------------

COUNTS = [0, 1, 2, 3, 7, 8, 15, 16, 17, 63, 64, 65, 255, 256, 1000, 1023, 1025, 4097]
ELEM_SIZES = [1, 2, 4, 8]
STAGING = [8, 63, 64, 100, 256, 1000, 4096]


def _check_plan(p: dict, count: int, elem: int, staging: int, k: int, direction: str) -> None:
    slot, slot_elems = p["slot_bytes"], p["slot_elems"]
    assert slot > 0 and slot % elem == 0 and slot_elems * elem == slot
    assert slot * k <= staging
    if slot >= 64:
        assert slot % 64 == 0
    chunks = p["chunks"]
    n = len(chunks)
    assert n == -(-count // slot_elems)
    assert p["staging_bytes_used"] == slot * min(n, k)
    off = 0
    for i, (o, c, bo, b, s, so) in enumerate(chunks):
        assert o == off and 0 < c <= slot_elems
        assert (bo, b) == (o * elem, c * elem)
        assert s == i % k and so == s * slot
        if i < n - 1:
            assert c == slot_elems
        off += c
    assert off == count

    # Replay the steps: every chunk starts its copy, waits for it and transfers exactly once,
    # in the right order; a slot is never reused while its previous chunk still needs it;
    # at most k copies are in flight.
    steps = p["steps"]
    assert len(steps) == 3 * n
    seen = {kind: [] for kind in ("copy_start", "copy_wait", "transfer")}
    busy = {}  # slot -> chunk holding it
    in_flight = set()
    pos = {}
    for idx, (kind, c) in enumerate(steps):
        pos[(kind, c)] = idx
        seen[kind].append(c)
        slot_of = c % k
        if direction == "device_to_wire":
            if kind == "copy_start":
                assert slot_of not in busy, f"slot {slot_of} overwritten by chunk {c}"
                busy[slot_of] = c
                in_flight.add(c)
            elif kind == "copy_wait":
                assert c in in_flight
                in_flight.discard(c)
            else:  # transfer: the slot is sent, then free
                assert ("copy_wait", c) in pos
                assert busy.pop(slot_of) == c
        else:
            if kind == "transfer":  # receive into the slot
                assert slot_of not in busy, f"slot {slot_of} overwritten by chunk {c}"
                busy[slot_of] = c
            elif kind == "copy_start":  # host -> device out of the slot
                assert ("transfer", c) in pos
                in_flight.add(c)
            else:  # the copy finished: the slot is free again
                assert c in in_flight
                in_flight.discard(c)
                assert busy.pop(slot_of) == c
        assert len(in_flight) <= k
    for kind, chunks_seen in seen.items():
        assert sorted(chunks_seen) == list(range(n)), kind
    assert not in_flight and not busy
    # Overlap: with two or more slots the copy of one chunk runs during its neighbour's
    # transfer.
    if k >= 2:
        for c in range(n - 1):
            if direction == "device_to_wire":
                assert pos[("copy_start", c + 1)] < pos[("transfer", c)]
            else:
                assert pos[("copy_start", c)] < pos[("transfer", c + 1)] < pos[("copy_wait", c)]


@pytest.mark.parametrize("direction", ["device_to_wire", "wire_to_device"])
def test_staging_plan_exhaustive(direction):
    for count in COUNTS:
        for elem in ELEM_SIZES:
            for staging in STAGING:
                for k in (1, 2, 3, 4):
                    if staging // k < elem:
                        with pytest.raises(ValueError, match="cannot hold one"):
                            gpu_arrays._gpu.plan_staging(count, elem, staging, k, direction)
                        continue
                    p = gpu_arrays._gpu.plan_staging(count, elem, staging, k, direction)
                    _check_plan(p, count, elem, staging, k, direction)


def test_staging_plan_examples_and_errors():
    p = gpu_arrays._gpu.plan_staging(10, 4, 16, 2, "device_to_wire")
    assert p["slot_bytes"] == 8 and p["slot_elems"] == 2
    assert [c[:2] for c in p["chunks"]] == [(0, 2), (2, 2), (4, 2), (6, 2), (8, 2)]
    assert p["steps"][:4] == [("copy_start", 0), ("copy_start", 1), ("copy_wait", 0),
                              ("transfer", 0)]
    assert p["steps"][4] == ("copy_start", 2)
    big = gpu_arrays._gpu.plan_staging(1 << 20, 4, 4 << 20, 2, "wire_to_device")
    assert big["slot_bytes"] == 2 << 20 and len(big["chunks"]) == 2
    assert gpu_arrays._gpu.plan_staging(0, 2, 64, 2, "wire_to_device")["steps"] == []
    with pytest.raises(ValueError, match="numBuffers"):
        gpu_arrays._gpu.plan_staging(10, 4, 64, 0, "device_to_wire")
    with pytest.raises(ValueError, match="numBuffers"):
        gpu_arrays._gpu.plan_staging(10, 4, 64, 17, "device_to_wire")
    with pytest.raises(ValueError, match="element size"):
        gpu_arrays._gpu.plan_staging(10, 0, 64, 2, "device_to_wire")
    with pytest.raises(ValueError, match="direction"):
        gpu_arrays._gpu.plan_staging(10, 4, 64, 2, "sideways")


# ---------------------------------------------------------------------------------------
# Availability and "no device" / "NCCL not found" errors
# ---------------------------------------------------------------------------------------


def test_cuda_status_is_a_reasoned_tuple():
    ok, reason = gpu.cuda_status()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason
    assert gpu.cuda_available() == ok
    info = gpu.cuda_build_info()
    assert set(info) == {"built_with_cuda", "archs", "runtime_version"}
    if info["built_with_cuda"]:
        assert info["archs"].startswith("sm_") and info["runtime_version"] > 0


@pytest.mark.skipif(_CUDA_OK, reason="a CUDA device is present: the no-device error cannot show")
def test_no_device_errors():
    assert "CUDA" in _CUDA_REASON
    with pytest.raises(gpu.CudaUnavailable) as e:
        gpu.require_cuda_device(0)
    msg = str(e.value)
    assert "no CUDA device" in msg or "built without CUDA" in msg
    assert isinstance(e.value, _C.RingReduceError)
    # The communicator checks the device before it needs NCCL at all.
    with pytest.raises(gpu.CudaUnavailable):
        gpu_arrays._gpu.NcclComm(b"\0" * 128, 0, 1, 0, 10.0)
    with pytest.raises(gpu.CudaUnavailable):
        gpu.NcclCommunicator(store={}, rank=0, world_size=1)
    ok, reason = gpu.nccl_available()
    assert not ok and reason


def test_nccl_candidates_order():
    assert gpu.nccl_candidates({"RINGREDUCE_NCCL_PATH": "/opt/x/libnccl.so.2"}) == [
        "/opt/x/libnccl.so.2"]
    default = gpu.nccl_candidates({})
    assert default[-1] == "libnccl.so.2"
    for d in default[:-1]:
        assert (Path(d) / "libnccl.so.2").is_file()


def test_nccl_not_found_error_names_what_was_tried(tmp_path):
    # A fresh process: NCCL, once loaded, stays loaded for the life of a process.
    not_elf = tmp_path / "libnccl.so.2"
    not_elf.write_text("not a library\n" * 400)
    for bogus, extra in [(str(tmp_path / "nowhere"), "nowhere"),
                         (str(tmp_path), "invalid ELF header"),
                         ("~/no-such-nccl.so", "no-such-nccl.so")]:
        r = _py("""
            import ringreduce.gpu as g
            try:
                g.load_nccl()
            except g.NcclUnavailable as e:
                print(e)
            else:
                print("LOADED")
        """, env={"RINGREDUCE_NCCL_PATH": bogus})
        assert r.returncode == 0, r.stderr
        out = r.stdout
        tried = (f"libnccl.so.2 in {bogus}" if Path(bogus).is_dir()
                 else os.path.expanduser(bogus))  # a file: its path, ~ expanded
        assert "NCCL not found: tried " + tried + "\n" in out, out
        assert extra in out
        assert "pip install nvidia-nccl-cu12" in out and "RINGREDUCE_NCCL_PATH" in out


def test_nccl_loads_from_wheel_when_installed():
    if gpu.nccl_candidates({}) == ["libnccl.so.2"] and not _system_nccl():
        pytest.skip("no nvidia-nccl wheel or system libnccl.so.2 installed")
    r = _py("""
        import ringreduce.gpu as g
        from ringreduce.gpu import arrays
        info = g.load_nccl()
        assert info == g.load_nccl()          # loaded once, cached
        print(info["version_code"], info["version"], info["nonblocking_init"])
        uid = arrays._gpu.nccl_unique_id()       # needs no GPU: bootstrap address only
        print(len(uid))
    """, env={"RINGREDUCE_NCCL_PATH": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.split("\n")
    code, version, _nonblocking = lines[0].split()
    assert int(code) >= 21000 and version.startswith("2.")
    assert gpu_arrays._gpu.nccl_version_string(int(code)) == version
    assert lines[1] == "128"


def _system_nccl() -> bool:
    try:
        ctypes.CDLL("libnccl.so.2")
    except OSError:
        return False
    return True


def test_nccl_version_strings():
    assert gpu_arrays._gpu.nccl_version_string(22303) == "2.23.3"
    assert gpu_arrays._gpu.nccl_version_string(21005) == "2.10.5"
    assert gpu_arrays._gpu.nccl_version_string(2804) == "2.8.4"


def test_exchange_unique_id_through_a_store():
    store: dict = {}

    class Store:
        def set(self, k, v):
            store[k] = v

        def get(self, k):
            return store[k]

    uid = bytes(range(128))
    assert gpu.exchange_unique_id(Store(), 0, "k", make_id=lambda: uid) == uid
    assert gpu.exchange_unique_id(Store(), 1, "k") == uid
    store["short"] = b"abc"
    with pytest.raises(ValueError, match="3 bytes"):
        gpu.exchange_unique_id(Store(), 2, "short")


# ---------------------------------------------------------------------------------------
# CUDA array adapters
# ---------------------------------------------------------------------------------------


class FakeCAI:
    """An object with __cuda_array_interface__ (what CuPy/Numba arrays expose)."""

    def __init__(self, shape=(4, 3), typestr="<f4", ptr=0x7F0000001000, readonly=False,
                 strides=None, version=3, stream=None, mask=None, device=None, **extra):
        self.__cuda_array_interface__ = dict(
            shape=shape, typestr=typestr, data=(ptr, readonly), version=version,
            strides=strides, **extra)
        if version >= 3:
            self.__cuda_array_interface__["stream"] = stream
        if mask is not None:
            self.__cuda_array_interface__["mask"] = mask
        if device is not None:
            self.device = type("Dev", (), {"id": device})()


def test_is_cuda_array():
    torch = pytest.importorskip("torch")
    assert gpu.is_cuda_array(FakeCAI())
    assert not gpu.is_cuda_array(np.zeros(3))
    assert not gpu.is_cuda_array(torch.zeros(3))
    assert not gpu.is_cuda_array(torch.zeros(3, device="meta"))
    assert not gpu.is_cuda_array(3)
    assert gpu.is_cuda_array(FakeDLPack(device=(2, 0)))
    assert gpu.is_cuda_array(FakeDLPack(device=(13, 0)))
    assert not gpu.is_cuda_array(FakeDLPack(device=(1, 0)))

    class Broken:
        def __dlpack_device__(self):
            raise RuntimeError("boom")

    assert not gpu.is_cuda_array(Broken())


def test_cai_parsing():
    b = gpu.as_cuda_buffer(FakeCAI(stream=7, device=1))
    assert (b.ptr, b.count, b.dtype, b.shape, b.device, b.stream) == (
        0x7F0000001000, 12, "float32", (4, 3), 1, 7)
    assert b.code == 0 and b.nbytes == 48
    for typestr, name in [("<f8", "float64"), ("<f2", "float16"), ("|i1", "int8"),
                          ("|u1", "uint8"), ("<i4", "int32"), ("<i8", "int64")]:
        assert gpu.as_cuda_buffer(FakeCAI(typestr=typestr)).dtype == name
    # Explicit C-contiguous strides, and any stride on a size-1 dimension, are fine.
    assert gpu.as_cuda_buffer(FakeCAI(strides=(12, 4))).count == 12
    assert gpu.as_cuda_buffer(FakeCAI(shape=(1, 3), strides=(999, 4))).count == 3
    # v2 has no stream: the caller's current stream (0 without torch CUDA / CuPy).
    assert gpu.as_cuda_buffer(FakeCAI(version=2)).stream == gpu.current_stream()
    # Legacy / per-thread default stream handles pass through.
    assert gpu.as_cuda_buffer(FakeCAI(stream=1)).stream == 1
    assert gpu.as_cuda_buffer(FakeCAI(), stream=42).stream == 42
    # Empty arrays may have a null pointer.
    assert gpu.as_cuda_buffer(FakeCAI(shape=(0,), ptr=0)).count == 0
    # Read-only is fine for inputs.
    assert gpu.as_cuda_buffer(FakeCAI(readonly=True), writable=False).count == 12


@pytest.mark.parametrize("kwargs, match", [
    ({"strides": (4, 16)}, "not C-contiguous"),
    ({"readonly": True}, "read-only"),
    ({"mask": object()}, "masked"),
    ({"version": 1}, "too old"),
    ({"typestr": "<c8"}, "typestr '<c8' is not supported"),
    ({"typestr": ">f4"}, "big-endian"),
    ({"stream": 0}, "stream 0 is invalid"),
    ({"ptr": 0}, "null data pointer"),
    ({"shape": (-1,)}, "negative dimension"),
])
def test_cai_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gpu.as_cuda_buffer(FakeCAI(**kwargs), "grad")


def test_cai_missing_key_and_wrong_types():
    x = FakeCAI()
    del x.__cuda_array_interface__["typestr"]
    with pytest.raises(ValueError, match="lacks the required key 'typestr'"):
        gpu.as_cuda_buffer(x)
    with pytest.raises(ValueError, match="host memory.*CPU path"):
        gpu.as_cuda_buffer(np.zeros(3))
    with pytest.raises(TypeError, match="expected a torch CUDA tensor"):
        gpu.as_cuda_buffer([1, 2])


def test_torch_host_and_meta_tensors_are_rejected_with_advice():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="not a CUDA device.*CPU path"):
        gpu.as_cuda_buffer(torch.zeros(3), "tensor")
    with pytest.raises(ValueError, match="meta device.*to_empty"):
        gpu.as_cuda_buffer(torch.zeros(3, device="meta"), "tensor")


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", gpu_arrays._DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class FakeDLPack:
    """A DLPack producer whose capsule describes (fake) device memory."""

    def __init__(self, device=(2, 0), shape=(2, 5), code=2, bits=32, lanes=1, strides=None,
                 ptr=0x7F0000002000, byte_offset=0):
        self.device = device
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        self._m = _DLManaged()
        t = self._m.dl_tensor
        t.data = ptr
        t.device.device_type, t.device.device_id = device
        t.ndim = len(shape)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        if self._strides is not None:
            t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = byte_offset
        self.requested_stream = "unset"

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.requested_stream = stream
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._m), b"dltensor", None)


def test_dlpack_parsing():
    x = FakeDLPack(device=(2, 3), code=4, bits=16, byte_offset=64)
    b = gpu.as_cuda_buffer(x, stream=5)
    assert (b.ptr, b.count, b.dtype, b.shape, b.device, b.stream) == (
        0x7F0000002000 + 64, 10, "bfloat16", (2, 5), 3, 5)
    assert x.requested_stream == 5
    # Our stream 0 (legacy default) is requested as 1: DLPack forbids 0.
    gpu.as_cuda_buffer(x, stream=0)
    assert x.requested_stream == 1
    assert gpu.as_cuda_buffer(FakeDLPack(strides=(5, 1))).count == 10
    assert gpu.as_cuda_buffer(FakeDLPack(code=0, bits=64)).dtype == "int64"


@pytest.mark.parametrize("kwargs, match", [
    ({"strides": (1, 2)}, "not C-contiguous"),
    ({"lanes": 4}, "lanes=4"),
    ({"code": 5, "bits": 64}, "not supported"),
    ({"device": (1, 0)}, "not a CUDA device"),
])
def test_dlpack_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gpu.as_cuda_buffer(FakeDLPack(**kwargs))


def test_select_backend():
    assert gpu.select_backend(np.zeros(3)) == "cpu"
    assert gpu.select_backend(np.zeros(3), "tcp") == "tcp"
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        gpu.select_backend(np.zeros(3), "nccl")
    with pytest.raises(ValueError, match="host memory only"):
        gpu.select_backend(FakeCAI(), "tcp")
    ok, _ = gpu.nccl_available() if _HAS_MODULE else (False, "")
    if not ok:
        with pytest.raises(gpu.NcclUnavailable, match="backend='nccl' cannot be used"):
            gpu.select_backend(FakeCAI(), "nccl")
    if not _CUDA_OK:  # neither NCCL nor staging: one error naming both reasons
        with pytest.raises(gpu.CudaUnavailable, match="cannot be staged.*NCCL is not usable"):
            gpu.select_backend(FakeCAI())


# ---------------------------------------------------------------------------------------
# On a GPU (skipped here without one)
# ---------------------------------------------------------------------------------------

_CODES = {n: i for i, n in enumerate(DTYPES)}
_OP_CODES = {n: i for i, n in enumerate(OPS)}


def _torch_dtype(torch, name):
    return getattr(torch, name)


def _expected(torch, a, b, op, world):
    """Reference: the CPU semantics, computed with torch on the host."""
    if a.dtype in (torch.float16, torch.bfloat16):
        fa, fb = a.float(), b.float()
    else:
        fa, fb = a, b
    if op in ("sum", "avg"):
        r = fa + fb
    elif op == "prod":
        r = fa * fb
    elif op == "min":
        r = torch.minimum(fa, fb)
    else:
        r = torch.maximum(fa, fb)
    if op == "avg":
        if r.dtype.is_floating_point:
            r = r / world
        else:
            r = torch.div(r, world, rounding_mode="trunc")
    return r.to(a.dtype)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_cuda_kernels_match_cpu_semantics(dtype, op):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA (CPU-only build): cannot allocate device tensors")
    for n in (1, 3, 4, 1000, 4099):  # tails, exact packs, misaligned-free sizes
        _check_kernels(torch, dtype, op, n)


def _check_kernels(torch, dtype, op, n):
    g = gpu_arrays._gpu
    t = _torch_dtype(torch, dtype)
    gen = torch.Generator().manual_seed(n)
    if t.is_floating_point:
        a = (torch.rand(n, generator=gen) * 4 - 2).to(t)
        b = (torch.rand(n, generator=gen) * 4 - 2).to(t)
    else:
        lo, hi = (0, 16) if dtype == "uint8" else (-8, 8)
        a = torch.randint(lo, hi, (n,), generator=gen).to(t)
        b = torch.randint(lo, hi, (n,), generator=gen).to(t)
    want = _expected(torch, a, b, op, 2)
    da, db = a.cuda(), b.cuda()
    s = torch.cuda.current_stream().cuda_stream
    if dtype in ("float16", "bfloat16"):
        acc = torch.empty(n, dtype=torch.float32, device="cuda")
        g.cuda_widen(_CODES[dtype], da.data_ptr(), acc.data_ptr(), n, s)
        g.cuda_accumulate(_CODES[dtype], _OP_CODES[op], acc.data_ptr(), db.data_ptr(), n, s)
        out = torch.empty_like(da)
        g.cuda_finalize(_CODES[dtype], _OP_CODES[op], 2, acc.data_ptr(), out.data_ptr(), n, s)
    else:
        g.cuda_reduce(_CODES[dtype], _OP_CODES[op], da.data_ptr(), db.data_ptr(), n, s)
        out = torch.empty_like(da)
        g.cuda_finalize(_CODES[dtype], _OP_CODES[op], 2, da.data_ptr(), out.data_ptr(), n, s)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), want), (dtype, op, n)


@pytest.mark.gpu
@needs_gpu
def test_nccl_world_of_one():
    torch = pytest.importorskip("torch")
    ok, reason = gpu.nccl_available()
    if not ok or not torch.cuda.is_available():
        pytest.skip(reason if not ok else "torch has no CUDA")
    import torch.distributed as dist

    store = dist.HashStore()
    comm = gpu.NcclCommunicator(store, 0, 1, device=0, timeout=60)
    x = torch.arange(10, dtype=torch.float32, device="cuda:0")
    comm.allreduce(x, "sum")
    w = comm.allreduce(x, "avg", async_op=True)
    assert w.wait(30)
    assert torch.equal(x.cpu(), torch.arange(10, dtype=torch.float32))
    comm.broadcast(x, 0)
    out = torch.empty(10, device="cuda:0")
    comm.allgather(x, out)
    comm.reduce_scatter(x, out)
    comm.barrier(timeout=30)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.arange(10, dtype=torch.float32))
    with pytest.raises(ValueError, match="world_size"):
        comm.allgather(x, torch.empty(3, device="cuda:0"))
    comm.destroy()
