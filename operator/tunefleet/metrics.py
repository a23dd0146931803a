"""Prometheus metrics of the operator (docs/metrics.md lists them all).

Names carry the `tunefleet_` prefix and base units. The fleet-wide metrics take label values
from small fixed sets (handler names, phases, states, outcome and reason codes), never from
object names. The per-profile gauges (what each profile's artifact buys, its promotion, its
capture coverage, its pods run untuned for a cause of ours) are labelled with the profile's
namespace and name and the GPU model, because a dashboard per profile and GPU model is what
they are for: their series are bounded by profiles x GPU models x figures (two), not by pods.
Gauges about profiles and Jobs are computed at scrape time from the indexes every replica keeps.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tunefleet.api.conditions import Phase
from tunefleet.contracts.artifact_record import PINNED, REJECTED, SERVABLE, verdict_of
from tuner_job.gain import FIGURES, Gain

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

HANDLER_CALLS = Counter(
    "tunefleet_handler_calls_total",
    "Handler invocations: kopf event handlers, admission, reconciles, resyncs.",
    ["handler"],
    registry=REGISTRY,
)
HANDLER_ERRORS = Counter(
    "tunefleet_handler_errors_total",
    "Handler invocations that failed, by kind: temporary (retried with backoff), permanent "
    "(reported in status), unexpected (a bug; retried).",
    ["handler", "kind"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "tunefleet_reconcile_duration_seconds",
    "Time one profile reconcile took.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
    registry=REGISTRY,
)
TUNING_SECONDS = Histogram(
    "tunefleet_tuning_duration_seconds",
    "GPU time a published artifact took to tune (the manifest's tuningSeconds).",
    buckets=(10, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400),
    registry=REGISTRY,
)
NODE_MAP_WRITES = Counter(
    "tunefleet_node_map_writes_total",
    "Writes of the node maps pods pick their GPU model by (placement/nodemap_keeper.py), by "
    "outcome: written, failed (retried), not_ours (a ConfigMap of its name that tunefleet "
    "did not make).",
    ["outcome"],
    registry=REGISTRY,
)
ARTIFACTS_PUBLISHED = Counter(
    "tunefleet_artifacts_published_total",
    "Artifacts that became current for a (profile, GPU model), as seen by this operator.",
    registry=REGISTRY,
)
ADMISSIONS = Counter(
    "tunefleet_admissions_total",
    "Pod admissions by outcome (injected, untuned, refused, unchanged) and reason code.",
    ["outcome", "reason"],
    registry=REGISTRY,
)
PODS_SERVED = Counter(
    "tunefleet_pods_served_total",
    "Model pods admitted with their profile's artifact, by how they get it: ConfigMap or "
    "ImageVolume (mounted, nothing runs before the model), Store (the fetch init container). "
    "Counted by the replica that admitted the pod: sum over replicas.",
    ["namespace", "profile", "delivery"],
    registry=REGISTRY,
)
ADMISSION_SECONDS = Histogram(
    "tunefleet_admission_duration_seconds",
    "Time the webhook handler took per admission (the API server adds its own transport).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
    registry=REGISTRY,
)
LEADER = Gauge(
    "tunefleet_leader",
    "1 while this replica holds the lease and runs the reconciler, else 0.",
    registry=REGISTRY,
)
UNTRUSTED_OBJECTS = Counter(
    "tunefleet_untrusted_objects_total",
    "Jobs and pods seen with tunefleet's labels but without the controller ownerReference "
    "that makes them a profile's (or a tuning Job's): ignored, never read as children.",
    ["kind"],
    registry=REGISTRY,
)
CONFIG_MAPS_REMADE = Counter(
    "tunefleet_artifact_config_maps_remade_total",
    "Artifact ConfigMaps made again after the one status named was deleted or replaced.",
    registry=REGISTRY,
)
STATUS_CONFLICTS = Counter(
    "tunefleet_status_conflicts_total",
    "Status writes the API server refused because the profile changed since it was read "
    "(409): recomputed from a fresh read.",
    registry=REGISTRY,
)
EVENTS_DROPPED = Counter(
    "tunefleet_events_dropped_total",
    "Kubernetes Events not posted because 1,000 were already waiting (a burst): best effort, "
    "as client-go's recorder.",
    registry=REGISTRY,
)
QUEUE_RETRIES = Counter(
    "tunefleet_workqueue_retries_total",
    "Profiles put back on the work queue after a failed reconcile.",
    registry=REGISTRY,
)
CAPTURE_UPLOADS = Counter(
    "tunefleet_capture_uploads_total",
    "Capture uploads from model pods' sidecars, by outcome: accepted, unauthenticated (no or "
    "a bad token), forbidden (not a pod tunefleet injected for a profile with capture on), "
    "bad_request, too_large, rate_limited, unavailable (the store could not be written now).",
    ["outcome"],
    registry=REGISTRY,
)
CAPTURE_ROWS = Counter(
    "tunefleet_capture_rows_total",
    "Captured GEMM rows accepted from model pods: new (not in the store before) or known.",
    ["kind"],
    registry=REGISTRY,
)
SIGNING_REQUESTS = Counter(
    "tunefleet_signing_requests_total",
    "Signing requests from tuning and merge Jobs' publish steps, by outcome: signed, "
    "unauthenticated (no or a bad token), forbidden (not a step of a Job the operator made, or "
    "a manifest it cannot vouch for), bad_request, too_large, rate_limited, unavailable.",
    ["outcome"],
    registry=REGISTRY,
)
STORE_BROKER_REQUESTS = Counter(
    "tunefleet_store_broker_requests_total",
    "Store broker and registry proxy requests from tuning pods' sync and publish steps, by "
    "outcome: presigned, proxied, "
    "unauthenticated, forbidden (not a step of a Job the operator made, or a key outside its "
    "own), conflict (the profile's store is not s3://), bad_request, too_large, rate_limited, "
    "unavailable.",
    ["outcome"],
    registry=REGISTRY,
)
CAPTURE_SECONDS = Histogram(
    "tunefleet_capture_duration_seconds",
    "Time the capture endpoint took per upload (token review, pod read, store write).",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 5),
    registry=REGISTRY,
)
RETUNES = Counter(
    "tunefleet_retunes_total",
    "Retunes of captured misses started, by reason (Threshold, Manual).",
    ["reason"],
    registry=REGISTRY,
)

PHASES = tuple(Phase)
JOB_STATES = ("Pending", "Running", "Succeeded", "Failed")

Profiled = tuple[str, str, Mapping[str, Any]]  # (namespace, profile name, its status)
MODEL_LABELS = ["namespace", "profile", "gpu_model"]
FIGURE_LABELS = [*MODEL_LABELS, "figure", "stand_in"]


class IndexCollector(Collector):
    """Profiles by phase, tuning Jobs by state, pods the webhook missed, queue depth; and,
    given `profiles` (and `untuned`), what each profile's artifacts buy (_ProfileFamilies)."""

    def __init__(
        self,
        statuses: Callable[[], Iterable[dict[str, Any]]],
        queue_depth: Callable[[], int],
        profiles: Callable[[], Iterable[Profiled]] | None = None,
        untuned: Callable[[str, str], Iterable[str]] | None = None,
    ) -> None:
        self.statuses = statuses
        self.queue_depth = queue_depth
        # Optional, so a collector of the fleet gauges alone (tests, tools) needs neither.
        self.profiles = profiles
        self.untuned = untuned  # (namespace, profile) -> the cause of each untuned pod
        self._tallied: tuple[Iterable[dict[str, Any]], tuple[Tally[str], Tally[str], int]] | None
        self._tallied = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._fleet()
        if self.profiles is not None:
            yield from self._per_profile(self.profiles)

    def _tally(self) -> tuple[Tally[str], Tally[str], int]:
        """Profiles by phase, Jobs by state, unadmitted pods: counted again only when
        `statuses` answers a new list (ProfileCache.statuses keeps one until a profile
        changes), so a scrape of a settled fleet counts nothing."""
        listed = self.statuses()
        if self._tallied is not None and self._tallied[0] is listed:
            return self._tallied[1]
        phases: Tally[str] = Tally()
        states: Tally[str] = Tally()
        unadmitted = 0
        for status in listed:
            phases[status.get("phase") or Phase.PENDING] += 1
            for job in status.get("jobs") or []:
                states[job.get("state") or "Pending"] += 1
            unadmitted += int(status.get("unadmittedPods") or 0)
        counted = (phases, states, unadmitted)
        self._tallied = (listed, counted)
        return counted

    def _fleet(self) -> Iterator[GaugeMetricFamily]:
        phases, states, unadmitted = self._tally()
        profiles = GaugeMetricFamily(
            "tunefleet_profiles", "TuningProfiles by status.phase.", labels=["phase"]
        )
        for phase in PHASES:
            profiles.add_metric([phase], phases.get(phase, 0))
        yield profiles
        jobs = GaugeMetricFamily(
            "tunefleet_tuning_jobs",
            "Tuning Jobs of the profiles' current revisions, by state.",
            labels=["state"],
        )
        for state in JOB_STATES:
            jobs.add_metric([state], states.get(state, 0))
        yield jobs
        yield GaugeMetricFamily(
            "tunefleet_unadmitted_pods",
            "Running labelled pods the webhook never saw (created while it was unreachable).",
            value=unadmitted,
        )
        yield GaugeMetricFamily(
            "tunefleet_workqueue_depth",
            "Profiles waiting for a reconcile (queued, delayed or in progress).",
            value=self.queue_depth(),
        )

    def _per_profile(
        self, profiles: Callable[[], Iterable[Profiled]]
    ) -> Iterator[GaugeMetricFamily]:
        families = _ProfileFamilies()
        for namespace, name, status in profiles():
            families.add(namespace, name, status)
            if self.untuned is not None:
                causes = Tally(self.untuned(namespace, name))
                for cause, count in sorted(causes.items()):
                    families.untuned.add_metric([namespace, name, cause], count)
        yield from families.all()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # computed at scrape time


class _ProfileFamilies:
    """The per-profile gauges of one scrape, filled from each profile's status. What the status
    says is read as the writer may have left it (another version, a hand edit): an entry
    without a GPU model is skipped, a figure that does not parse whole is left out and a gain
    that is not one counts as not measured (Gain.from_dict), so one odd status never fails the
    scrape of every profile."""

    def __init__(self) -> None:
        def family(name: str, text: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=labels)

        self.speedup = family(
            "tunefleet_artifact_speedup",
            "Speedup of the served artifact, measured where it was tuned: the median of paired "
            "baseline/tuned ratios (> 1 is faster), per figure (gemms, workload).",
            FIGURE_LABELS,
        )
        self.low = family(
            "tunefleet_artifact_speedup_low",
            "Lower bound of the confidence interval of tunefleet_artifact_speedup.",
            FIGURE_LABELS,
        )
        self.high = family(
            "tunefleet_artifact_speedup_high",
            "Upper bound of the confidence interval of tunefleet_artifact_speedup.",
            FIGURE_LABELS,
        )
        self.saved = family(
            "tunefleet_artifact_saved_seconds",
            "Seconds the served artifact saves per run (median baseline - median tuned); for "
            "the workload figure of a compile cache, the first iteration's saving.",
            FIGURE_LABELS,
        )
        self.promoted = family(
            "tunefleet_artifact_promoted",
            "1 when the served artifact passed its promotion gate (Passed, Unmeasured, Pinned).",
            MODEL_LABELS,
        )
        self.rejected = family(
            "tunefleet_artifact_rejected",
            "Artifacts in status.history rejected by the promotion gate.",
            MODEL_LABELS,
        )
        self.pinned = family(
            "tunefleet_artifact_pinned",
            "1 when the served artifact is served because of a pin.",
            MODEL_LABELS,
        )
        self.coverage = family(
            "tunefleet_capture_coverage_ratio",
            "Captured production GEMMs the current artifact has tuned, of those seen (0-1).",
            MODEL_LABELS,
        )
        self.untuned = family(
            "tunefleet_pods_untuned",
            "Admitted model pods running without their artifact for a cause of ours, by cause.",
            ["namespace", "profile", "reason"],
        )

    def all(self) -> tuple[GaugeMetricFamily, ...]:
        return (self.speedup, self.low, self.high, self.saved, self.promoted, self.rejected,
                self.pinned, self.coverage, self.untuned)  # fmt: skip

    def add(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        served = _by_model(status.get("artifacts"))
        rejected: Tally[str] = Tally(
            str(e["gpuModel"])
            for e in _entries(status.get("history"))
            if e.get("gpuModel") and verdict_of(e) == REJECTED
        )
        for model, entry in served.items():
            self._artifact([namespace, name, model], entry)
        for model in sorted(served.keys() | rejected.keys()):
            self.rejected.add_metric([namespace, name, model], rejected.get(model, 0))
        for model, entry in _by_model(status.get("capture")).items():
            coverage = entry.get("coverage")
            # Absent until a capture has seen a GEMM: no ratio then, rather than a false 0.
            if isinstance(coverage, int | float) and not isinstance(coverage, bool):
                self.coverage.add_metric([namespace, name, model], coverage / 100)

    def _artifact(self, labels: list[str], entry: Mapping[str, Any]) -> None:
        verdict = verdict_of(entry)
        # No verdict: served from before the gate existed, which is what Unmeasured says.
        self.promoted.add_metric(labels, 1 if verdict in SERVABLE or not verdict else 0)
        pinned = isinstance(entry.get("pinned"), dict) or verdict == PINNED
        self.pinned.add_metric(labels, 1 if pinned else 0)
        gain = Gain.from_dict(entry.get("gain"))
        if gain is None:
            return
        stand_in = "true" if gain.stand_in else "false"
        for figure in filter(None, map(gain.figure, FIGURES)):  # each name once, as measured
            at = [*labels, figure.name, stand_in]
            self.speedup.add_metric(at, figure.speedup)
            self.low.add_metric(at, figure.low)
            self.high.add_metric(at, figure.high)
            self.saved.add_metric(at, figure.saved_s)


def _entries(value: Any) -> list[Mapping[str, Any]]:
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def _by_model(value: Any) -> dict[str, Mapping[str, Any]]:
    """Entries by GPU model, the first of each: a duplicate would be a second series of the
    same labels, which Prometheus refuses for the whole scrape."""
    out: dict[str, Mapping[str, Any]] = {}
    for e in _entries(value):
        if e.get("gpuModel"):
            out.setdefault(str(e["gpuModel"]), e)
    return out


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on its own port, in a thread of prometheus_client's."""
    if port:
        start_http_server(port, addr=addr, registry=REGISTRY)
        log.info(f"metrics on http://{addr}:{port}/metrics")
