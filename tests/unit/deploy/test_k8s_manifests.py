"""deploy/k8s and deploy/docker, checked offline: every rendered manifest against the Kubernetes
API schema in strict mode (kubernetes-validate, whose wheel ships the schemas), the node config
in the ConfigMap by aionet's own parser, and the wiring between the pieces (seeds, ports,
probes, mounts, GPU limits) that a schema cannot see. No kubectl, no cluster."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from aionet.config import Config
from tests.kustomize_lite import Unsupported, render, strategic_merge

kv = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.32.0"  # schemas shipped in the kubernetes-validate wheel; strict = unknown fields refused
KUSTOMIZATIONS = ["base", "overlays/cpu", "overlays/gpu"]


def _one(resources: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [r for r in resources if r["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "aionet")


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_rendered_manifest_passes_strict_schema_validation(path):
    resources = render(K8S / path)
    assert {r["kind"] for r in resources} == {"Service", "ConfigMap", "StatefulSet"}
    for res in resources:
        kv.validate(res, KUBERNETES_VERSION, strict=True)


def test_the_token_secret_example_passes_strict_schema_validation():
    secret = yaml.safe_load((K8S / "token-secret.example.yaml").read_text())
    kv.validate(secret, KUBERNETES_VERSION, strict=True)
    assert secret["stringData"]["token"] == "", "the example must not ship a usable token"


def test_strict_validation_refuses_a_misspelt_field():
    """The check above can fail: a typo in a field name is an error, not ignored."""
    sts = _one(render(K8S / "base"), "StatefulSet")
    sts["spec"]["replicaz"] = sts["spec"].pop("replicas")
    with pytest.raises(kv.ValidationError, match="replicaz"):
        kv.validate(sts, KUBERNETES_VERSION, strict=True)


def _node_config(resources: list[dict[str, Any]]) -> tuple[Config, dict[str, Any]]:
    """The ConfigMap's config as a pod sees it: parsed by aionet with the container's literal env."""
    cm = _one(resources, "ConfigMap")
    container = _container(_one(resources, "StatefulSet"))
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    data = tomllib.loads(cm["data"]["node.toml"])
    return Config.from_dict(data, env=env), data


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_configmap_holds_a_config_aionet_accepts_with_the_pods_environment(path):
    cfg, _ = _node_config(render(K8S / path))
    assert cfg.node.name == "$(POD_NAME)"  # expanded by Kubernetes from the pod's name
    assert cfg.security.token_file and cfg.http.port > 0


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_seeds_are_every_statefulset_pod_by_its_stable_dns_name(path):
    """No head node: the seed list is aionet-0..N-1 behind the headless Service, in the
    namespace the kustomization deploys into, on the port the pods listen on."""
    resources = render(K8S / path)
    sts, svc = _one(resources, "StatefulSet"), _one(resources, "Service")
    cfg, _ = _node_config(resources)
    ns = sts["metadata"]["namespace"]
    port = next(p["containerPort"] for p in _container(sts)["ports"] if p["name"] == "aionet")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    name, service = sts["metadata"]["name"], svc["metadata"]["name"]
    expected = [f"tcp://{name}-{k}.{service}.{ns}.svc.cluster.local:{port}" for k in range(sts["spec"]["replicas"])]
    assert cfg.node.join == expected
    assert [urlport(u) for u in cfg.node.listen] == [port]
    advertise = next(e["value"] for e in _container(sts)["env"] if e["name"] == "AIONET_NODE_ADVERTISE")
    assert advertise == f"tcp://$(POD_NAME).{service}.$(POD_NAMESPACE).svc.cluster.local:{port}"


def urlport(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_probes_mounts_and_resources_match_the_config(path):
    resources = render(K8S / path)
    sts = _one(resources, "StatefulSet")
    cfg, _ = _node_config(resources)
    c = _container(sts)
    http_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    assert http_port == cfg.http.port
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == _one(resources, "ConfigMap")["metadata"]["name"]
    assert c["args"] == ["--config", f"{mounts['config']}/node.toml"]
    assert volumes["token"]["secret"]["secretName"] == "aionet-token"
    assert cfg.security.token_file == f"{mounts['token']}/token"
    assert {"cpu", "memory"} <= c["resources"]["requests"].keys() <= c["resources"]["limits"].keys()
    pod_security = sts["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] != 0


def test_gpu_pool_asks_for_a_gpu_on_gpu_nodes_and_cpu_pool_does_not():
    gpu, cpu = (_one(render(K8S / "overlays" / p), "StatefulSet") for p in ("gpu", "cpu"))
    assert int(_container(gpu)["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert "nvidia.com/gpu" not in _container(cpu)["resources"]["limits"]
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu["spec"]["template"]["spec"]["tolerations"])
    assert _container(gpu)["image"] != _container(cpu)["image"], "the GPU pool runs the CUDA image"
    assert _node_config(render(K8S / "overlays" / "gpu"))[0].scheduler.resources["gpu"] == 1


def test_dockerfile_is_slim_python_311_non_root_and_serves_the_manifests_config():
    text = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert re.search(r'^ENTRYPOINT \["aionet", "serve"\]$', text, re.M)
    cmd = yaml.safe_load(re.search(r"^CMD (.*)$", text, re.M).group(1))  # a JSON array
    assert cmd == _container(_one(render(K8S / "base"), "StatefulSet"))["args"]


# ------------------------------------------------------------------ the renderer itself


def test_strategic_merge_merges_named_lists_and_replaces_others():
    base = {"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}]}], "tolerations": [{"key": "k"}]}
    patch = {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}], "tolerations": [{"key": "j"}]}
    merged = strategic_merge(base, patch)
    assert merged["containers"][0]["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]
    assert merged["tolerations"] == [{"key": "j"}]
    assert base["containers"][0]["env"] == [{"name": "X", "value": "1"}], "the base is not changed"


def test_renderer_refuses_kustomize_features_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(Unsupported, match="namePrefix"):
        render(tmp_path)
