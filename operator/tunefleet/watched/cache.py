"""tunefleet's cache of what it watches (informers/view_cache.py over this schema): TuningProfiles
by key, the tuning Jobs each profile controls, the tuning pods each Job controls. A Job or pod
that carries a profile's uid label (naming.PROFILE_UID_LABEL) without being controlled by it is
untrusted: counted (tunefleet_untrusted_objects_total), logged once, reported by that
profile's reconcile, never read as its child."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tunefleet import metrics, naming
from tunefleet.api.conditions import Phase
from tunefleet.informers.view_cache import Cache, Key, Schema, Untrusted
from tunefleet.watched import kinds, views

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Summary:
    """What the metrics read of a profile's status, kept beside its view (no parse a scrape)."""

    phase: str
    job_states: tuple[str, ...]
    unadmitted: int

    @classmethod
    def of(cls, view: dict[str, Any]) -> Summary:
        status = view.get("status") or {}
        return cls(
            str(status.get("phase") or Phase.PENDING),
            tuple(str(j.get("state") or "Pending") for j in status.get("jobs") or []),
            int(status.get("unadmittedPods") or 0),
        )


def _claims(view: dict[str, Any]) -> str:
    return str((view["metadata"].get("labels") or {}).get(naming.PROFILE_UID_LABEL, ""))


def _stub_labels(meta: dict[str, Any]) -> dict[str, str]:
    name = (meta.get("labels") or {}).get(naming.TUNING_PROFILE_LABEL)
    return {naming.TUNING_PROFILE_LABEL: name} if name else {}


def _untrusted(obj: Untrusted, claimed: str) -> None:
    metrics.UNTRUSTED_OBJECTS.labels(obj.kind).inc()
    log.warning(
        f"{obj.kind[:-1]} {obj.namespace}/{obj.name} carries tunefleet's labels for profile "
        f"uid {claimed} but no controller ownerReference to it: ignored"
    )


SCHEMA = Schema(
    root=kinds.PROFILES.name,
    root_view=views.profile_view,
    summarize=Summary.of,
    children={kinds.JOBS.name: views.job_view, kinds.PODS.name: views.pod_view},
    claims=_claims,
    stub_labels=_stub_labels,
    on_untrusted=_untrusted,
)


class ProfileCache(Cache):
    """The cache in the profile reconciler's words."""

    def __init__(self) -> None:
        super().__init__(SCHEMA)
        self._statuses: tuple[int, list[dict[str, Any]]] = (-1, [])

    def put_profile(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.put_root(body)

    def drop_profile(self, key: Key) -> None:
        self.drop_root(key)

    def profile(self, key: Key) -> dict[str, Any] | None:
        return self.root(key)

    def profiles(self) -> list[Key]:
        return self.roots()

    def has_profile_uid(self, uid: str) -> bool:
        return self.has_root_uid(uid)

    def jobs(self, namespace: str, profile_uid: str) -> list[dict[str, Any]]:
        """The Jobs a profile controls, in its own namespace."""
        return self.children(kinds.JOBS.name, namespace, profile_uid)

    def pods(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        """The pods a Job controls."""
        return self.children(kinds.PODS.name, namespace, job_uid)

    def statuses(self) -> list[dict[str, Any]]:
        """The part of each profile's status the metrics count (metrics.IndexCollector),
        built again only once a profile changed: a scrape of 10,000 settled profiles reads
        none of them (bench_metrics; it took ~14 ms of the GIL a scrape)."""
        version, built = self._statuses
        if version == self.version:
            return built
        version, summaries = self.summaries()
        built = [
            {
                "phase": s.phase,
                "jobs": [{"state": state} for state in s.job_states],
                "unadmittedPods": s.unadmitted,
            }
            for s in summaries
        ]
        self._statuses = (version, built)
        return built

    def sizes(self) -> dict[str, int]:
        sizes = super().sizes()
        sizes["profiles"] = sizes.pop("roots")
        return sizes
