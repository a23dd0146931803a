"""The node map at fleet size (placement/nodemap_keeper.py): what 10,000 GPU nodes cost the operator.

(a) memory: the index of 10,000 nodes (names of a GKE-like 52 characters, 4 models), measured
    with tracemalloc, and the time of the list that fills it; (b) the map a namespace gets:
    ConfigMap bytes, build time; (c) churn: 10,000 node status updates (a Node's most frequent
    change; metadata-only MODIFIED events) and a scale-up of 200 nodes over 10 s, counted in
    ConfigMap writes against a stand-in API (nothing here talks to a cluster).

    python -m bench.bench_nodemap
"""

from __future__ import annotations

import json
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from tunefleet import kube  # noqa: E402
from tunefleet.builders.placement import build_node_map  # noqa: E402
from tunefleet.placement.nodemap_keeper import NodeIndex, NodeMaps  # noqa: E402

KEY = "nvidia.com/gpu.product"
MODELS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-B200", "NVIDIA-L40S"]


class _Maps(kube.Kube):
    """The client the node maps write through, answering from a dict of ConfigMaps: the
    benchmark measures the maps' own work, not an API server's."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.there: dict[tuple[str, str], dict[str, Any]] = {}

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.there.get((namespace, name))

    def create_config_map(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        self.writes += 1
        made = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "1", "uid": "u"}}
        self.there[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = made
        return made

    def patch_config_map(
        self, namespace: str, name: str, resource_version: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        self.writes += 1
        there = self.there[(namespace, name)]
        data = {**there["data"], **patch["data"]}
        there["data"] = {k: v for k, v in data.items() if v is not None}
        return there


def _node(i: int, rv: int = 1) -> dict[str, Any]:
    name = f"gke-gpu-pool-{i:05d}-a1b2c3d4-{i:04x}.us-central1-a.c.proj"
    return {
        "metadata": {
            "name": name,
            "resourceVersion": str(rv),
            "labels": {KEY: MODELS[i % len(MODELS)], "kubernetes.io/hostname": name},
        }
    }


def run(nodes: int = 10_000) -> dict[str, Any]:
    items = [_node(i) for i in range(nodes)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    index = NodeIndex()
    started = time.perf_counter()
    index.load(KEY, items)
    load_s = time.perf_counter() - started
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    started = time.perf_counter()
    cm = build_node_map(
        namespace="ml",
        label_key=KEY,
        nodes=index.nodes(KEY, frozenset(MODELS)),
        owners=[("llama", "uid-1")],
    )
    build_s = time.perf_counter() - started
    size = sum(len(v) for v in cm["data"].values())

    store = _Maps()
    profile = {
        "metadata": {"name": "llama", "namespace": "ml", "uid": "uid-1"},
        "spec": {"gpu": {"vendor": "nvidia", "models": MODELS}},
    }
    active = threading.Event()
    active.set()
    maps = NodeMaps(store, lambda: [("ml", "llama")], lambda k: profile, active)
    maps.index = index
    maps._follow_keys = lambda: None  # type: ignore[method-assign]
    maps.lead()
    maps.step(now=0.0)
    first = store.writes
    started = time.perf_counter()
    for i in range(nodes):  # every node reports status once: nothing moves
        maps.nodes_changed(KEY, index.apply(KEY, "MODIFIED", _node(i, rv=2)))
    status_s = time.perf_counter() - started
    maps.step(now=1.0)
    after_status = store.writes - first
    now = 3.0
    for j in range(200):  # a scale-up: 200 nodes over 10 s, stepped every 0.5 s as the loop is
        maps.nodes_changed(KEY, index.apply(KEY, "ADDED", _node(nodes + j)))
        if j % 10 == 9:
            now += 0.5
            maps.step(now=now)
    maps.step(now=now + 3.0)
    return {
        "nodes": nodes,
        "index_bytes": held,
        "index_bytes_per_node": round(held / nodes, 1),
        "list_to_index_s": round(load_s, 4),
        "config_map_bytes": size,
        "config_map_build_s": round(build_s, 4),
        "status_updates_per_s": round(nodes / status_s),
        "writes_for_10000_status_updates": after_status,
        "writes_for_200_node_scale_up_over_10s": store.writes - first - after_status,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
