"""Prometheus metrics of the operator (docs/metrics.md lists them all).

Names carry the `tunefleet_` prefix and base units; label values come from small fixed sets
(handler names, phases, states, outcome and reason codes), never from object names, so the
series count stays bounded however many profiles and pods there are. Gauges about profiles
and Jobs are computed at scrape time from the indexes every replica keeps.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
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

from tunefleet.conditions import Phase

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
    "Writes of the node maps pods pick their GPU model by (nodemap.py), by outcome: written, "
    "failed (retried), not_ours (a ConfigMap of its name that tunefleet did not make).",
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


class IndexCollector(Collector):
    """Profiles by phase, tuning Jobs by state, pods the webhook missed, queue depth."""

    def __init__(
        self,
        statuses: Callable[[], Iterable[dict[str, Any]]],
        queue_depth: Callable[[], int],
    ) -> None:
        self.statuses = statuses
        self.queue_depth = queue_depth

    def collect(self) -> Iterator[GaugeMetricFamily]:
        phases: Tally[str] = Tally()
        states: Tally[str] = Tally()
        unadmitted = 0
        for status in self.statuses():
            phases[status.get("phase") or Phase.PENDING] += 1
            for job in status.get("jobs") or []:
                states[job.get("state") or "Pending"] += 1
            unadmitted += int(status.get("unadmittedPods") or 0)
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

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # computed at scrape time


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on its own port, in a thread of prometheus_client's."""
    if port:
        start_http_server(port, addr=addr, registry=REGISTRY)
        log.info(f"metrics on http://{addr}:{port}/metrics")
