"""Services loaded into `aionet serve` subprocesses by tests (``--app tests.apps:setup``)."""

import asyncio


def setup(node):
    @node.service("test.hang")
    async def hang(_):
        await asyncio.Event().wait()

    @node.service("test.pid")
    def pid(_):
        import os

        return os.getpid()

    @node.service("test.drain")
    async def drain(channel):
        """Everything waiting on ``channel`` now (for counting what arrived, in order)."""
        got = []
        while True:
            try:
                got.extend(await asyncio.wait_for(node.recv_batch(channel), 0.2))
            except TimeoutError:
                return got

    @node.service("test.block")
    def block(arg):
        """Block the event loop (a sync handler runs on it): ``["sleep", s]`` sleeps;
        ``["gil", n]`` runs one C call that holds the GIL the whole time (sum of range(n))."""
        import time

        how, amount = arg
        t0 = time.monotonic()
        if how == "sleep":
            time.sleep(amount)
        else:
            sum(range(int(amount)))
        return time.monotonic() - t0

    @node.service("test.allreduce_then_compute")
    async def allreduce_then_compute(arg):
        """Join group ``members`` (name ``step``) and run ``steps`` times: a small allreduce, then
        ``compute`` seconds of work that does not yield (a training step's forward/backward)."""
        import time

        import numpy as np

        members, steps, compute = arg
        grp = node.group(members=members, name="step")
        x = np.ones(2, dtype=np.float32)
        for _ in range(steps):
            await grp.allreduce(x)
            time.sleep(compute)
        return steps

    @node.service("test.allreduce_loop")
    async def allreduce_loop(arg):
        """Join group ``members`` and allreduce (or reduce-scatter) ``n`` float32 ones forever (until killed)."""
        import numpy as np

        members, n, *kind = arg  # kind: "allreduce" (the default) or "reduce_scatter"
        grp = node.group(members=members, name="loop")
        x = np.ones(n, dtype=np.float32)
        call = grp.reduce_scatter if kind == ["reduce_scatter"] else grp.allreduce
        while True:
            await call(x)
