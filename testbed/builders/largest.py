"""The largest TuningProfile spec the CRD accepts: every list full, every string at its bound.

Unit tests check that it, and everything derived from it, fits what Kubernetes and exec(2)
take; e2e tests apply it (and one character more) to the real API server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hack.crd_core_schemas import key_size_of, one_of_fields
from tunefleet.api.base import DNS_SUBDOMAIN
from tunefleet.api.models import MAX_ARGV_CHARS, MAX_ENV_VALUE_CHARS, STORAGE_URI_MAX

CRD = Path(__file__).resolve().parents[2] / "crds" / "tunefleet.io_tuningprofiles.yaml"


def _dns(n: int, fill: str) -> str:
    """A DNS subdomain of exactly n characters: 63-character labels joined by dots."""
    labels, left = [], n
    while left > 0:
        size = min(63, left)
        labels.append(fill * size)
        left -= size + 1
    name = ".".join(labels)
    return name[:n].rstrip(".") if len(name) > n else name


# The longest storage URI the CRD takes: a 63-character bucket, then 255-character segments.
_PREFIX = STORAGE_URI_MAX - len("s3://") - 63
LONGEST_URI = (
    "s3://"
    + "b" * 63
    + "".join("/" + "p" * min(255, _PREFIX - i - 1) for i in range(0, _PREFIX, 256))
)


def template_schema() -> dict[str, Any]:
    """spec.template's schema, as the CRD holds it."""
    doc = yaml.safe_load(CRD.read_text())
    (version,) = doc["spec"]["versions"]
    node: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return dict(node["properties"]["template"])


def _rules(node: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in node.get("x-kubernetes-validations") or []]


def _exclusive(node: dict[str, Any]) -> set[str]:
    """Fields of which a CEL rule allows exactly one (a volume's source)."""
    return {f for r in _rules(node) for f in one_of_fields(r) or ()}


def json_bound(node: dict[str, Any]) -> int:
    """The most bytes any value the schema accepts takes as compact JSON, one byte a character
    (as largest_spec counts): every string at maxLength, every list and map full, every
    optional field there, of fields a CEL rule makes exclusive the largest."""
    if node.get("x-kubernetes-int-or-string"):
        return max(int(node.get("maxLength", 0)) + 2, len(str(-(2**63))))
    kind = node.get("type")
    if kind == "string":
        if "enum" in node:
            return max(len(e) for e in node["enum"]) + 2
        return int(node["maxLength"]) + 2
    if kind == "integer":
        if "minimum" in node and "maximum" in node:
            return max(len(str(node["minimum"])), len(str(node["maximum"])))
        return len(str(-(2**31))) if node.get("format") == "int32" else len(str(-(2**63)))
    if kind == "boolean":
        return len("false")
    if kind == "array":
        n = int(node["maxItems"])
        return 2 + n * json_bound(node["items"]) + max(n - 1, 0)
    if kind == "object" and "additionalProperties" in node:
        n = int(node["maxProperties"])
        (key,) = [k for k in map(key_size_of, _rules(node)) if k is not None]
        entry = key + 3 + json_bound(node["additionalProperties"])
        return 2 + n * entry + max(n - 1, 0)
    if kind == "object":
        props = node.get("properties") or {}
        sizes = {name: len(name) + 3 + json_bound(child) for name, child in props.items()}
        one_of = _exclusive(node)
        chosen = [v for k, v in sizes.items() if k not in one_of]
        if one_of:
            chosen.append(max(sizes[k] for k in one_of))
        return 2 + sum(chosen) + max(len(chosen) - 1, 0)
    raise ValueError(f"no bound for {json.dumps(node)[:200]}")


def _largest(node: dict[str, Any], fill: str = "a") -> Any:
    """A value of exactly json_bound(node) bytes (reserved names and list-map keys are made
    valid after, by largest_template)."""
    if node.get("x-kubernetes-int-or-string"):
        return "9" * (int(node["maxLength"]) - 1) + "M"  # a Quantity's longest spelling
    kind = node.get("type")
    if kind == "string":
        if "enum" in node:
            return max(node["enum"], key=len)
        n = int(node["maxLength"])
        return _dns(n, fill) if node.get("pattern") == DNS_SUBDOMAIN else fill * n
    if kind == "integer":
        if "minimum" in node and "maximum" in node:
            return max(node["minimum"], node["maximum"], key=lambda v: len(str(v)))
        return -(2**31) if node.get("format") == "int32" else -(2**63)
    if kind == "boolean":
        return False
    if kind == "array":
        return [_largest(node["items"], fill) for _ in range(int(node["maxItems"]))]
    if kind == "object" and "additionalProperties" in node:
        (key,) = [k for k in map(key_size_of, _rules(node)) if k is not None]
        values = node["additionalProperties"]
        return {
            f"k{i:03d}".ljust(key, "k"): _largest(values, fill)
            for i in range(int(node["maxProperties"]))
        }
    props = node.get("properties") or {}
    one_of = _exclusive(node)
    keep = [k for k in props if k not in one_of]
    if one_of:
        keep.append(max(one_of, key=lambda k: len(k) + json_bound(props[k])))
    return {k: _largest(props[k], fill) for k in keep}


def largest_template() -> dict[str, Any]:
    """The biggest spec.template the CRD accepts (json_bound of its schema, byte for byte):
    valid for the CRD's rules and tunefleet's models, not a pod anyone could run (quantities
    past int64, made-up names); unique volume names and mount paths, none of them reserved."""
    template: dict[str, Any] = _largest(template_schema())
    volumes = template["spec"]["volumes"]
    for i, volume in enumerate(volumes):
        volume["name"] = f"v{i:02d}".ljust(len(volume["name"]), "a")
    for i, mount in enumerate(template["tune"]["volumeMounts"]):
        mount["name"] = volumes[i % len(volumes)]["name"]
        mount["mountPath"] = f"/m{i:02d}".ljust(len(mount["mountPath"]), "a")
    return template


def largest_spec(argv_extra: int = 0, env_extra: int = 0, template: bool = False) -> dict[str, Any]:
    """The biggest valid spec; *_extra push a total one or more characters over its bound.
    `template`: with the largest spec.template too (whose made-up quantities and names the API
    server takes in a profile but not in a pod: without it the Jobs can be made)."""
    image = "registry.example.com/" + "a" * (512 - len("registry.example.com/") - 2) + ":1"
    argv_item = MAX_ARGV_CHARS // 64  # 32 command items + 32 args of 4096 characters
    command = ["x" * argv_item for _ in range(32)]
    args = ["y" * argv_item for _ in range(32)]
    if argv_extra:
        args[-1] = args[-1][:-1]  # keep each item within its 4096 bound...
        args.append("z" * (argv_extra + 1))  # ...and go over the total
    env_value = MAX_ENV_VALUE_CHARS // 128
    env = [{"name": f"E{i:03d}" + "N" * 252, "value": "v" * env_value} for i in range(128)]
    if env_extra:
        env[-1]["value"] += "v" * env_extra
    shape = {
        "mnk": [1048576, 1048576, 1048576],
        "batch": 65536,
        "dtype": "bfloat16",
        "transA": True,
        "transB": True,
        "bias": False,
        "tf32": False,
    }
    return {
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "imagePullSecrets": [{"name": _dns(253, chr(ord("a") + i))} for i in range(16)],
        "gpu": {
            "vendor": "nvidia",
            "models": [f"M{i:02d}" + "x" * 60 for i in range(16)],
            "labelKey": _dns(252, "k") + "/" + "n" * 63,
            "resourceName": _dns(189, "r") + "/" + "g" * 63,
            "count": 16,
        },
        "workload": {
            "command": command,
            "args": args,
            "env": env,
            "shapes": [dict(shape) for _ in range(4096)],
        },
        "tuning": {
            "maxDurationMs": 60000,
            "maxIterations": 100000,
            "warmupDurationMs": 60000,
            "warmupIterations": 100000,
            "rotatingBufferMB": 65536,
            "numericalCheck": True,
            "budgetSeconds": 172800,
            "activeDeadlineSeconds": 259200,
            "backoffLimit": 6,
            "queueName": _dns(63, "q"),
        },
        "storage": {
            "uri": LONGEST_URI,
            "endpoint": "https://" + "e" * 200 + "/" + "q" * (1024 - 8 - 200 - 1),
            "region": "r" * 64,
            "credentialsSecret": {"name": _dns(253, "s")},
        },
        "serving": {"failClosed": True},
        **({"template": largest_template()} if template else {}),
    }
