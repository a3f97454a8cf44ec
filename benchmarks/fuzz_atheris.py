#!/usr/bin/env python
"""Coverage-guided fuzzing of aionet's hostile-input parsers with atheris (optional, not CI).

Targets (``--target``):

* ``framing``   -- FrameDecoder fed the input in fuzzer-chosen chunks, small limits, a
  recording ``alloc`` that fails on any allocation above ``max_frame_bytes``;
* ``handshake`` -- ``handshake.parse`` and ``parse_confirm`` on the input as one frame;
* ``serialize`` -- ``Serializer.loads`` on the input cut into 1..4 frames;
* ``all``       -- one of the above per input, chosen by its first byte (default).

Only :class:`aionet.errors.ProtocolError` subclasses may escape; anything else is a crash
atheris reports with the input that caused it.

    pip install atheris
    python benchmarks/fuzz_atheris.py -atheris_runs=200000            # all targets
    python benchmarks/fuzz_atheris.py --target framing -max_total_time=600 corpus_dir/

Arguments after the script's own options go to libFuzzer (``-max_total_time``, corpus dirs).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

try:
    import atheris
except ImportError:  # pragma: no cover - optional tool
    sys.exit("atheris is not installed: pip install atheris")

with atheris.instrument_imports():
    from aionet.codecs import handshake
    from aionet.codecs.framing import FrameDecoder
    from aionet.codecs.serialize import Serializer
    from aionet.config import LimitsSection
    from aionet.errors import ProtocolError

LIMITS = LimitsSection(
    max_message_bytes=1 << 20,
    max_frame_bytes=512 << 10,
    max_header_bytes=64 << 10,
    max_frames=16,
    max_str_len=64 << 10,
    max_bin_len=64 << 10,
    max_array_len=4096,
    max_map_len=4096,
    max_depth=16,
)
SER = Serializer(limits=LIMITS, compression="lz4", oob_min_bytes=64)


def _alloc(n: int) -> bytearray:
    if n > LIMITS.max_frame_bytes:
        raise AssertionError(f"decoder allocated {n} bytes, above max_frame_bytes")
    return bytearray(n)


def fuzz_framing(fdp: Any) -> None:
    dec = FrameDecoder(LIMITS, alloc=_alloc, large_frame_bytes=256, staging_bytes=1024)
    try:
        while fdp.remaining_bytes():
            chunk = fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 4096))
            dec.feed(chunk)
    except ProtocolError:
        pass


def fuzz_handshake(fdp: Any) -> None:
    data = fdp.ConsumeBytes(fdp.remaining_bytes())
    for parse in (handshake.parse, handshake.parse_confirm):
        try:
            parse([data])
        except ProtocolError:
            pass


def fuzz_serialize(fdp: Any) -> None:
    n = fdp.ConsumeIntInRange(1, 4)
    frames: list[Any] = []
    for i in range(n):
        size = fdp.remaining_bytes() if i == n - 1 else fdp.ConsumeIntInRange(0, 512)
        raw = fdp.ConsumeBytes(size)
        frames.append(bytearray(raw) if i else raw)
    try:
        SER.loads(frames)
    except ProtocolError:
        pass


TARGETS = {"framing": fuzz_framing, "handshake": fuzz_handshake, "serialize": fuzz_serialize}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=[*TARGETS, "all"], default="all")
    args, rest = ap.parse_known_args()
    order = list(TARGETS.values())

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        pick = fdp.ConsumeIntInRange(0, len(order) - 1) if args.target == "all" else None
        (TARGETS[args.target] if pick is None else order[pick])(fdp)

    atheris.Setup([sys.argv[0], *rest], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
