"""Leader election against an in-memory Lease API, and the metrics the operator exposes."""

from __future__ import annotations

import datetime
import socket
import types
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import generate_latest

from tunefleet import metrics
from tunefleet.runtime.leader import LeaseElector, Timing


class LeaseApi:
    """read/create/replace with resourceVersion checks, as the API server does."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def _obj(self) -> Any:
        assert self.lease is not None
        spec = self.lease["spec"]

        def ts(v: str | None) -> datetime.datetime | None:
            return datetime.datetime.strptime(v, "%Y-%m-%dT%H:%M:%S.%fZ") if v else None

        return types.SimpleNamespace(
            metadata=types.SimpleNamespace(resource_version=str(self.version)),
            spec=types.SimpleNamespace(
                holder_identity=spec.get("holderIdentity"),
                renew_time=ts(spec.get("renewTime")),
                acquire_time=ts(spec.get("acquireTime")),
                lease_duration_seconds=spec.get("leaseDurationSeconds"),
                lease_transitions=spec.get("leaseTransitions"),
            ),
        )

    def read_namespaced_lease(self, name: str, ns: str, **_: Any) -> Any:
        if self.lease is None:
            raise ApiException(status=404)
        return self._obj()

    def create_namespaced_lease(self, ns: str, body: dict[str, Any], **_: Any) -> None:
        if self.lease is not None:
            raise ApiException(status=409)
        self.lease, self.version = body, self.version + 1

    def replace_namespaced_lease(self, name: str, ns: str, body: dict[str, Any], **_: Any) -> None:
        if body["metadata"].get("resourceVersion") != str(self.version):
            raise ApiException(status=409)
        self.lease, self.version = body, self.version + 1


def elector(api: LeaseApi, identity: str, events: list[str]) -> LeaseElector:
    return LeaseElector(
        "tunefleet-operator",
        "tunefleet-system",
        identity,
        on_started=lambda: events.append(f"{identity} leads"),
        on_stopped=lambda: events.append(f"{identity} follows"),
        timing=Timing(duration=10, renew_deadline=7, retry=2),
        api=api,
    )


def test_one_leader_and_a_takeover_only_after_the_lease_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("tunefleet.runtime.leader.time.monotonic", lambda: clock[0])
    api, events = LeaseApi(), []
    a, b = elector(api, "a", events), elector(api, "b", events)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    clock[0] += 5
    assert a.try_acquire_or_renew() is True  # renewed
    assert b.try_acquire_or_renew() is False
    clock[0] += 9  # a died: b has seen the same record for 9 s < 10 s
    assert b.try_acquire_or_renew() is False
    clock[0] += 2
    assert b.try_acquire_or_renew() is True
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1


def test_a_released_lease_is_taken_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    api, events = LeaseApi(), []
    a, b = elector(api, "a", events), elector(api, "b", events)
    assert a.try_acquire_or_renew()
    a._leading = True
    a.stop(release=True)
    assert b.try_acquire_or_renew() is True
    assert events == ["a follows"]


def test_metrics_are_named_and_labelled_by_convention() -> None:
    collector = metrics.IndexCollector(
        statuses=lambda: [
            {"phase": "Ready", "jobs": [{"state": "Succeeded"}]},
            {"phase": "Pending", "jobs": [{"state": "Pending"}], "unadmittedPods": 2},
        ],
        queue_depth=lambda: 3,
    )
    metrics.REGISTRY.register(collector)
    try:
        metrics.ADMISSIONS.labels("untuned", "no_artifact").inc()
        metrics.ADMISSION_SECONDS.observe(0.0004)
        text = generate_latest(metrics.REGISTRY).decode()
    finally:
        metrics.REGISTRY.unregister(collector)
    assert 'tunefleet_profiles{phase="Ready"} 1.0' in text
    assert 'tunefleet_profiles{phase="Failed"} 0.0' in text
    assert 'tunefleet_tuning_jobs{state="Pending"} 1.0' in text
    assert "tunefleet_unadmitted_pods 2.0" in text
    assert "tunefleet_workqueue_depth 3.0" in text
    assert 'tunefleet_admissions_total{outcome="untuned",reason="no_artifact"}' in text
    assert "tunefleet_admission_duration_seconds_bucket" in text
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert line.startswith("tunefleet_"), line


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux only")
def test_a_write_the_api_server_never_acknowledged_cannot_land_after_the_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel aborts a connection whose data stays unacknowledged (a frozen path), so a
    timed-out write is not delivered later by retransmission; the margin covers it."""
    import kubernetes

    from tunefleet.runtime import client

    monkeypatch.setattr(client, "_configuration", kubernetes.client.Configuration)
    monkeypatch.setattr(client, "_api", None)  # given back after the test
    client.login(pool_size=2)
    options = client.api().configuration.socket_options
    assert (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 2000) in options
    assert (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) in options  # urllib3's own kept
    pool = client.api().rest_client.pool_manager
    assert (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 2000) in pool.connection_pool_kw[
        "socket_options"
    ]
    timing = Timing()
    margin = timing.duration - timing.renew_deadline + client.MIN_WRITE_SECONDS
    assert margin > client.UNACKED_ABORT_S
