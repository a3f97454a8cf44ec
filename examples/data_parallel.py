#!/usr/bin/env python
"""Data-parallel training: each rank holds a shard of the data, gradients are averaged with
``grp.allreduce(..., op="mean")``, and the final weights equal a single-process run's.

A small two-layer network (numpy; or CPU torch with ``--torch``) learns a regression task by
full-batch gradient descent. This script starts ``--ranks`` nodes in one process over
tcp://127.0.0.1 to stay self-contained; in a real job each rank is its own process
(``aionet serve`` on every host, or your launcher), and the training function is the same.

    python examples/data_parallel.py --ranks 4 --steps 50
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from aionet.testing import cluster


def make_data(n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8))
    y = np.sin(x @ rng.standard_normal(8))[:, None]
    return x, y


def init(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((8, 16)) * 0.3, np.zeros(16), rng.standard_normal((16, 1)) * 0.3, np.zeros(1)]


def grads(w: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Gradients of the mean squared error of ``tanh(x W1 + b1) W2 + b2`` over this shard."""
    w1, b1, w2, b2 = w
    h = np.tanh(x @ w1 + b1)
    err = (h @ w2 + b2) - y
    d_out = 2 * err / len(x)
    dh = (d_out @ w2.T) * (1 - h**2)
    return [x.T @ dh, dh.sum(0), h.T @ d_out, d_out.sum(0)]


def train_single(x: np.ndarray, y: np.ndarray, steps: int, lr: float) -> list[np.ndarray]:
    w = init()
    for _ in range(steps):
        w = [p - lr * g for p, g in zip(w, grads(w, x, y), strict=True)]
    return w


async def train_rank(grp, x: np.ndarray, y: np.ndarray, steps: int, lr: float, use_torch: bool) -> list[np.ndarray]:
    """One rank: its shard's gradients, averaged over the group (equal shard sizes, so the
    mean of shard means is the full-batch mean)."""
    shards = np.array_split(np.arange(len(x)), grp.size)
    mine = shards[grp.rank]
    w = init()
    for _ in range(steps):
        g = grads(w, x[mine], y[mine])
        if use_torch:
            import torch

            g = [t.numpy() for t in await grp.allreduce([torch.from_numpy(a) for a in g], op="mean")]
        else:
            g = await grp.allreduce(g, op="mean")  # one fused message for the four arrays
        w = [p - lr * gi for p, gi in zip(w, g, strict=True)]
    return w


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--torch", action="store_true", help="pass CPU torch tensors to allreduce")
    args = ap.parse_args()
    if args.torch:
        import torch  # noqa: F401  (imported before the nodes start: the import takes a second)
    x, y = make_data()
    if len(x) % args.ranks:
        raise SystemExit("--ranks must divide the 512 samples (equal shards)")
    async with cluster(args.ranks, "tcp") as nodes:
        groups = [n.group() for n in nodes]
        results = await asyncio.gather(*(train_rank(g, x, y, args.steps, args.lr, args.torch) for g in groups))
    ref = train_single(x, y, args.steps, args.lr)
    same_everywhere = all(np.array_equal(a, b) for r in results for a, b in zip(r, results[0], strict=True))
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(results[0], ref, strict=True))
    loss = float(np.mean((np.tanh(x @ ref[0] + ref[1]) @ ref[2] + ref[3] - y) ** 2))
    print(f"ranks={args.ranks} steps={args.steps} loss={loss:.4f}")
    print(f"identical on every rank: {same_everywhere}; max |data-parallel - single process| = {diff:.2e}")
    print("weights equal single-process run:", same_everywhere and diff < 1e-9)


if __name__ == "__main__":
    asyncio.run(main())
