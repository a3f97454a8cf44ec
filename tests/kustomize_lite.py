"""A small kustomize renderer for the overlays in deploy/k8s/, so CI validates them without
kubectl or a kustomize binary (neither pip nor Debian's apt ship one).

It implements only what those kustomizations use, and refuses anything else by name, so a new
feature in an overlay fails the test instead of being silently ignored: ``resources`` (files
and directories), ``namespace``, ``patches`` (strategic-merge patches from files, matched by
kind and name) and ``images`` (newName/newTag). Strategic merge here: mappings merge key by
key, lists of mappings that all carry ``name`` merge item by item on it (containers, env,
volumes, ports...), other lists are replaced -- Kubernetes' merge keys for every list the
overlays patch. Where kubectl is installed, tests/system/test_k8s_kustomize.py checks the output
equals ``kubectl kustomize``'s.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "patches", "images"}


class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement."""


def render(directory: Path) -> list[dict[str, Any]]:
    """The resources a kustomization directory produces, in the order kustomize lists them."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    extra = set(kust) - SUPPORTED
    if extra:
        raise Unsupported(f"{directory}: kustomization fields {sorted(extra)} are not implemented here")
    out: list[dict[str, Any]] = []
    for entry in kust.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            out.extend(render(path))
        else:
            out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    if "namespace" in kust:
        for res in out:
            res.setdefault("metadata", {})["namespace"] = kust["namespace"]
    for patch_ref in kust.get("patches", []):
        if set(patch_ref) != {"path"}:
            raise Unsupported(f"{directory}: only `patches: - path: FILE` is implemented, not {patch_ref}")
        patch = yaml.safe_load((directory / patch_ref["path"]).read_text())
        targets = [r for r in out if r["kind"] == patch["kind"] and r["metadata"]["name"] == patch["metadata"]["name"]]
        if len(targets) != 1:
            raise ValueError(f"{directory}/{patch_ref['path']}: matches {len(targets)} resources, not one")
        merged = strategic_merge(targets[0], {k: v for k, v in patch.items() if k != "metadata"})
        out[out.index(targets[0])] = merged
    for image in kust.get("images", []):
        for container in _containers(out):
            name, _, _tag = container["image"].rpartition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', _tag)}"
    return out


def strategic_merge(base: Any, patch: Any) -> Any:
    """``patch`` merged onto a copy of ``base`` (see the module docstring for the rules)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = strategic_merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out = copy.deepcopy(base)
        by_name = {item["name"]: i for i, item in enumerate(out)}
        for item in patch:
            if item["name"] in by_name:
                out[by_name[item["name"]]] = strategic_merge(out[by_name[item["name"]]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def _containers(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c
        for r in resources
        for key in ("containers", "initContainers")
        for c in r.get("spec", {}).get("template", {}).get("spec", {}).get(key, [])
    ]
