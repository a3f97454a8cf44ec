"""Wire compression of float32 collectives to 16 bits (Horovod's ``Compression.fp16``): half the
bytes on the wire, reductions still done in float32.

Each value is rounded to 16 bits every time it crosses the wire and widened back before it is
combined, so the error grows with the number of hops. For an allreduce over ``n`` ranks, an
element of the result differs from the exact sum by at most about ``n * u * sum(|x_i|)``
(first order), with ``u`` the unit roundoff: 2**-11 (4.9e-4) for fp16, 2**-8 (3.9e-3) for bf16.
fp16 keeps more precision but overflows above 65504 (partial sums included) and flushes below
6e-8; bf16 keeps float32's range. Every rank gets the same bits (each rank rounds what it keeps
exactly as the others will see it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CollectiveError

__all__ = ["CODECS", "WireCodec", "wire_codec"]


@dataclass(frozen=True)
class WireCodec:
    """float32 <-> a 16-bit wire form."""

    name: str
    unit_roundoff: float

    def encode(self, x: np.ndarray) -> np.ndarray:
        if self.name == "fp16":
            return x.astype(np.float16)
        bits = np.ascontiguousarray(x).view(np.uint32)
        # round to nearest even on the 16 bits kept; NaNs stay NaN (quiet) rather than rounding to inf
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(
            np.uint16
        )
        nan = np.isnan(x)
        if nan.any():
            rounded[nan] = np.uint16(0x7FC0)
        return rounded

    def decode(self, w: np.ndarray) -> np.ndarray:
        wire = np.float16 if self.name == "fp16" else np.uint16
        if type(w) is not np.ndarray or w.dtype != wire:  # a peer that did not compress this call
            theirs = f"{w.dtype} elements" if type(w) is np.ndarray else f"a {type(w).__name__}"
            raise CollectiveError(
                f"a peer sent {theirs} where {self.name}-compressed float32 was expected: call the same "
                "collective with the same shape and dtype (and compression) on every rank"
            )
        if self.name == "fp16":
            return np.asarray(w, dtype=np.float16).astype(np.float32)
        return (np.asarray(w, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)

    def round(self, x: np.ndarray) -> np.ndarray:
        """``x`` as the other ranks will see it after the wire."""
        return self.decode(self.encode(x))


CODECS = {"fp16": WireCodec("fp16", 2.0**-11), "bf16": WireCodec("bf16", 2.0**-8)}


def wire_codec(name: str | None, dtype: np.dtype) -> WireCodec | None:
    """The codec for ``compression=`` (None/"none": no compression). Only float32 compresses."""
    if name in (None, "none"):
        return None
    codec = CODECS.get(name)
    if codec is None:
        raise ValueError(f"compression must be 'none', 'fp16' or 'bf16', not {name!r}")
    if dtype != np.float32:
        raise ValueError(f"compression={name!r} applies to float32 arrays; this one is {dtype}")
    return codec
