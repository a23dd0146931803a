"""The node map: which nodes have which GPU model, as a model pod's init container reads it.

A pod whose required node affinity allows several GPU models of its profile cannot be given
one artifact at admission: the scheduler decides the node later. The webhook mounts the
candidates' artifacts and this map, and the init container picks by the node it runs on
(`spec.nodeName`, through the Downward API: no credentials, no API call).

Written by the operator (placement/nodemap_keeper.py keeps it up to date from a Node watch; the
ConfigMap is built by builders/placement.py); read by the init container (artifacts/fetch.py). One
ConfigMap per (namespace, GPU label key), named by the key; one data key per GPU model (label
values are valid ConfigMap keys), its value the names of that model's nodes, one per line,
sorted. Only the models the namespace's profiles tune are listed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# The env var the init container reads its node's name from (a fieldRef to spec.nodeName).
NODE_ENV = "TUNEFLEET_NODE_NAME"
ROLE = "node-map"  # naming.ROLE_LABEL of the ConfigMap
LABEL_KEY_ANNOTATION = "tunefleet.io/gpu-label-key"
# Set when the fleet's nodes did not all fit a ConfigMap: how many were left out (they read as
# "not in the map": their pods start untuned, never with a guessed artifact).
LEFT_OUT_ANNOTATION = "tunefleet.io/nodes-left-out"
_PREFIX = "tunefleet-gpu-nodes-"


def config_map_name(label_key: str) -> str:
    """Deterministic per label key: the webhook names it without reading anything."""
    return _PREFIX + hashlib.sha256(label_key.encode()).hexdigest()[:12]


def encode(nodes: list[str]) -> str:
    return "".join(f"{n}\n" for n in sorted(nodes))


def decode(text: str) -> frozenset[str]:
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def read_lists(directory: Path, models: list[str]) -> dict[str, frozenset[str] | None]:
    """Each model's nodes as mounted (None: the model's file is not there: the map, or its
    entry for that model, did not exist when the kubelet mounted it)."""
    out: dict[str, frozenset[str] | None] = {}
    for model in models:
        try:
            out[model] = decode((directory / model).read_text(encoding="utf-8"))
        except FileNotFoundError:
            out[model] = None
    return out


def models_of(node: str, lists: dict[str, frozenset[str] | None]) -> list[str]:
    """The models the map lists `node` under (one, when the map is sound)."""
    return [m for m, nodes in lists.items() if nodes is not None and node in nodes]
