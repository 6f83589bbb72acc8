"""A small kustomize for the tests: `resources` and RFC 6902 JSON patches, nothing more.

The manifests in deploy/kubernetes use only these two features on purpose, so that they can
be rendered without the kustomize binary. Anything else in a kustomization.yaml is an
error here, and where `kubectl kustomize` is installed the tests check that both render the
same objects.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_KEYS = frozenset({"apiVersion", "kind", "resources", "patches"})
TARGET_KEYS = frozenset({"group", "version", "kind", "name"})


class KustomizeError(Exception):
    """A kustomization this renderer cannot build; the message names the file and the step."""


def object_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(apiVersion, kind, name): how kustomize tells objects apart within one namespace."""
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects a kustomization directory builds, in resource order, patches applied."""
    path = directory / "kustomization.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise KustomizeError(f"{path}: not a mapping")
    unknown = sorted(set(data) - SUPPORTED_KEYS)
    if unknown:
        raise KustomizeError(f"{path}: unsupported keys {unknown} (only resources and patches)")
    objects: list[dict[str, Any]] = []
    for entry in data.get("resources", []):
        resource = directory / entry
        if resource.is_dir():
            objects.extend(render(resource))
        else:
            text = resource.read_text(encoding="utf-8")
            objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    for number, patch in enumerate(data.get("patches", [])):
        where = f"{path}: patch {number}"
        if "path" in patch:
            operations = yaml.safe_load((directory / patch["path"]).read_text(encoding="utf-8"))
        else:
            operations = yaml.safe_load(patch["patch"])
        if not isinstance(operations, list):
            raise KustomizeError(f"{where}: only JSON 6902 patches (a list of operations)")
        target = patch.get("target") or {}
        if not target or set(target) - TARGET_KEYS:
            raise KustomizeError(f"{where}: target must use only {sorted(TARGET_KEYS)}")
        matched = [obj for obj in objects if _matches(obj, target)]
        if not matched:
            raise KustomizeError(f"{where}: no object matches target {target}")
        for index, obj in enumerate(objects):
            if _matches(obj, target):
                objects[index] = apply_json_patch(obj, operations, where)
    keys = [object_key(obj) for obj in objects]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise KustomizeError(f"{path}: objects defined twice: {duplicates}")
    return objects


def _matches(obj: Mapping[str, Any], target: Mapping[str, str]) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    actual = {
        "group": group,
        "version": version,
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
    }
    return all(actual[key] == value for key, value in target.items())


def _pointer(path: str, where: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"{where}: path {path!r} must start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(container: list[Any], part: str, where: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(container)
    if not part.isdigit():
        raise KustomizeError(f"{where}: {part!r} is not a list index")
    index = int(part)
    limit = len(container) if allow_end else len(container) - 1
    if index > limit:
        raise KustomizeError(f"{where}: index {index} is out of range")
    return index


def _parent(doc: Any, parts: list[str], where: str) -> Any:
    node = doc
    for token in parts[:-1]:
        if isinstance(node, list):
            node = node[_index(node, token, where, allow_end=False)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise KustomizeError(f"{where}: {token!r} does not exist")
    return node


def apply_json_patch(
    obj: Mapping[str, Any], operations: list[Mapping[str, Any]], where: str
) -> dict[str, Any]:
    """A copy of `obj` with the RFC 6902 operations test, add, remove and replace applied."""
    doc = copy.deepcopy(dict(obj))
    for number, operation in enumerate(operations):
        step = f"{where} operation {number} ({operation.get('op')} {operation.get('path')})"
        parts = _pointer(operation["path"], step)
        parent = _parent(doc, parts, step)
        token = parts[-1]
        op = operation["op"]
        if op == "add":
            if isinstance(parent, list):
                parent.insert(_index(parent, token, step, allow_end=True), operation["value"])
            else:
                parent[token] = operation["value"]
            continue
        if isinstance(parent, list):
            key: Any = _index(parent, token, step, allow_end=False)
        elif token in parent:
            key = token
        else:
            raise KustomizeError(f"{step}: {token!r} does not exist")
        if op == "test":
            if parent[key] != operation["value"]:
                raise KustomizeError(f"{step}: found {parent[key]!r}, not {operation['value']!r}")
        elif op == "remove":
            del parent[key]
        elif op == "replace":
            parent[key] = operation["value"]
        else:
            raise KustomizeError(f"{step}: operation {op!r} is not supported")
    return doc
