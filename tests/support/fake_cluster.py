"""The fakes of the kubectl plugin's cluster client (plugin/cluster.Cluster), handed to
`kubectl_tunefleet.main(argv, connect=...)` as the real one is made: FakeCluster (profiles
read by namespace and name) and FencedCluster (one profile whose writes are fenced by its
resourceVersion, as the API server fences them). The operator's own client has its fake in
fake_kube.py."""

from __future__ import annotations

import copy
from typing import Any

from tunefleet.plugin import cluster as cluster_mod


class FakeCluster:
    """Profiles as the API server has them, by "namespace/name"; no pod, no Event."""

    def __init__(self, profiles: dict[str, dict[str, Any]], namespace: str = "ml") -> None:
        self.profiles = profiles
        self.namespace = namespace

    def profile(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.profiles.get(f"{namespace}/{name}")

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def profile_events(self, profile: dict[str, Any]) -> list[dict[str, Any]]:
        return []

    update_profile = cluster_mod.Cluster.update_profile  # over profile() and patch_profile()


class FencedCluster:
    """The profile as the API server keeps it: a resourceVersion that every write moves on,
    and a write fenced by an older one refused (409) as the real one refuses it. `patches`
    are the writes that landed, without their fence. `race` runs once, between the plugin's
    read and its write: another writer's change."""

    def __init__(self, prof: dict[str, Any], race: Any = None) -> None:
        self.prof = copy.deepcopy(prof)
        self.prof.setdefault("metadata", {})["resourceVersion"] = "1"
        self.namespace = "ml"
        self.patches: list[dict[str, Any]] = []
        self.conflicts = 0
        self.race = race

    update_profile = cluster_mod.Cluster.update_profile

    def profile(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.prof) if (namespace, name) == ("ml", "llm") else None

    def patch_profile(self, namespace: str, name: str, patch: dict[str, Any]) -> Any:
        if self.race is not None:
            race, self.race = self.race, None
            race(self)
        patch = copy.deepcopy(patch)
        meta = self.prof["metadata"]
        fence = patch.get("metadata", {}).pop("resourceVersion", None)
        if fence is not None and fence != meta["resourceVersion"]:
            self.conflicts += 1
            raise cluster_mod._Conflict(name)
        self.patches.append(patch)
        for key, value in patch.get("metadata", {}).get("annotations", {}).items():
            annotations = meta.setdefault("annotations", {})
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return self.profile(namespace, name)
