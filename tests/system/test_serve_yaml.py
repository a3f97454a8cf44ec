"""`aionet serve --config node.yaml`: a YAML config runs a node, and a bad one is refused naming file and key."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(60)
def test_serve_runs_from_a_yaml_config(spawn, tmp_path):
    conf = tmp_path / "node.yaml"
    conf.write_text("node:\n  name: from-yaml\n  listen: [tcp://127.0.0.1:0]\n")
    _, ready = spawn("--config", str(conf))
    assert ready["name"] == "from-yaml"


@pytest.mark.timeout(60)
def test_serve_refuses_a_yaml_config_with_an_unknown_key_naming_file_and_key(tmp_path):
    conf = tmp_path / "node.yml"
    conf.write_text("node:\n  name: a\n  lisen: [tcp://127.0.0.1:0]\n")
    r = subprocess.run(
        [sys.executable, "-m", "aionet", "serve", "--config", str(conf)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode != 0
    assert f"{conf}: unknown key node.lisen (did you mean 'listen'?)" in r.stderr
