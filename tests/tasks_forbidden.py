"""A task module the scheduler tests never allow (except where said): whether it was imported
is visible in ``sys.modules``, and running ``touch`` leaves a file."""

from __future__ import annotations

from pathlib import Path


def touch(path: str) -> str:
    Path(path).write_text("ran")
    return "ran"
