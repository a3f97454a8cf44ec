"""Cache services loaded into `aionet serve` subprocesses by the cache's system tests
(``--app tests.cache_apps:setup``)."""

import asyncio


def setup(node):
    held = set()

    @node.service("test.cache.count")
    def count(_):
        return len(node.cache.store)

    @node.service("test.cache.hold")
    async def hold(arg):
        """Take lock ``name`` with ``ttl``, write ``key`` fenced by it, and keep holding it
        (renewed) until the process dies. Returns the lease's token."""
        name, ttl, key = arg
        ready = asyncio.get_running_loop().create_future()

        async def keep():
            async with node.lock(name, ttl=ttl) as lease:
                await node.cache.put(key, "from holder", fence=lease)
                ready.set_result(lease.token)
                await asyncio.Event().wait()

        task = asyncio.get_running_loop().create_task(keep())
        held.add(task)
        return await ready
