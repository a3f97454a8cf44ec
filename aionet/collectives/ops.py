"""Reduction operators and the inputs collectives accept, kept apart from any I/O.

Inputs: numpy arrays of any numeric dtype, CPU torch tensors (viewed through DLPack without a
copy, and without importing torch unless the caller passed a tensor), Python scalars and small
objects. Results come back in the caller's kind: a tensor for a tensor, a scalar for a scalar.
bfloat16 tensors (numpy has none) are reduced in a float32 copy and rounded back; bools count
as numpy counts them (:func:`for_op`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError

OPS: dict[str, Callable[..., Any]] = {
    "sum": np.add,
    "mean": np.add,  # summed, then divided by the group size
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
}


def ufunc(op: str) -> Callable[..., Any]:
    try:
        return OPS[op]
    except KeyError:
        raise ConfigError(f"unknown reduction op {op!r}: use one of {', '.join(OPS)}") from None


@dataclass(frozen=True, slots=True)
class Converted:
    """An input as a flat contiguous numpy array, and how to give the result back."""

    flat: np.ndarray
    shape: tuple[int, ...]
    kind: str  # "numpy", "torch", "torch-bf16" (a bfloat16 tensor's float32 copy), "scalar"
    original: Any


def to_numpy(x: Any) -> Converted:
    """``x`` as a flat numpy array (a view when it already is contiguous numeric memory)."""
    if isinstance(x, np.ndarray):
        arr, kind = x, "numpy"
    elif type(x).__module__.startswith("torch"):
        if getattr(x, "device", None) is not None and x.device.type != "cpu":
            raise TypeError("collectives take CPU torch tensors; move CUDA tensors with .cpu() or pass a CuPy array")
        t = x.detach()
        if str(t.dtype) == "torch.bfloat16":  # numpy has no bfloat16: reduced in float32, rounded back
            arr, kind = np.from_dlpack(t.float()), "torch-bf16"
        else:
            arr, kind = np.from_dlpack(t), "torch"
    elif isinstance(x, (int, float, complex, bool, np.number, np.bool_)):
        arr, kind = np.asarray(x), "scalar"
    else:
        raise TypeError(
            f"cannot reduce a {type(x).__name__}: pass a numpy array, a CPU torch tensor or a number "
            "(allgather, gather, broadcast and scatter also carry any serializable object)"
        )
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"cannot reduce dtype {arr.dtype}: numeric dtypes only")
    return Converted(np.ascontiguousarray(arr).reshape(-1), tuple(arr.shape), kind, x)


def for_op(c: Converted, op: str) -> Converted:
    """Booleans reduce as numpy reduces them over the ranks (``np.sum(np.stack(xs), axis=0)``):
    ``max`` and ``min`` are any and all and stay bool, while ``sum``, ``prod`` and ``mean``
    count in int64 (``np.add`` on two bools would be ``or``, and its mean nonsense)."""
    if c.flat.dtype.kind != "b" or op in ("max", "min"):
        return c
    return Converted(c.flat.astype(np.int64), c.shape, c.kind, c.original)


def from_numpy(c: Converted, result: np.ndarray) -> Any:
    """The reduced ``result`` (flat) in the input's kind and shape."""
    shaped = result.reshape(c.shape)
    if c.kind == "scalar":
        return shaped.item()
    if c.kind.startswith("torch"):
        import torch  # the caller passed a tensor, so torch is importable

        t = torch.from_dlpack(shaped)
        return t.to(torch.bfloat16) if c.kind == "torch-bf16" else t
    return shaped


def write_out(out: Any, result: np.ndarray) -> Any:
    """Copy the flat ``result`` into the caller's ``out`` (numpy array of any layout, or a
        CPU tensor of any layout and dtype), cast as numpy's ``same_kind`` rule allows (torch's
    ``copy_`` rule for tensors)."""
    if isinstance(out, np.ndarray):
        if out.size != result.size:
            raise ValueError(f"out has {out.size} elements, the result {result.size}")
        np.copyto(out, result.reshape(out.shape), casting="same_kind")
        return out
    import torch  # out is a tensor (check_out), so torch is importable

    if out.numel() != result.size:
        raise ValueError(f"out has {out.numel()} elements, the result {result.size}")
    with torch.no_grad():  # any layout and dtype (bfloat16 too), cast as torch casts
        out.copy_(torch.from_dlpack(result.reshape(tuple(out.shape))))
    return out


def check_out(out: Any, x: Any, op: str) -> None:
    """Refuse an ``out=`` the result cannot go into before anything is sent (afterwards the
    call would have run on every rank for nothing): another element count, a read-only array,
    an integer array for the float64 ``mean`` of integers."""
    if isinstance(x, (list, tuple)):
        raise ValueError("out= takes one array: a fused list's results come back as a new list")
    if isinstance(out, np.ndarray):
        n, dtype = out.size, out.dtype
        if not out.flags.writeable:
            raise ValueError("out is read-only: pass a writable array")
    elif type(out).__module__.startswith("torch"):
        if out.device.type != "cpu":
            raise TypeError("out= takes CPU tensors")
        n, dtype = out.numel(), np.dtype("f4" if out.is_floating_point() or out.is_complex() else "i8")
    else:
        raise TypeError(f"out must be a numpy array or a CPU torch tensor, not {type(out).__name__}")
    if isinstance(x, np.ndarray):
        count, kind = x.size, x.dtype.kind
    elif type(x).__module__.startswith("torch"):
        count, kind = x.numel(), ("f" if x.is_floating_point() or x.is_complex() else "i")
    else:
        count, kind = 1, ("f" if isinstance(x, (float, complex)) else "i")  # a Python number
        if not isinstance(x, (int, float, complex, np.number, np.bool_)):
            return  # a device array: the call refuses its out= itself (results come back on the device)
    if count != n:
        raise ValueError(f"out has {n} elements, the input {count}: pass an out= of the input's size")
    if op == "mean" and kind in "biu" and dtype.kind in "biu":
        raise TypeError(f"the mean of integers is float64: pass a float out= (or none), not {dtype}")


def finish_mean(result: np.ndarray, n: int) -> np.ndarray:
    """Sum -> mean: floats in place, integers become float64 (like ``numpy.mean``)."""
    if result.dtype.kind in "fc":
        np.divide(result, n, out=result)
        return result
    return result / n


def work_buffer(out: Any, flat: np.ndarray) -> np.ndarray | None:
    """``out`` as a flat array the algorithm may build the result in, or None (then the result
    is copied into ``out`` at the end): a writable contiguous numpy array of the input's dtype
    and size that is either the input itself (``out=x``: ``flat`` is returned, and the ring
    holds each chunk until the sends reading it are done) or does not overlap it at all."""
    if type(out) is not np.ndarray or out.dtype != flat.dtype or out.size != flat.size:
        return None
    if not (out.flags.c_contiguous and out.flags.writeable):
        return None
    if np.may_share_memory(out, flat):
        same = out.__array_interface__["data"][0] == flat.__array_interface__["data"][0]
        return flat if same and flat.flags.c_contiguous and flat.flags.writeable else None
    return out.reshape(-1)


__all__ = [
    "OPS",
    "Converted",
    "check_out",
    "finish_mean",
    "for_op",
    "from_numpy",
    "frozen",
    "to_numpy",
    "ufunc",
    "work_buffer",
    "write_out",
]


def frozen(got: Any) -> Any:
    """A read-only view of a received array that the ring forwards: the buffer is the group's
    own and never written, so the link may keep it by reference for a replay and the send need
    not wait for the kernel or the ack (ReplayCopies.immutable); the view keeps the receive
    buffer referenced, hence not recycled, until the ack drops it."""
    if type(got) is not np.ndarray:
        return got
    view = got.view()
    view.flags.writeable = False
    return view
