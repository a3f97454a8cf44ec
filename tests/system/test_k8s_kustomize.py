"""tests/kustomize_lite.py renders deploy/k8s exactly as kustomize does, checked against
``kubectl kustomize`` where kubectl is installed (CI validates with kustomize_lite, offline)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kustomize_lite import render

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (for `kubectl kustomize`)")


def _canonical(value: Any) -> Any:
    """Lists of named items in name order (kustomize appends a patch's new items elsewhere)."""
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_canonical(v) for v in value]
        if items and all(isinstance(i, dict) and "name" in i for i in items):
            items.sort(key=lambda i: i["name"])
        return items
    return value


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["base", "overlays/cpu", "overlays/gpu"])
def test_kustomize_lite_renders_what_kubectl_kustomize_renders(path):
    out = subprocess.run(["kubectl", "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    theirs = sorted((d for d in yaml.safe_load_all(out.stdout) if d), key=lambda r: (r["kind"], r["metadata"]["name"]))
    ours = sorted(render(K8S / path), key=lambda r: (r["kind"], r["metadata"]["name"]))
    assert _canonical(ours) == _canonical(theirs)
