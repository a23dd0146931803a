"""Size limits hold everywhere: the largest profile the CRD accepts, and every object tunefleet
derives from it, fit what the API server, etcd and exec(2) take; one character more is refused.

Limits (Kubernetes 1.36, Linux): an object in etcd <= 1.5 MiB (--max-request-bytes), a
ConfigMap's data <= 1 MiB, one argv or environment string <= 128 KiB (MAX_ARG_STRLEN), all of
argv + environment <= 2 MiB with the usual 8 MiB stack (a quarter of RLIMIT_STACK), and, since
kopf keeps nothing of ours in annotations, nothing is bounded by the 256 KiB annotation limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from testbed.builders.largest import json_bound, largest_spec, largest_template, template_schema
from testbed.builders.wrappers import make_profile
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import TUNE_COMMAND, Child, build_tuning_config_map, build_tuning_job
from tunefleet.config import Config
from tuner_job.manifest import ArtifactId

ETCD_OBJECT = 1536 * 1024
CONFIGMAP_DATA = 1024 * 1024
ARG_STRLEN = 128 * 1024
ARG_MAX = 2 * 1024 * 1024
# What the tuner adds when it runs the workload: PYTORCH_TUNABLEOP_* and paths; generous.
TUNER_EXTRA = 16 * 1024


def size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")).encode())


# The largest profile's spec, and its tuning child under the longest names the API server takes.
LARGEST = TuningProfileSpec.model_validate(largest_spec(template=True))
CHILD = Child(
    LARGEST,
    namespace="n" * 63,
    profile="p" * 63,
    uid="0" * 36,
    model=LARGEST.gpu.models[0],
    config=Config(),
)


def test_the_largest_profile_fits_in_etcd_with_room_for_status() -> None:
    profile = make_profile("p" * 63, "n" * 63).spec_is(largest_spec(template=True)).obj()
    assert size(profile) < ETCD_OBJECT - 256 * 1024, size(profile)


def test_the_largest_template_is_the_most_its_schema_takes() -> None:
    """spec.template's bounds come from hack/crd_core_schemas.py: its largest instance takes
    exactly what the schema allows at most (so the check above covers every template)."""
    template = largest_template()
    assert size(template) == json_bound(template_schema())
    # The template is a fifth of the profile at most: room for what comes next.
    assert size(template) < 300 * 1024, size(template)


def test_one_volume_more_is_refused() -> None:
    raw = largest_spec(template=True)
    volumes = raw["template"]["spec"]["volumes"]
    volumes.append({**volumes[0], "name": "one-more"})
    with pytest.raises(ValidationError, match="at most 12"):
        TuningProfileSpec.model_validate(raw)


def test_its_configmap_and_job_fit() -> None:
    cm, job = build_tuning_config_map(CHILD), build_tuning_job(CHILD)
    assert sum(len(v.encode()) for v in cm["data"].values()) < CONFIGMAP_DATA
    assert size(job) < ETCD_OBJECT
    assert size(cm) < ETCD_OBJECT


def test_the_tune_container_can_exec_and_so_can_the_workload() -> None:
    job = build_tuning_job(CHILD)
    tune = next(c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "tune")
    argv = [*tune["command"], *tune["args"]]
    env = [f"{e['name']}={e.get('value', '')}" for e in tune["env"]]
    assert argv[: len(TUNE_COMMAND)] == TUNE_COMMAND
    for s in argv + env:
        assert len(s.encode()) + 1 <= ARG_STRLEN
    total = sum(len(s.encode()) + 1 + 8 for s in argv + env)  # string, NUL, pointer
    assert total + TUNER_EXTRA < ARG_MAX, total


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"argv_extra": 1}, "workload.command and workload.args must be at most 262144"),
        ({"env_extra": 1}, "workload.env values must be at most 131072"),
    ],
)
def test_one_character_over_is_refused(over: dict[str, int], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TuningProfileSpec.model_validate(largest_spec(**over))


def test_one_shape_over_is_refused() -> None:
    raw = largest_spec()
    raw["workload"]["shapes"].append(raw["workload"]["shapes"][0])
    with pytest.raises(ValidationError, match="at most 4096"):
        TuningProfileSpec.model_validate(raw)


S3_KEY_BYTES = 1024  # S3's limit on an object key


def test_every_key_derived_from_the_longest_storage_uri_fits_s3() -> None:
    """With the longest URI, namespace, profile name, GPU model and revision the API server
    takes, every object tunefleet writes has a key S3 accepts (the old 1,024-character URI
    bound let publish fail with KeyTooLongError on every try)."""
    from tunefleet.artifacts.library import (
        CHECKPOINTS_DIR,
        checkpoint_key,
        library_prefix,
        shard_base,
    )
    from tunefleet.storage.registry import parse_uri
    from tuner_job.library import CheckpointId

    loc = parse_uri(largest_spec()["storage"]["uri"])
    ns, profile, model, rev = "n" * 63, "p" * 253, "M" * 63, "r" * 10
    sha = "f" * 64
    keys = [
        loc.key(ns, profile, model, sha, "manifest.json"),  # the artifact (publish, merge)
        checkpoint_key(loc, CheckpointId(ns, profile, model, rev, 63, 64)),
        shard_base(loc, ArtifactId(ns, profile, rev, model), 63, 64) + "/manifest.json",
        library_prefix(loc, "namespace", ns, model, sha) + f"/{sha}.json",
    ]
    assert CHECKPOINTS_DIR in keys[1]
    for key in keys:
        assert len(key.encode()) <= S3_KEY_BYTES, (len(key), key[:80])
    assert max(len(k.encode()) for k in keys) > S3_KEY_BYTES - 120  # the bound is not loose


def test_a_storage_uri_one_character_over_is_refused() -> None:
    raw = largest_spec()
    raw["storage"]["uri"] += "x"
    with pytest.raises(ValidationError, match="at most 560"):
        TuningProfileSpec.model_validate(raw)
