"""crds/ is the single schema source: the chart's copy and the pydantic models must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tunefleet.api import Artifact, CaptureStatus, Condition, TuningProfileSpec

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "tunefleet.io_tuningprofiles.yaml"
CHART_CRD = ROOT / "charts" / "tunefleet" / "files" / "tunefleet.io_tuningprofiles.yaml"
COMPARED = (
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
)


def crd_schema() -> dict[str, Any]:
    doc = yaml.safe_load(CRD.read_text())
    (version,) = doc["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return _resolve(defs[node["$ref"].split("/")[-1]], defs)
    if "anyOf" in node:  # Optional[X] -> X
        (inner,) = [n for n in node["anyOf"] if n.get("type") != "null"]
        merged = {**_resolve(inner, defs), **{k: v for k, v in node.items() if k != "anyOf"}}
        return merged
    if "allOf" in node and len(node["allOf"]) == 1:
        return {
            **_resolve(node["allOf"][0], defs),
            **{k: v for k, v in node.items() if k != "allOf"},
        }
    return node


def diff(crd: dict[str, Any], model: dict[str, Any], defs: dict[str, Any], path: str) -> list[str]:
    """Every disagreement between a CRD schema node and a pydantic JSON schema node."""
    if crd.get("x-kubernetes-int-or-string"):
        return []  # int | str in the model; nothing more to compare
    model = _resolve(model, defs)
    out: list[str] = []
    if crd.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in crd:
        return out  # free-form maps (valueFrom, identity)
    if crd.get("type") == "object" and "properties" in crd:
        cprops, mprops = crd["properties"], model.get("properties", {})
        if set(cprops) != set(mprops):
            out.append(f"{path}: CRD fields {sorted(cprops)} != model fields {sorted(mprops)}")
        if set(crd.get("required", [])) != set(model.get("required", [])):
            out.append(
                f"{path}: CRD requires {sorted(crd.get('required', []))}, "
                f"model requires {sorted(model.get('required', []))}"
            )
        for name in set(cprops) & set(mprops):
            out += diff(cprops[name], mprops[name], defs, f"{path}.{name}")
        return out
    if crd.get("type") == "array":
        out += diff(crd["items"], model.get("items", {}), defs, f"{path}[]")
    for key in COMPARED:
        if crd.get(key) != model.get(key) and not (key == "pattern" and key not in crd):
            out.append(
                f"{path}: {key} is {crd.get(key)!r} in the CRD, {model.get(key)!r} in the model"
            )
    if "default" in crd and crd.get("type") != "object" and crd["default"] != model.get("default"):
        out.append(
            f"{path}: default {crd['default']!r} in the CRD, {model.get('default')!r} in the model"
        )
    return out


def _check(crd_node: dict[str, Any], model: type[BaseModel], path: str) -> list[str]:
    js = model.model_json_schema(by_alias=True)
    return diff(crd_node, js, js.get("$defs", {}), path)


def test_chart_carries_the_crd_unchanged() -> None:
    assert CHART_CRD.read_bytes() == CRD.read_bytes(), (
        "charts/tunefleet/files/ has drifted from crds/: run `make sync-crds`"
    )


def test_spec_model_matches_crd() -> None:
    problems = _check(crd_schema()["properties"]["spec"], TuningProfileSpec, "spec")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("conditions", Condition),
        ("artifacts", Artifact),
        ("history", Artifact),
        ("capture", CaptureStatus),
    ],
)
def test_status_models_match_crd(path: str, model: type[BaseModel]) -> None:
    node = crd_schema()["properties"]["status"]["properties"][path]["items"]
    js = model.model_json_schema(by_alias=True)
    assert set(node["properties"]) == set(js["properties"]), f"status.{path} drifted"
    if path == "capture":  # nested, and with what loop.py writes
        problems = _check(node, model, f"status.{path}")
        assert not problems, "\n".join(problems)


def test_drift_check_can_fail() -> None:
    """The comparator itself notices a changed bound, a missing field and a new enum value."""
    spec = crd_schema()["properties"]["spec"]
    spec["properties"]["gpu"]["properties"]["count"]["maximum"] = 99
    spec["properties"]["gpu"]["properties"]["vendor"]["enum"].append("intel")
    del spec["properties"]["serving"]
    problems = "\n".join(_check(spec, TuningProfileSpec, "spec"))
    assert "spec.gpu.count: maximum" in problems
    assert "spec.gpu.vendor: enum" in problems
    assert "serving" in problems
