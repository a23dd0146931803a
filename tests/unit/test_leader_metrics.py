"""Leader election against an in-memory Lease API, and the metrics the operator exposes."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from testbed.builders.wrappers import make_profile
from tests.support.fake_kube import FakeKube, FakeLeases
from tunefleet import metrics
from tunefleet.runtime.leader import Callbacks, LeaseElector, Timing


def elector(api: FakeLeases, identity: str, events: list[str]) -> LeaseElector:
    return LeaseElector(
        "tunefleet-operator",
        "tunefleet-system",
        identity,
        Callbacks(
            on_started=lambda: events.append(f"{identity} leads"),
            on_stopped=lambda: events.append(f"{identity} follows"),
        ),
        FakeKube(generated={"coordination": api}),
        timing=Timing(duration=10, renew_deadline=7, retry=2),
    )


def test_one_leader_and_a_takeover_only_after_the_lease_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("tunefleet.runtime.leader.time.monotonic", lambda: clock[0])
    api, events = FakeLeases(), []
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
    api, events = FakeLeases(), []
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


def _profile(name: str, phase: str) -> dict[str, Any]:
    return (
        make_profile(name).uid(f"uid-{name}").status(phase=phase, jobs=[{"state": "Running"}]).obj()
    )


def test_the_fleet_gauges_follow_every_profile_change_though_counted_once_a_change() -> None:
    # A settled fleet's scrape counts nothing (the tally is kept); any change to a profile,
    # a watch event, our own status write or a deletion, must show in the next scrape.
    from tunefleet.watched.cache import ProfileCache

    cache = ProfileCache()
    collector = metrics.IndexCollector(statuses=cache.statuses, queue_depth=lambda: 0)

    def gauges() -> dict[str, float]:
        return {
            f"{s.name}{sorted((k, str(v)) for k, v in s.labels.items())}": s.value
            for fam in collector.collect()
            for s in fam.samples
            if s.value
        }

    cache.put_profile(_profile("a", "Pending"))
    cache.put_profile(_profile("b", "Pending"))
    first = gauges()
    assert first["tunefleet_profiles[('phase', 'Pending')]"] == 2
    assert cache.statuses() is cache.statuses()  # kept while nothing changes
    assert gauges() == first
    cache.put_profile(_profile("b", "Ready"))  # a watch event
    assert gauges()["tunefleet_profiles[('phase', 'Ready')]"] == 1
    cache.written(("ml", "a"), "9", {"phase": "Failed"})  # our own status write
    after = gauges()
    assert after["tunefleet_profiles[('phase', 'Failed')]"] == 1
    assert after["tunefleet_tuning_jobs[('state', 'Running')]"] == 1
    cache.drop_profile(("ml", "b"))
    assert "tunefleet_profiles[('phase', 'Ready')]" not in gauges()


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux only")
def test_a_write_the_api_server_never_acknowledged_cannot_land_after_the_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel aborts a connection whose data stays unacknowledged (a frozen path), so a
    timed-out write is not delivered later by retransmission; the margin covers it."""
    import kubernetes

    from tunefleet.runtime import client

    one = client.Client()
    one.login(pool_size=2, config=kubernetes.client.Configuration())
    options = one.api().configuration.socket_options
    assert (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 2000) in options
    assert (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) in options  # urllib3's own kept
    pool = one.api().rest_client.pool_manager
    assert (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 2000) in pool.connection_pool_kw[
        "socket_options"
    ]
    timing = Timing()
    margin = timing.duration - timing.renew_deadline + client.MIN_WRITE_SECONDS
    assert margin > client.UNACKED_ABORT_S


def figure(name: str, speedup: float, base: float = 2.0, tuned: float = 1.0) -> dict[str, Any]:
    return {"name": name, "baselineSeconds": base, "tunedSeconds": tuned, "speedup": speedup,
            "low": speedup - 0.1, "high": speedup + 0.2, "repetitions": 5}  # fmt: skip


def samples(
    profiles: list[tuple[str, str, dict[str, Any]]], untuned: dict[str, list[str]] | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The per-profile samples one scrape yields: (name, sorted labels) -> value."""
    collector = metrics.IndexCollector(
        statuses=lambda: [],
        queue_depth=lambda: 0,
        profiles=lambda: profiles,
        untuned=lambda ns, name: (untuned or {}).get(f"{ns}/{name}", []),
    )
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
        if "namespace" in s.labels
    }


def at(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted({"namespace": "team-a", "profile": "llama", **labels}.items()))


def test_per_profile_gauges_show_what_each_served_artifact_buys() -> None:
    status = {
        "artifacts": [
            {"gpuModel": "H100", "sha256": "a" * 64, "delivery": "ConfigMap",
             "gain": {"mode": "CUDAGraphs", "figures": [figure("gemms", 1.5), figure("workload", 1.2, 30.0, 12.5)]},
             "promotion": {"verdict": "Passed", "message": "passed"}},
            {"gpuModel": "STANDIN-A", "sha256": "b" * 64,
             "gain": {"standIn": True, "figures": [figure("gemms", 3.0)]},
             "promotion": {"verdict": "Pinned", "message": "held"},
             "pinned": {"reason": "rollback", "at": "2026-01-01T00:00:00Z"}},
            {"gpuModel": "MI300X", "sha256": "c" * 64},  # from before promotion: no verdict, no gain
        ],
        "history": [
            {"gpuModel": "H100", "promotion": {"verdict": "Rejected", "message": "slower"}},
            {"gpuModel": "H100", "promotion": {"verdict": "Rejected", "message": "slower"}},
            {"gpuModel": "H100", "promotion": {"verdict": "Passed", "message": "older"}},
            {"gpuModel": "A100", "promotion": {"verdict": "Rejected", "message": "slower"}},
        ],
        "capture": [
            {"gpuModel": "H100", "seen": 20, "tuned": 15, "coverage": 75},
            {"gpuModel": "MI300X", "seen": 0, "tuned": 0},  # nothing seen yet: no ratio
        ],
    }  # fmt: skip
    got = samples([("team-a", "llama", status)], {"team-a/llama": ["fetch_failed"] * 2})
    real = {"gpu_model": "H100", "stand_in": "false"}
    assert got[at("tunefleet_artifact_speedup", figure="gemms", **real)] == 1.5
    assert got[at("tunefleet_artifact_speedup_low", figure="gemms", **real)] == pytest.approx(1.4)
    assert got[at("tunefleet_artifact_speedup_high", figure="gemms", **real)] == pytest.approx(1.7)
    assert got[at("tunefleet_artifact_speedup", figure="workload", **real)] == 1.2
    assert got[at("tunefleet_artifact_saved_seconds", figure="workload", **real)] == 17.5
    stand_in = {"gpu_model": "STANDIN-A", "stand_in": "true"}
    assert got[at("tunefleet_artifact_speedup", figure="gemms", **stand_in)] == 3.0
    assert (
        at("tunefleet_artifact_speedup", figure="gemms", gpu_model="STANDIN-A", stand_in="false")
        not in got
    )
    assert not [
        k for k in got if k[0] == "tunefleet_artifact_speedup" and ("gpu_model", "MI300X") in k[1]
    ]
    promoted = {
        m: got[at("tunefleet_artifact_promoted", gpu_model=m)]
        for m in ("H100", "STANDIN-A", "MI300X")
    }
    assert promoted == {"H100": 1, "STANDIN-A": 1, "MI300X": 1}
    assert got[at("tunefleet_artifact_pinned", gpu_model="STANDIN-A")] == 1
    assert got[at("tunefleet_artifact_pinned", gpu_model="H100")] == 0
    assert got[at("tunefleet_artifact_rejected", gpu_model="H100")] == 2
    assert (
        got[at("tunefleet_artifact_rejected", gpu_model="A100")] == 1
    )  # not served: still counted
    assert got[at("tunefleet_artifact_rejected", gpu_model="MI300X")] == 0
    assert at("tunefleet_artifact_promoted", gpu_model="A100") not in got
    assert got[at("tunefleet_capture_coverage_ratio", gpu_model="H100")] == 0.75
    assert at("tunefleet_capture_coverage_ratio", gpu_model="MI300X") not in got
    assert got[at("tunefleet_pods_untuned", reason="fetch_failed")] == 2


def test_a_malformed_status_is_skipped_entry_by_entry_never_the_scrape() -> None:
    bad_figures = [
        "fast",
        {**figure("gemms", 1.5), "low": 1.6},  # speedup outside its interval
        {**figure("workload", 1.5), "repetitions": True},
        {**figure("other", 1.5)},  # no figure of that name
    ]
    status = {
        "artifacts": [
            {"gpuModel": "H100", "gain": {"figures": bad_figures}, "promotion": "Passed"},
            {"gpuModel": "A100", "gain": "twice as fast", "promotion": {"verdict": "Rejected"}},
            {"gpuModel": "L4", "gain": {"figures": [figure("gemms", 1.1), figure("gemms", 9.0)]}},
            {"gpuModel": "L4", "gain": {"figures": [figure("gemms", 7.0)]}},  # a duplicate model
            {"sha256": "no model"},
            "not an entry",
        ],
        "history": "not a list",
        "capture": [{"gpuModel": "H100", "coverage": "90"}, {"coverage": 50}],
    }
    got = samples([("team-a", "llama", status), ("team-a", "empty", {})])
    speedups = {k: v for k, v in got.items() if k[0] == "tunefleet_artifact_speedup"}
    assert speedups == {
        at("tunefleet_artifact_speedup", gpu_model="L4", figure="gemms", stand_in="false"): 1.1
    }
    assert got[at("tunefleet_artifact_promoted", gpu_model="H100")] == 1  # no readable verdict
    assert got[at("tunefleet_artifact_promoted", gpu_model="A100")] == 0
    assert {k[1] for k in got if k[0] == "tunefleet_artifact_promoted"} == {
        at("", gpu_model=m)[1] for m in ("H100", "A100", "L4")
    }
    assert not [k for k in got if k[0] == "tunefleet_capture_coverage_ratio"]
    assert not [k for k in got if ("profile", "empty") in k[1]]


def test_the_exposition_of_per_profile_gauges_is_valid_prometheus_text() -> None:
    collector = metrics.IndexCollector(
        statuses=lambda: [],
        queue_depth=lambda: 0,
        profiles=lambda: [
            (
                "team-a",
                "llama",
                {"artifacts": [{"gpuModel": 'H"100', "gain": {"figures": [figure("gemms", 2.0)]}}]},
            )
        ],
    )
    metrics.REGISTRY.register(collector)
    try:
        text = generate_latest(metrics.REGISTRY).decode()
    finally:
        metrics.REGISTRY.unregister(collector)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [sample] = families["tunefleet_artifact_speedup"].samples  # the quote escaped and read back
    assert sample.labels == {"namespace": "team-a", "profile": "llama", "gpu_model": 'H"100',
                             "figure": "gemms", "stand_in": "false"}  # fmt: skip
    assert sample.value == 2.0
    parsed = set(families)
    assert {"tunefleet_artifact_speedup", "tunefleet_pods_untuned"} <= parsed


def test_the_operator_feeds_the_collector_each_profiles_status_from_its_cache() -> None:
    from tests.support.fake_kube import FakeKube
    from tunefleet.handlers.startup import Operator

    status = {"artifacts": [{"gpuModel": "H100", "gain": {"figures": [figure("gemms", 1.5)]}}]}
    body = {"apiVersion": "tunefleet.io/v1alpha1", "kind": "TuningProfile",
            "metadata": {"namespace": "team-a", "name": "metrics-feed", "uid": "u-feed"},
            "spec": {}, "status": status}  # fmt: skip
    operator = Operator(FakeKube())  # its own cache: nothing to clean up after
    operator.cache.put_profile(body)
    assert list(operator.profile_statuses()) == [("team-a", "metrics-feed", status)]
    assert operator.untuned_causes("team-a", "metrics-feed") == []


def test_per_profile_series_only_when_asked_for() -> None:
    """Series per profile grow with the fleet: the operator serves them only when configured
    to (the chart's metrics.perProfile, or its dashboard); the fleet's gauges always."""
    from dataclasses import replace

    from testbed.builders.profiles import CFG
    from testbed.builders.wrappers import make_artifact, make_profile
    from tests.support.fake_kube import FakeKube
    from tunefleet.handlers.startup import Operator

    gain = {"figures": [figure("gemms", 1.5)]}
    served = (
        make_profile("per-profile", "team-a")
        .uid("u-pp")
        .artifacts(make_artifact("H100").fields(gain=gain))
    )
    operator = Operator(FakeKube())
    operator.cache.put_profile(served.obj())

    def names(profile_metrics: bool) -> set[str]:
        config = replace(CFG, profile_metrics=profile_metrics)
        collector = operator.index_collector(config, queue_depth=lambda: 0)
        return {s.name for family in collector.collect() for s in family.samples}

    off, on = names(False), names(True)
    assert "tunefleet_profiles" in off and "tunefleet_profiles" in on
    assert not {n for n in off if n.startswith("tunefleet_artifact_")}
    assert "tunefleet_artifact_speedup" in on


def test_per_profile_metrics_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.config import Config

    assert Config.from_env().profile_metrics is False
    monkeypatch.setenv("TUNEFLEET_PROFILE_METRICS", "true")
    assert Config.from_env().profile_metrics is True


class _Listing:
    """Reflectors whose first lists end when the test says so (or fail)."""

    def __init__(self, fails: bool = False) -> None:
        import threading

        self.listed = threading.Event()
        self.fails = fails

    def wait_listed(self, timeout: float | None = None) -> bool:
        self.listed.wait(5)
        if self.fails:
            raise RuntimeError("the API server went away mid-list")
        return True


def _startup_stubs(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> Any:
    """An operator (one replica: Config() names no Lease, so both parts lead at once) and a
    stand-in controller; the node maps, the metrics server and the process's end recorded."""
    from tests.support.fake_kube import FakeKube
    from tunefleet.handlers import startup

    class Maps:
        def __init__(self, *_: Any) -> None: ...

        def start(self) -> None:
            events.append("maps")

        def lead(self) -> None:
            events.append("maps leads")

    class Controller:
        class queue:  # the controller's attribute
            @staticmethod
            def pending() -> int:
                return 0

        active = None

        def start(self) -> None:
            events.append("controller")

        def lead(self) -> None:
            events.append("controller leads")

    monkeypatch.setattr(startup, "NodeMaps", Maps)
    monkeypatch.setattr(startup.metrics, "serve", lambda port: events.append("metrics"))
    monkeypatch.setattr(startup.metrics.REGISTRY, "register", lambda c: None)
    monkeypatch.setattr(startup.os, "kill", lambda pid, sig: events.append(f"kill {sig.name}"))
    return startup.Operator(FakeKube()), Controller()


def test_the_reconciler_starts_only_once_every_kind_is_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The webhook listens while the caches fill (startup returns first); the reconciler must
    not: it would take a Job it has not listed yet for a missing one and make it again."""
    import asyncio
    import logging

    from tunefleet.config import Config

    events: list[str] = []
    operator, controller = _startup_stubs(monkeypatch, events)
    listing = _Listing()

    async def run() -> None:
        task = asyncio.create_task(
            operator._start_when_listed(
                listing,
                Config(),
                controller,
                logging.getLogger("test"),  # type: ignore[arg-type]
            )
        )
        await asyncio.sleep(0.2)
        assert events == []  # still listing: nothing reconciles, nothing leads
        listing.listed.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(run())
    assert events == ["controller", "maps", "metrics", "controller leads", "maps leads"]


def test_a_reconciler_that_cannot_start_stops_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator that admits pods but never reconciles must not go on quietly."""
    import asyncio
    import logging

    from tunefleet.config import Config

    events: list[str] = []
    operator, controller = _startup_stubs(monkeypatch, events)
    listing = _Listing(fails=True)
    listing.listed.set()
    asyncio.run(
        operator._start_when_listed(
            listing,
            Config(),
            controller,
            logging.getLogger("test"),  # type: ignore[arg-type]
        )
    )
    assert events == ["kill SIGTERM"]
