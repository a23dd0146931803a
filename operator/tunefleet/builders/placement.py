"""The manifests of placement (pure): what a model pod whose GPU model is picked where it lands
gets (the candidates' volume, the init container that picks by its node), and the node map
ConfigMap it reads (contracts/nodemap.py). webhook/reach.py decides when and what;
placement/nodemap_keeper.py keeps the map.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunefleet import GROUP, KIND, VERSION, naming
from tunefleet.artifacts import kinds
from tunefleet.builders.security import tunefleet_container
from tunefleet.builders.storage import with_storage
from tunefleet.builders.webhook import (
    RESULTS_DIR,
    VOLUME,
    Serve,
    caches_args,
    caches_mount,
    fetch_resources,
)
from tunefleet.config import Config
from tunefleet.contracts import nodemap
from tunefleet.contracts.fetch_outcome import CONTAINER as FETCH_CONTAINER
from tunefleet.contracts.fetch_outcome import Candidate
from tunefleet.storage.store import PodStorage
from tuner_job.output import MANIFEST_NAME

CANDIDATES_VOLUME = "tunefleet-candidates"
CANDIDATES_DIR = "/tunefleet/candidates"
NODES_SUBDIR = "nodes"  # the node map's lists, one file per model, under CANDIDATES_DIR
# A ConfigMap's data and binaryData together: 1 MiB, less room for its metadata.
NODE_MAP_BYTES = 1024 * 1024 - 16 * 1024


@dataclass(frozen=True)
class Mounted:
    """A candidate whose artifact is an immutable ConfigMap: mounted, read locally."""

    gpu_model: str
    config_map: str
    sha256: str
    packed: bool  # the payload gzipped (results.csv.gz) in binaryData (ConfigMap gzip delivery)

    def where(self, namespace: str, profile: str) -> str:
        """Under the artifact's own key layout, so fetch checks the manifest against it as it
        does in the store."""
        return "/".join((namespace, profile, self.gpu_model, self.sha256))


def candidates_volume(
    node_map: str, models: list[str], mounted: list[Mounted], namespace: str, profile: str
) -> dict[str, Any]:
    """One projected volume: the node map's lists of `models`, and each mounted candidate's
    files. Every source is optional: a map not made yet or an artifact ConfigMap gone reads as
    missing files, so the pod starts (untuned where it must) instead of waiting forever."""
    sources: list[dict[str, Any]] = [
        {
            "configMap": {
                "name": node_map,
                "items": [{"key": m, "path": f"{NODES_SUBDIR}/{m}"} for m in models],
                "optional": True,
            }
        }
    ]
    for m in mounted:
        results = kinds.kind().PAYLOAD + (".gz" if m.packed else "")
        base = m.where(namespace, profile)
        sources.append(
            {
                "configMap": {
                    "name": m.config_map,
                    "items": [
                        {"key": results, "path": f"{base}/{results}"},
                        {"key": MANIFEST_NAME, "path": f"{base}/{MANIFEST_NAME}"},
                    ],
                    "optional": True,
                }
            }
        )
    return {"name": CANDIDATES_VOLUME, "projected": {"defaultMode": 0o444, "sources": sources}}


def mounted_uri(m: Mounted, namespace: str, profile: str) -> str:
    return f"file://{CANDIDATES_DIR}/{m.where(namespace, profile)}"


def build_pick_container(
    candidates: list[Candidate],
    node_map: str,
    serve: Serve,
    storage: PodStorage | None,
    config: Config,
) -> dict[str, Any]:
    """tunefleet-fetch, picking the candidate of the node it runs on: its name from the
    Downward API, its model from the mounted node map. Store credentials (read-only) only when
    a candidate is fetched from the store. With caches, it unpacks the picked artifact's."""
    command = [
        "tunefleet-fetch", "--dest", RESULTS_DIR, "--devices", str(serve.devices),
        "--node-map", f"{CANDIDATES_DIR}/{NODES_SUBDIR}", "--node-map-name", node_map,
        *[a for c in candidates for a in ("--candidate", c.to_arg())],
        *(["--fail-closed"] if serve.fail_closed else []),
        *caches_args(serve),
    ]  # fmt: skip
    mounts: list[dict[str, Any]] = [
        {"name": VOLUME, "mountPath": RESULTS_DIR},
        {"name": CANDIDATES_VOLUME, "mountPath": CANDIDATES_DIR, "readOnly": True},
        *([caches_mount()] if serve.caches else []),
    ]
    pick = tunefleet_container(
        FETCH_CONTAINER, command, config, mounts=mounts, resources=fetch_resources(serve)
    )
    node = {"name": nodemap.NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    pick["env"] = [node, *(pick.get("env") or [])]
    return with_storage(pick, storage) if storage is not None else pick


# --- the node map ConfigMap -------------------------------------------------------------------


def build_node_map(
    *,
    namespace: str,
    label_key: str,
    nodes: dict[str, list[str]],
    owners: list[tuple[str, str]],
) -> dict[str, Any]:
    """The map of one (namespace, label key): `nodes` by model (every model the namespace's
    profiles tune, empty lists too), owned by those profiles (`owners`: (name, uid)), none of
    them its controller: it goes when the last of them does. Nodes that do not fit a ConfigMap
    are left out (and counted): their pods start untuned, never with another model's file."""
    data: dict[str, str] = {}
    used, left_out = 0, 0
    for model in sorted(nodes):
        kept: list[str] = []
        for node in sorted(nodes[model]):
            if used + len(node) + 1 > NODE_MAP_BYTES - len(model):
                left_out += 1
                continue
            kept.append(node)
            used += len(node) + 1
        data[model] = nodemap.encode(kept)
        used += len(model)
    annotations = {nodemap.LABEL_KEY_ANNOTATION: label_key}
    if left_out:
        annotations[nodemap.LEFT_OUT_ANNOTATION] = str(left_out)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": nodemap.config_map_name(label_key),
            "namespace": namespace,
            "labels": {**naming.MANAGED_BY, naming.ROLE_LABEL: nodemap.ROLE},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": KIND,
                    "name": name,
                    "uid": uid,
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
                for name, uid in sorted(owners, key=lambda o: o[1])
            ],
        },
        "data": data,
    }
