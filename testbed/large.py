"""A real-size bundle for the real node (tests/e2e/test_bundles_large.py, `python -m bench
large`): the stand-in inference image's workload plays a stack whose autotuner leaves a GiB of
incompressible bytes (a seeded generator's, so anyone can recompute their SHA-256) in the
directory its variable names (the generic `cache` kind)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from testbed.real_node import SHAPES, model_pod, real_profile

SEED = 52
CACHE = "big"
VARIABLE = "BIGSTACK_CACHE"
BLOB = f"/tunefleet/caches/{CACHE}/data/blob.bin"  # where a model pod finds it


def stack_writes(mib: int, seed: int = SEED) -> str:
    """The workload: `mib` MiB of the seeded generator's bytes where its variable says."""
    return (
        f"import os, random; r = random.Random({seed}); "
        f"f = open(os.path.join(os.environ['{VARIABLE}'], 'blob.bin'), 'wb'); "
        f"[f.write(r.randbytes(1 << 20)) for _ in range({mib})]; f.close()"
    )


def expected_sha256(mib: int, seed: int = SEED) -> str:
    """The SHA-256 of what stack_writes(mib, seed) writes."""
    r, h = random.Random(seed), hashlib.sha256()
    for _ in range(mib):
        h.update(r.randbytes(1 << 20))
    return h.hexdigest()


def large_profile(
    name: str, s3: Any, secret: str, prefix: str, mib: int, seed: int = SEED
) -> dict[str, Any]:
    """real_profile with TunableOp results (the stand-in's) and the `mib` MiB cache (of the
    generator seeded with `seed`), stored under `prefix` of the bucket (the caller's own,
    emptied afterwards)."""
    profile = real_profile(
        name,
        s3,
        secret,
        workload={
            "command": ["python3", "-c", stack_writes(mib, seed)],
            "shapes": SHAPES,
            "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}],
        },
        artifacts={"caches": [{"kind": "cache", "name": CACHE, "env": VARIABLE}]},
        tuning={"backoffLimit": 0, "budgetSeconds": 900, "activeDeadlineSeconds": 1800},
    )
    profile["spec"]["storage"]["uri"] = f"s3://{s3.bucket}/{prefix}"
    return profile


def serving_pod(name: str, profile: str, command: str, **limits: str) -> dict[str, Any]:
    """A model pod that runs `command` (sh) and stays up (a server: a restart would show in
    its counts), with these limits added to its container's."""
    pod = model_pod(name, profile, gpus=1)
    pod["spec"]["restartPolicy"] = "Always"
    container = pod["spec"]["containers"][0]
    container["command"] = ["sh", "-c", command]
    container["resources"]["limits"].update(limits)
    return pod


def volume_profile(
    name: str, s3: Any, mib: int, repository: str, public_key: str, seed: int = SEED
) -> dict[str, Any]:
    """large_profile on an oci:// store (`repository` of the local registry, Secrets
    registry-writer, registry-reader and signing in the namespace) whose artifact pods mount
    as an image volume: the operator holds the public key (spec.storage.signing.publicKey)."""
    profile = large_profile(name, s3, "", "unused", mib, seed)
    profile["spec"]["storage"] = {
        "uri": f"oci://{repository}",
        "credentialsSecret": {"name": "registry-writer"},
        "signing": {"secret": {"name": "signing"}, "publicKey": public_key},
    }
    profile["spec"]["serving"] = {"credentialsSecret": {"name": "registry-reader"}}
    return profile
