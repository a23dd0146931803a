"""TunableOp results and a cache in one artifact, on the real node, every step in containers.

The stand-in inference image tunes (its torch computes nothing and says so); its workload
plays a serving stack that keeps an autotuner's findings in the directory a variable names
(the generic `cache` kind, docs/bundles.md). The model pod gets both before it starts: one
results file per GPU, TunableOp's settings, and a writable copy of the cache with the
variable pointing at it. The real-torch bundle is tests/e2e/test_bundles_torch.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.cluster import wait_for_real_node_gpus
from testbed.operator import InCluster
from testbed.real_node import SHAPES, model_pod, real_profile
from tests.support.kube import apply, create, ended, ready, statuses

pytestmark = pytest.mark.e2e

# The stack's first run: it tunes and writes its findings where its variable says.
STACK_TUNES = (
    "import json, os; "
    "open(os.path.join(os.environ['FAKESTACK_CACHE'], 'kernels.json'), 'w')"
    ".write(json.dumps({'best': 'tile-128x64'}))"
)
# A serving start: what tunefleet gave it, then the stack reads its cache and adds to it.
SERVE = (
    'standin-server --once && echo "cache at $FAKESTACK_CACHE" && '
    'cat "$FAKESTACK_CACHE/kernels.json" && echo && '
    'touch "$FAKESTACK_CACHE/added-at-start" && echo "cache writable"'
)


def test_results_and_a_cache_are_tuned_together_and_both_served(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    wait_for_real_node_gpus(cluster, 2)
    profile = real_profile(
        "both",
        s3,
        s3_secret,
        workload={
            "command": ["python3", "-c", STACK_TUNES],
            "shapes": SHAPES,
            "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}],
        },
        artifacts={"caches": [{"kind": "cache", "name": "stack", "env": "FAKESTACK_CACHE"}]},
    )
    apply(cluster, namespace, profile)
    prof = ready(cluster, namespace, "both", timeout=300)
    st = prof["status"]
    assert st["phase"] == "Ready", json.dumps(st, indent=2)[:4000]
    (art,) = st["artifacts"]
    assert "kind" not in art and art["gemms"] > 0  # TunableOp results, the default kind
    (cache,) = art["caches"]
    assert (cache["kind"], cache["name"], cache["files"]) == ("cache", "stack", 1)
    assert st["kinds"] == "tunableop+stack"

    pod = model_pod("server", "both", gpus=1)
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", SERVE]
    create(cluster, namespace, pod)
    done = ended(cluster, namespace, "server", "the model pod to finish")
    log = cluster.kubectl("logs", "-n", namespace, "server", "-c", "server").stdout
    said = done["metadata"].get("annotations") or {}
    assert done["status"]["phase"] == "Succeeded", f"{said}\n{log}"
    fetch = statuses(done)["tunefleet-fetch"]["state"]["terminated"]
    assert "wrote 1 results file(s)" in fetch["message"], fetch
    assert "caches stack unpacked to /tunefleet/caches" in fetch["message"], fetch
    assert "PYTORCH_TUNABLEOP_ENABLED=1" in log
    assert "cache at /tunefleet/caches/stack/data" in log
    assert '{"best": "tile-128x64"}' in log and "cache writable" in log
