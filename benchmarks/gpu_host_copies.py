"""What a collective on a GPU array pays to get its bytes to the host and back, per call.

Two ways, on the node's CuPy staging backend: ``to_host`` + ``to_device`` (chunked copies into
a fresh pageable array each call: what collectives did before ``HostScratch``), and
``borrow_host`` + ``to_device`` + ``give_back`` (one copy each way through a pinned buffer
reused call after call). Needs a GPU (run it on a lent GPU machine).

    python3 benchmarks/gpu_host_copies.py [--sizes 1M,16M,64M] [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

from aionet.devices import Devices
from aionet.devices.staging import Stager


def _size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1].upper()] if text[-1].upper() in mult else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    Devices(use_nvml=False).require_cuda("benchmarks/gpu_host_copies.py")
    import cupy as cp

    stager = Stager()
    print(f"{'size':>9}  {'pageable to_host+to_device':>28}  {'pinned borrow+to_device':>26}  ratio")
    for size in (_size(s) for s in args.sizes.split(",")):
        x = cp.ones(size // 4, dtype=cp.float32)

        def pageable(x: object = x) -> None:
            h = stager.to_host(x)
            stager.to_device(h)

        def pinned(x: object = x) -> None:
            h = stager.borrow_host(x)
            stager.to_device(h)
            stager.give_back(h)

        times: dict[str, list[float]] = {"pageable": [], "pinned": []}
        for i in range(args.iters + 3):  # interleaved; the first three of each untimed
            for name, fn in (("pageable", pageable), ("pinned", pinned)):
                cp.cuda.Device().synchronize()
                t = time.perf_counter()
                fn()
                cp.cuda.Device().synchronize()
                if i >= 3:
                    times[name].append(time.perf_counter() - t)
        a, b = statistics.median(times["pageable"]), statistics.median(times["pinned"])
        spread = {k: f"{min(v) * 1e3:.2f}-{max(v) * 1e3:.2f}" for k, v in times.items()}
        print(
            f"{size:>9}  {a * 1e3:>10.2f} ms ({spread['pageable']:>13})  {b * 1e3:>8.2f} ms ({spread['pinned']:>13})"
            f"  {a / b:.1f}x"
        )
    stager.close()


if __name__ == "__main__":
    main()
