"""manifest.json: round trip and refusal of anything that is not a v1 manifest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.manifests import manifest
from tuner_job.manifest import SCHEMA, ManifestError, from_dict, loads, rfc3339_utc
from tuner_job.results import Outcomes


def test_round_trip_keeps_every_field_under_the_contract_names() -> None:
    m = manifest()
    doc = json.loads(m.to_json())
    assert set(doc) == {
        "schema",
        "namespace",
        "profile",
        "revision",
        "gpuModel",
        "resultsSha256",
        "gemms",
        "recorded",
        "validators",
        "identity",
        "tuningSeconds",
        "tunedAt",
        "toolVersion",
        "outcomes",
    }
    assert doc["outcomes"] == {"tuned": 9, "default": 3}
    assert doc["schema"] == SCHEMA == "tunefleet.io/manifest/v1"
    assert doc["gpuModel"] == "AMD_Instinct_MI300X_OAM" and doc["resultsSha256"] == "ab" * 32
    assert loads(m.to_json()) == m


def test_rfc3339_utc_is_what_the_manifest_accepts() -> None:
    stamp = rfc3339_utc()
    assert loads(manifest(tuned_at=stamp).to_json()).tuned_at == stamp


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"schema": "tunefleet.io/manifest/v2"}, "schema"),
        ({"resultsSha256": "AB" * 32}, "64 lowercase hex"),
        ({"resultsSha256": "ab" * 31}, "64 lowercase hex"),
        ({"gemms": -1}, "non-negative integer"),
        ({"gemms": True}, "non-negative integer"),
        ({"recorded": "14"}, "non-negative integer"),
        ({"tunedAt": "2026-11-29 20:00:00"}, "RFC 3339"),
        ({"tunedAt": "2026-11-29T20:00:00+02:00"}, "RFC 3339"),
        ({"tuningSeconds": -3}, "tuningSeconds"),
        ({"tuningSeconds": "812"}, "tuningSeconds"),
        ({"validators": {"ROCM_VERSION": "6.4"}}, "PT_VERSION"),
        ({"identity": {"gpuCount": 8}}, "strings to strings"),
        ({"namespace": ""}, "namespace"),
        ({"profile": None}, "profile"),
        ({"outcomes": {"tuned": 9, "default": 4}}, "add up to 13 GEMMs"),
        ({"outcomes": {"tuned": 12}}, "outcomes"),
        ({"outcomes": {"tuned": 12, "default": 0, "other": 0}}, "outcomes"),
        ({"outcomes": {"tuned": -1, "default": 13}}, "outcomes.tuned"),
        ({"outcomes": {"tuned": 12, "default": True}}, "outcomes.default"),
        ({"outcomes": None}, "outcomes"),
        ({"outcomes": [12, 0]}, "outcomes"),
    ],
)
def test_bad_manifests_are_refused(change: dict[str, Any], fragment: str) -> None:
    doc = json.loads(manifest().to_json())
    doc.update(change)
    with pytest.raises(ManifestError, match=fragment):
        from_dict(doc)


def test_non_json_and_non_objects_are_refused() -> None:
    with pytest.raises(ManifestError, match="not JSON"):
        loads(b'{"schema": ')
    with pytest.raises(ManifestError, match="not a JSON object"):
        loads(b"[]")


def test_a_manifest_from_before_outcomes_still_reads() -> None:
    doc = json.loads(manifest().to_json())
    del doc["outcomes"]
    old = from_dict(doc)
    assert old.outcomes is None
    assert "outcomes" not in old.to_dict()  # written back as it was
    assert old == manifest(outcomes=None)


def test_outcomes_round_trip_and_schema_stays_v1() -> None:
    m = loads(manifest(gemms=5, outcomes=Outcomes(tuned=0, default=5)).to_json())
    assert m.outcomes == Outcomes(tuned=0, default=5) and m.outcomes.gemms == 5
    assert m.to_dict()["schema"] == "tunefleet.io/manifest/v1"


def test_the_fleet_identity_round_trips_and_a_manifest_without_it_keeps_its_bytes() -> None:
    doc = {"version": 1, "image": "sha256:" + "a" * 64, "tuning": {"numericalCheck": True}}
    m = manifest(fleet_identity=doc)
    assert json.loads(m.to_json())["fleetIdentity"] == doc
    assert loads(m.to_json()) == m
    # Manifests from before it (and of retunes, images by tag) neither have nor gain it.
    assert "fleetIdentity" not in json.loads(manifest().to_json())
    assert loads(manifest().to_json()).fleet_identity is None
    bad = {**json.loads(manifest().to_json()), "fleetIdentity": ["not", "an", "object"]}
    with pytest.raises(ManifestError, match="fleetIdentity"):
        from_dict(bad)
