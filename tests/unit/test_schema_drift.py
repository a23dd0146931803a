"""crds/ is the single schema source: the chart's copy and the pydantic models must agree."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tunefleet.api import CaptureStatus, Condition, TuningProfileSpec
from tunefleet.api.conditions import Phase
from tunefleet.api.pod_template import VOLUME_TYPES
from tunefleet.api.profile_status import JobLine, Summary, TuningProfileStatus
from tunefleet.contracts.artifact_record import status_fields

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

# Fields the models pass on as the API server validated and stored them (a free dict in the
# model, tunefleet.api.pod_template.Passthrough): the CRD must validate each with a real schema
# (test_passthrough_fields_have_real_schemas). A free dict anywhere else is drift.
PASSTHROUGH = frozenset(
    {
        "spec.template.spec.affinity",
        "spec.template.spec.tolerations[]",
        *(f"spec.template.spec.volumes[].{t}" for t in VOLUME_TYPES),
    }
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
    if model.get("type") == "object" and "properties" not in model and "properties" in crd:
        if path not in PASSTHROUGH:
            out.append(f"{path}: the model takes any object where the CRD has fields")
        return out
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
        ("jobs", JobLine),
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


def _nodes(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for name, child in (node.get("properties") or {}).items():
            out += _nodes(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            out += _nodes(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += _nodes(node["additionalProperties"], f"{path}{{}}")
    return out


def test_passthrough_fields_have_real_schemas() -> None:
    """What the operator passes on unjudged is still validated by the API server: a typed,
    bounded schema with fields, and nowhere in spec.template does the CRD keep unknown fields."""
    spec = crd_schema()["properties"]["spec"]
    nodes = dict(_nodes(spec, "spec"))
    for path in PASSTHROUGH:
        assert path in nodes, f"{path} is not in the CRD"
        assert nodes[path].get("type") == "object" and nodes[path].get("properties"), path
    for path, node in nodes.items():
        if path.startswith("spec.template"):
            assert not node.get("x-kubernetes-preserve-unknown-fields"), path
            assert "type" in node or node.get("x-kubernetes-int-or-string"), path
            if node.get("type") == "string" and "enum" not in node:
                assert "maxLength" in node, f"{path} is unbounded"
            if node.get("type") == "array":
                assert "maxItems" in node, f"{path} is unbounded"
            if node.get("type") == "object" and "additionalProperties" in node:
                assert "maxProperties" in node, f"{path} is unbounded"


def test_drift_check_can_fail() -> None:
    """The comparator itself notices a changed bound, a missing field and a new enum value."""
    spec = crd_schema()["properties"]["spec"]
    spec["properties"]["gpu"]["properties"]["count"]["maximum"] = 99
    spec["properties"]["gpu"]["properties"]["vendor"]["enum"].append("intel")
    del spec["properties"]["serving"]
    template = spec["properties"]["template"]["properties"]
    mount = template["tune"]["properties"]["volumeMounts"]["items"]["properties"]
    mount["subPath"]["maxLength"] = 4096
    del mount["recursiveReadOnly"]
    problems = "\n".join(_check(spec, TuningProfileSpec, "spec"))
    assert "spec.gpu.count: maximum" in problems
    assert "spec.gpu.vendor: enum" in problems
    assert "serving" in problems
    assert "spec.template.tune.volumeMounts[].subPath: maxLength" in problems
    assert "spec.template.tune.volumeMounts[]: CRD fields" in problems
    # A free dict where the CRD has fields is drift, unless the field is a named passthrough.
    free = {"type": "object", "additionalProperties": True}
    sc = template["spec"]["properties"]["securityContext"]
    assert diff(sc, free, {}, "spec.template.spec.securityContext")
    assert not diff(sc, free, {}, "spec.template.spec.affinity")


def test_every_phase_is_the_one_the_crd_describes() -> None:
    """status.phase's words are named once (conditions.Phase); the CRD's printer column and
    schema describe exactly those, in the same order, so `kubectl explain` and the operator
    agree."""
    from tunefleet.api.conditions import Phase

    doc = yaml.safe_load(CRD.read_text())
    version = doc["spec"]["versions"][0]
    column = next(
        c for c in version["additionalPrinterColumns"] if c["jsonPath"] == ".status.phase"
    )
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]
    for text in (column["description"], schema["description"]):
        named = [w.strip(" ,.") for w in text.replace(" or ", ", ").split(",")]
        words = [w.split(" (")[0] for w in named if w]
        assert [w for w in words if w in set(Phase)] == list(Phase), text


@pytest.mark.parametrize("path", ["artifacts", "history"])
def test_status_artifacts_are_the_records_fields(path: str) -> None:
    """status.artifacts[] and history[] are the artifact record's own (contracts/artifact_record.py)."""
    node = crd_schema()["properties"]["status"]["properties"][path]["items"]
    assert set(node["properties"]) == status_fields(), f"status.{path} drifted"


def test_the_status_model_writes_what_the_crd_has() -> None:
    """Every field the status model can write is in the CRD, and the CRD has none it lacks."""
    full = TuningProfileStatus(
        observed_generation=1, phase=Phase.READY, conditions=[], artifacts=[], history=[],
        revision="r", progress="", capture=[], coverage="1/1",
        summary=Summary(*["x"] * len(fields(Summary))),
    )  # fmt: skip
    written = set(full.to_status()) | {"capture"}  # an empty capture list is not written
    assert written == set(crd_schema()["properties"]["status"]["properties"])
