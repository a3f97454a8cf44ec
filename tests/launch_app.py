"""A rank of a launched world (tests/system/test_launch.py): joins via Node.from_env(), checks the
world group with an allreduce, prints one JSON line, leaves together with the others."""

from __future__ import annotations

import json
import os
import sys

import aionet


async def main() -> int:
    async with aionet.Node.from_env() as node:
        grp = node.group()
        total = await grp.allreduce(node.rank + 1)
        alive = sorted(n for n, m in node.members().items() if m["state"] == "alive")
        out = {"name": node.name, "rank": node.rank, "world": node.world_size, "group": grp.members}
        out.update(group_rank=grp.rank, total=total, alive=alive, pid=os.getpid())
        print(json.dumps(out), flush=True)
        await grp.barrier()  # nobody leaves while another is still reading the membership
    return 0


if __name__ == "__main__":
    sys.exit(aionet.run(main()))
