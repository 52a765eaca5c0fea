"""Turn torch tensors and numpy arrays into (pointer, element count, dtype code) for the core.

Only this module knows about array libraries; the C++ core sees raw host memory. Every
check happens here, before any byte moves, and each error says what to do instead.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _C

# name -> code of rr::DataType, rr::ReduceOp and rr::Algorithm, read from the core (one table).
DTYPE_CODES: dict[str, int] = dict(_C.DTYPE_CODES)
OP_CODES: dict[str, int] = dict(_C.OP_CODES)
OP_NAMES: dict[int, str] = {code: name for name, code in OP_CODES.items()}
ALGO_CODES: dict[str, int] = dict(_C.ALGO_CODES)
# Complex numbers move and add as pairs of their real type (what torch's view_as_real
# shows): every collective takes them; reductions only with sum and avg, as in torch.
_COMPLEX = {"complex32": "float16", "complex64": "float32", "complex128": "float64"}
_COMPLEX_OPS = (OP_CODES["sum"], OP_CODES["avg"])
_array_data = _C.array_data

_SUPPORTED = ", ".join(DTYPE_CODES)
# numpy dtype object -> code, for the fast path (numpy has no native bfloat16).
_NP_CODES = {np.dtype(k): v for k, v in DTYPE_CODES.items() if k != "bfloat16"}
_NP_NAMES = {np.dtype(k): k for k in DTYPE_CODES if k != "bfloat16"}  # dtype.name: ~2 us
_TORCH = [None]  # the torch module once imported (saves an import lookup per call)


class Buffer:
    """A validated view of a contiguous host buffer."""

    __slots__ = ("code", "complex", "count", "dtype", "obj", "ptr", "shape")

    def __init__(self, obj: Any, ptr: int, count: int, dtype: str, code: int, shape: tuple):
        self.obj = obj  # the tensor/array, kept alive while the collective runs
        self.ptr = ptr
        self.dtype = dtype
        self.code = code
        self.shape = shape
        # complex: count and code are those of the real pairs (2 per element)
        self.complex = dtype in _COMPLEX
        self.count = count * 2 if self.complex else count

    def units(self) -> int:
        """Elements as the caller counts them (complex numbers, not their halves)."""
        return self.count // 2 if self.complex else self.count


def overlap(b: Buffer, o: Buffer) -> int:
    """0 when the two buffers' bytes are apart, else the byte size of `o`."""
    def nbytes(v: Buffer) -> int:
        x = v.obj
        return v.units() * (x.element_size() if hasattr(x, "element_size") else x.itemsize)

    ob = nbytes(o)
    return ob if spans_overlap(b.ptr, nbytes(b), o.ptr, ob) else 0


def spans_overlap(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    """Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte."""
    return bool(a_bytes and b_bytes) and a < b + b_bytes and b < a + a_bytes


def copy_of(x: Any) -> Any:
    """A contiguous copy of a tensor or array."""
    return x.clone(memory_format=_torch().contiguous_format) if hasattr(x, "clone") \
        else np.array(x, order="C")


def check_reduction(b: Buffer, op: int) -> None:
    """ValueError, before anything moves, when `op` cannot reduce b's dtype."""
    if b.complex and op not in _COMPLEX_OPS:
        name = OP_NAMES[op]
        raise ValueError(f"{name} is not defined on complex numbers ({b.dtype}); complex "
                         f"tensors reduce with sum or avg (view_as_real for per-part ops)")
    _C.check_reduction(b.code, op)


def _torch():
    if _TORCH[0] is None:
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is optional for numpy users
            return None
        _TORCH[0] = torch
    return _TORCH[0]


def as_buffer(x: Any, what: str, writable: bool = True) -> Buffer:
    """Validate `x` for a collective and describe its memory.

    Raises TypeError/ValueError naming the argument and the fix.
    """
    if type(x) is np.ndarray:  # fast path: the checks below in their cheapest form
        flags = x.flags
        code = _NP_CODES.get(x.dtype)
        if flags.c_contiguous and (flags.writeable or not writable) and code is not None:
            return Buffer(x, _array_data(x), x.size, _NP_NAMES[x.dtype], code, x.shape)
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ValueError(
                f"{what}: tensor is on {x.device}; ringreduce moves host and CUDA memory "
                f"only: call .cpu() or .cuda() first"
            )
        name, code = check_torch_tensor(x, what, writable, complex_ok=True)
        return Buffer(x, x.data_ptr(), x.numel(), name, code, tuple(x.shape))
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError(
                f"{what}: array is not C-contiguous; pass np.ascontiguousarray(x) and copy back"
            )
        if writable and not x.flags.writeable:
            raise ValueError(f"{what}: array is read-only; the collective writes its result in place")
        name = str(x.dtype)
        return Buffer(x, _array_data(x), x.size, name, _code(name, x.dtype, what, True),
                      tuple(x.shape))
    raise TypeError(
        f"{what}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}"
    )


_TORCH_FAST: dict = {}  # torch dtype -> code, built on first use


def torch_tensor_type() -> Any:
    """torch.Tensor if torch is imported (by anyone: a caller's tensor means it is), else a
    type nothing is an instance of."""
    torch = _TORCH[0] or sys.modules.get("torch")
    return getattr(torch, "Tensor", _Never)


class _Never:
    pass


def torch_dtype_codes() -> dict:
    """{torch dtype: the core's dtype code} for every dtype both have."""
    if not _TORCH_FAST:
        torch = _torch()
        for name, code in DTYPE_CODES.items():
            if hasattr(torch, name):  # uint16/32/64 are newer than some torch builds
                _TORCH_FAST[getattr(torch, name)] = code
    return _TORCH_FAST


def torch_fast_code(x: Any) -> int | None:
    """Dtype code of a plain contiguous CPU tensor that needs no further checks, else None
    (the caller then takes the general path, which explains what is wrong)."""
    code = (_TORCH_FAST or torch_dtype_codes()).get(x.dtype)
    if (code is None or not x.is_cpu or x.requires_grad or x.layout is not _TORCH[0].strided
            or not x.is_contiguous() or x.is_conj() or x.is_neg() or x.is_nested):
        return None
    return code


def _code(name: str, dtype: Any, what: str, complex_ok: bool) -> int:
    """The core's code of dtype `name` (a complex dtype's real one, where complex_ok), or a
    ValueError listing what is supported."""
    code = DTYPE_CODES.get(_COMPLEX.get(name, name) if complex_ok else name)
    if code is None:
        swapped = getattr(dtype, "byteorder", "=") == ">" and np.little_endian
        raise ValueError(f"{what}: dtype {dtype} is not supported; use one of {_SUPPORTED}"
                         + (", complex32 (torch's), complex64, complex128" if complex_ok else "")
                         + ("; this array is big-endian: pass x.astype(x.dtype.newbyteorder("
                            "'=')) and copy the result back" if swapped else ""))
    return code


def check_torch_tensor(x: Any, what: str, writable: bool, complex_ok: bool = False) -> tuple:
    """Device-independent checks of a torch tensor (layout, contiguity, dtype, autograd);
    returns (dtype name, dtype code: a complex dtype's real one where complex_ok). Shared by
    the host and the CUDA adapters."""
    torch = _torch()
    if x.is_nested:  # strided ones report torch.strided, yet their storage is not x's shape
        raise ValueError(f"{what}: nested tensors are not supported; pass each component "
                         "(x.unbind()) or a padded tensor (x.to_padded_tensor(0))")
    if x.is_sparse or x.layout != torch.strided:
        raise ValueError(f"{what}: tensors of layout {str(x.layout).replace('torch.', '')} "
                         "are not supported; pass a dense one (x.to_dense())")
    if not x.is_contiguous():
        raise ValueError(
            f"{what}: tensor is not contiguous (strides {tuple(x.stride())}); "
            f"pass x.contiguous() and copy the result back, or use a contiguous buffer"
        )
    _refuse_lazy_view(x, what)
    name = str(x.dtype).replace("torch.", "")
    code = _code(name, x.dtype, what, complex_ok)
    if writable and x.requires_grad and x.is_leaf and torch.is_grad_enabled():
        raise ValueError(
            f"{what}: in-place collective on a leaf tensor that requires grad; "
            f"pass x.detach() or x.data (as for parameters), or wrap in torch.no_grad()"
        )
    if writable and x.requires_grad:
        # Written in place as torch's in-place ops write: a backward through its old value
        # (autograd saved it) is refused, not computed from the new one (gradients were
        # silently wrong; found by a helper). Tensors without grad are not tracked, as
        # torch.distributed's own collectives track none. (The public function: torch's
        # _C one took a tuple only from 2.5.)
        torch.autograd.graph.increment_version(x)
    return name, code


def _refuse_lazy_view(x: Any, what: str) -> None:
    if x.is_conj() or x.is_neg():
        # Lazy views (x.conj(), and the negated imaginary part x.conj().imag): memory holds
        # the values before conjugation / negation, which is what the core would move.
        fix = "x.resolve_conj()" if x.is_conj() else "x.resolve_neg()"
        raise ValueError(
            f"{what}: tensor is a lazy {'conjugate' if x.is_conj() else 'negative'} view "
            f"(its memory holds the values before {'conj()' if x.is_conj() else 'negation'}); "
            f"pass {fix} and copy the result back"
        )


def check_torch_values(x: Any, what: str, op: str | None = None) -> None:
    """What as_buffer and check_reduction would refuse of a torch tensor's values -- a lazy
    conj()/negative view, a dtype the core lacks, `op` (a name) on that dtype -- on a tensor
    of any strides: a coalesced call checks every piece before it issues the first."""
    _refuse_lazy_view(x, what)
    name = str(x.dtype).replace("torch.", "")
    b = Buffer(x, 0, 0, name, _code(name, x.dtype, what, True), ())
    if op is not None:
        check_reduction(b, OP_CODES[op])


_TORCH_OP_ALIASES = {"average": "avg", "product": "prod"}  # torch's names, lowercased, else ours


def op_name(name: str) -> str | None:
    """Our name of reduce op `name` -- ours, or torch's ReduceOp name in any case (SUM,
    PRODUCT, ...) -- or None when the core has no such op."""
    name = name.lower()
    name = _TORCH_OP_ALIASES.get(name, name)
    return name if name in OP_CODES else None


_OP_PREFIXES = ("reduceop.", "redoptype.")  # str() of torch's ReduceOp members, lowercased


def op_code(op: Any) -> int:
    """Accept "sum"/"avg"/... (any case, torch's names too, "ReduceOp.SUM"), or
    torch.distributed.ReduceOp: its members, or a ReduceOp(ReduceOp.MIN) instance (which
    wraps its member in .op; gloo takes both)."""
    code = OP_CODES.get(op) if type(op) is str else None
    if code is not None:
        return code
    if not isinstance(op, str) and not hasattr(op, "name") and hasattr(op, "op"):
        op = op.op
    text = op if isinstance(op, str) else getattr(op, "name", None)
    if isinstance(text, str) and text.lower().startswith(_OP_PREFIXES):
        text = text.split(".", 1)[1]
    name = op_name(text) if isinstance(text, str) else None
    if name is None:
        raise ValueError(f"unsupported reduce op {op!r}; use one of {', '.join(OP_CODES)}")
    return OP_CODES[name]


def algo_code(algo: str) -> int:
    code = ALGO_CODES.get(algo) if type(algo) is str else None
    if code is None:
        code = ALGO_CODES.get(str(algo).lower())
    if code is None:
        raise ValueError(f"unknown algo {algo!r}; use one of {', '.join(ALGO_CODES)}")
    return code


def empty_like_shape(x: Any, shape: tuple) -> Any:
    """A new contiguous buffer of x's kind and dtype with the given shape."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return torch.empty(shape, dtype=x.dtype)
    return np.empty(shape, dtype=x.dtype)


def copy_flat(dst: Any, src: Any) -> None:
    """dst's elements = src's, in order (a group of one's collectives copy locally): numpy
    or torch on either side (a numpy `x` with a torch `out` failed in torch's copy_)."""
    if hasattr(dst, "ctypes"):
        dst.reshape(-1)[...] = np.asarray(src).reshape(-1)
    else:
        import torch

        with torch.no_grad():
            dst.reshape(-1).copy_(torch.as_tensor(src).reshape(-1))
