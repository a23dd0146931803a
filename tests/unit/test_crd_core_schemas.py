"""spec.template's schema is what hack/crd_core_schemas.py makes of the pinned core/v1
definitions, and those are what it needs: nothing hand-edited, nothing stale."""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from hack import crd_core_schemas as gen
from testbed.builders.largest import template_schema
from tunefleet.api import pod_template as api


def test_the_crd_is_what_the_generator_writes() -> None:
    text = gen.CRD.read_text()
    assert gen.render(text, gen.load_pinned()) == text, (
        "crds/tunefleet.io_tuningprofiles.yaml differs from its generator: run "
        "`.venv/bin/python hack/crd_core_schemas.py render && make sync-crds`"
    )


def test_the_check_can_fail() -> None:
    pinned = gen.load_pinned()
    changed = copy.deepcopy(pinned)
    toleration = changed["schemas"]["io.k8s.api.core.v1.Toleration"]["properties"]
    toleration["effect"]["enum"].append("NoWhere")
    assert gen.render(gen.CRD.read_text(), changed) != gen.CRD.read_text()


def test_the_pinned_definitions_are_exactly_what_render_uses() -> None:
    """Pinning again from the pinned copy keeps it as it is: no definition missing, none
    unused, each trimmed to the fields tunefleet takes."""
    pinned = gen.load_pinned()
    assert gen.pin(pinned["schemas"], pinned["source"]) == pinned
    assert "Kubernetes" in pinned["source"]


def _all_nodes(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            out.append(n)
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    return out


def test_the_schema_is_structural_and_documented() -> None:
    schema = template_schema()
    nodes = _all_nodes(schema)
    for node in nodes:
        assert "$ref" not in node and "allOf" not in node and "oneOf" not in node
        assert "x-kubernetes-patch-strategy" not in node and "default" not in node
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True
    # kubectl explain shows Kubernetes' own words for what it takes from core/v1.
    volumes = schema["properties"]["spec"]["properties"]["volumes"]
    assert volumes["description"].startswith("List of volumes")
    pvc = volumes["items"]["properties"]["persistentVolumeClaim"]
    assert "PersistentVolumeClaim" in pvc["description"]
    assert pvc["required"] == ["claimName"]
    limits = schema["properties"]["tune"]["properties"]["resources"]["properties"]["limits"]
    assert limits["additionalProperties"]["x-kubernetes-int-or-string"] is True
    assert set(volumes["items"]["properties"]) == {"name", *api.VOLUME_TYPES}


def test_the_cel_rules_name_what_the_models_reserve() -> None:
    """The CRD's reserved names come from tunefleet.api.pod_template, the models' own."""
    text = json.dumps(template_schema())
    for name in (*api.RESERVED_VOLUMES, *api.RESERVED_LABELS):
        assert f"'{name}'" in text
    assert api.RESERVED_VOLUME_PREFIX in text and api.RESERVED_MOUNT + "/" in text
    rule = gen.one_of_rule(api.VOLUME_TYPES)
    assert gen.one_of_fields(rule) == api.VOLUME_TYPES
    assert gen.key_size_of(gen.key_size_rule(316)["rule"]) == 316


def test_the_chart_copy_follows() -> None:
    chart = gen.ROOT / "charts" / "tunefleet" / "files" / gen.CRD.name
    assert yaml.safe_load(chart.read_text()) == yaml.safe_load(gen.CRD.read_text())
