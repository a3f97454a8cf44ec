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
