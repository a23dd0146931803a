"""The Grafana dashboard the chart ships (charts/tunefleet/dashboards/tunefleet.json): rendered
only when asked, labelled for Grafana's dashboard sidecar, and every PromQL expression in it
reads metrics and labels the operator exports, as collected from tunefleet.metrics.REGISTRY,
so renaming a metric or a label without the dashboard fails here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from testbed.builders.wrappers import make_artifact, make_profile
from tests.support.chart import CHART, rendered, template
from tunefleet import metrics

DASHBOARD = CHART / "dashboards" / "tunefleet.json"
NAME = "tf-tunefleet-dashboard"

# PromQL's functions and aggregations the dashboard may call (a word before "(" not here is
# an error of the dashboard or of this tokenizer, not silently a metric).
FUNCTIONS = frozenset({
    "sum", "max", "min", "avg", "count", "topk", "bottomk", "quantile", "group", "stddev",
    "rate", "irate", "increase", "delta", "deriv", "histogram_quantile", "vector", "scalar",
    "abs", "clamp_min", "clamp_max", "max_over_time", "min_over_time", "avg_over_time",
    "last_over_time", "label_replace", "time", "absent", "sort", "sort_desc", "changes",
})  # fmt: skip
KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset",
})  # fmt: skip
WORD = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


# A profile whose status has every per-profile family in it: figures (real and stand-in), a pin,
# a rejection in history, capture coverage.
TIMES = {"baselineSeconds": 2.0, "tunedSeconds": 1.0, "repetitions": 5}
GEMMS = {**TIMES, "name": "gemms", "speedup": 1.4, "low": 1.4 - 0.1, "high": 1.4 + 0.1}
WORKLOAD = {**TIMES, "name": "workload", "speedup": 1.2, "low": 1.2 - 0.1, "high": 1.2 + 0.1}
STAND_IN = {**TIMES, "name": "gemms", "speedup": 2.0, "low": 2.0 - 0.1, "high": 2.0 + 0.1}
FAKE = (
    make_profile()
    .artifacts(
        make_artifact("H100", "a" * 64)
        .without("uri")
        .fields(delivery="ConfigMap", gain={"mode": "Eager", "figures": [GEMMS, WORKLOAD]})
        .verdict("Passed", "passed"),
        make_artifact("STANDIN-A", "b" * 64)
        .without("uri")
        .fields(gain={"mode": "Eager", "standIn": True, "figures": [STAND_IN]})
        .verdict("Pinned", "pinned")
        .fields(pinned={"reason": "rollback", "at": "2026-01-01T00:00:00Z"}),
    )
    .history(make_artifact("H100", "c" * 64).without("uri").verdict("Rejected", "slower"))
    .status(capture=[{"gpuModel": "H100", "seen": 10, "tuned": 9, "coverage": 90}])
)


def exported() -> dict[str, set[str]]:
    """Each sample name the operator exports (counters' _total, histograms' _bucket, _sum and
    _count included) with its label names: collected from the registry, with a collector fed
    a fake profile, and one probe child of each labelled metric (a labelled metric nothing
    has counted yet has no samples to read its labels from), taken away afterwards."""
    collector = metrics.IndexCollector(
        statuses=lambda: [{"phase": "Ready"}],
        queue_depth=lambda: 0,
        profiles=lambda: [("team-a", "llama", FAKE.obj()["status"])],
        untuned=lambda ns, name: ["fetch_failed"],
    )
    wrappers = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    probes = [(m, ("probe",) * len(m._labelnames)) for m in wrappers if m._labelnames]
    for m, values in probes:
        m.labels(*values)
    metrics.REGISTRY.register(collector)
    try:
        found: dict[str, set[str]] = {}
        for family in metrics.REGISTRY.collect():
            for sample in family.samples:
                found.setdefault(sample.name, set()).update(sample.labels)
        return found
    finally:
        metrics.REGISTRY.unregister(collector)
        for m, values in probes:
            m.remove(*values)


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels") or []  # a collapsed row keeps its panels inside


def queries(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, PromQL, the target) of every panel target and query variable."""
    for panel in panels(doc):
        for target in panel.get("targets") or []:
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"], target
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            yield f"variable {var['name']}", query, {}


class Parsed:
    """What one PromQL expression reads: metric names, the label names of each selector,
    the labels of its grouping clauses."""

    def __init__(self, expr: str) -> None:
        self.selectors: list[tuple[str, set[str]]] = []
        self.grouping: list[set[str]] = []  # by / without: what an aggregation keeps
        self.matching: list[set[str]] = []  # on / ignoring: what a binary operation matches
        self.functions: set[str] = set()
        text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: label values, never names
        text = re.sub(r"\[[^\]]*\]", " ", text)  # range durations, $__rate_interval
        for match in re.finditer(rf"({WORD})?\s*\{{([^}}]*)\}}", text):
            names = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", match[2]))
            self.selectors.append((match[1] or "", names))
        text = re.sub(r"\{[^}]*\}", " ", text)
        clause = r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
        for match in re.finditer(clause, text):
            labels = {w.strip() for w in match[2].split(",") if w.strip()}
            if match[1] in ("by", "without"):
                self.grouping.append(labels)
            elif match[1] in ("on", "ignoring"):
                self.matching.append(labels)
            # group_left/right's labels come from the other side: not checked here.
        text = re.sub(clause, " ", text)
        text = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", " ", text)
        for match in re.finditer(rf"({WORD})(\s*\()?", text):
            word, call = match[1], match[2]
            if call:
                self.functions.add(word)
            elif word not in KEYWORDS and (word, set()) not in self.selectors:
                self.selectors.append((word, set()))

    @property
    def metrics(self) -> set[str]:
        return {name for name, _ in self.selectors}


def parse_label_values(query: str) -> tuple[str, str]:
    """label_values(<selector>, <label>) of a Grafana query variable."""
    match = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)", query.strip())
    assert match, f"not a label_values() query: {query}"
    return match[1], match[2]


def check(where: str, expr: str, target: dict[str, Any], known: dict[str, set[str]]) -> list[str]:
    bad = []
    label = None
    if expr.startswith("label_values("):
        expr, label = parse_label_values(expr)
    parsed = Parsed(expr)
    bad += [f"{where}: unknown function {f}()" for f in parsed.functions - FUNCTIONS]
    if not parsed.metrics:
        bad.append(f"{where}: reads no metric: {expr}")
    for name, labels in parsed.selectors:
        if name not in known:
            bad.append(f"{where}: {name or 'a selector without a name'} is not exported")
            continue
        bad += [f"{where}: {name} has no label {x}" for x in sorted(labels - known[name])]
        for group in parsed.grouping + parsed.matching:
            bad += [f"{where}: {name} has no label {x} (by)" for x in sorted(group - known[name])]
        if label is not None and label not in known[name]:
            bad.append(f"{where}: {name} has no label {label} (label_values)")
    # What a legend names must be in the result: kept by every grouping, or on the metric.
    legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat") or ""))
    for group in parsed.grouping or [
        set.intersection(*(known.get(m, set()) for m in parsed.metrics))
    ]:
        bad += [f"{where}: the legend's {x} is not in the result" for x in sorted(legend - group)]
    return bad


def test_the_dashboard_is_rendered_only_when_asked() -> None:
    assert not [d for d in rendered() if d["metadata"]["name"] == NAME]
    [cm] = [d for d in rendered("dashboard.enabled=true") if d["metadata"]["name"] == NAME]
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["namespace"] == "tf-system"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "tf"
    assert "annotations" not in cm["metadata"]
    assert list(cm["data"]) == ["tunefleet.json"]
    assert json.loads(cm["data"]["tunefleet.json"]) == dashboard()


def test_the_sidecar_label_namespace_and_folder_are_the_users() -> None:
    [cm] = [
        d
        for d in rendered(
            "dashboard.enabled=true",
            "dashboard.namespace=monitoring",
            "dashboard.label=grafana.example.com/dashboard",
            "dashboard.labelValue=1",
            "dashboard.labels.team=ml",
            "dashboard.annotations.grafana_folder=tunefleet",
        )
        if d["metadata"]["name"] == NAME
    ]
    meta = cm["metadata"]
    assert meta["namespace"] == "monitoring"
    assert meta["labels"]["grafana.example.com/dashboard"] == "1"  # a string, as labels are
    assert "grafana_dashboard" not in meta["labels"]
    assert meta["labels"]["team"] == "ml"
    assert meta["annotations"] == {"grafana_folder": "tunefleet"}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("dashboard.enabeld=true", "enabeld"),
        ("dashboard.namespace=Monitoring", "/dashboard/namespace"),
        ("dashboard.label=bad label", "/dashboard/label"),
    ],
)
def test_a_bad_dashboard_value_is_refused_naming_it(value: str, named: str) -> None:
    out = template(value)
    assert out.returncode != 0 and named in out.stderr, out.stderr


def test_the_tokenizer_reads_what_a_query_reads() -> None:
    parsed = Parsed(
        'histogram_quantile(0.99, sum by (le) (rate(tunefleet_x_bucket{a="b}", c=~"$d"}[5m])))'
        " / on(job) tunefleet_y or vector(1e3)"
    )
    assert parsed.metrics == {"tunefleet_x_bucket", "tunefleet_y"}
    assert ("tunefleet_x_bucket", {"a", "c"}) in parsed.selectors
    assert parsed.grouping == [{"le"}]
    assert parsed.matching == [{"job"}]
    assert parsed.functions == {"histogram_quantile", "sum", "rate", "vector"}


def test_every_query_reads_metrics_and_labels_the_operator_exports() -> None:
    known = exported()
    assert "tunefleet_artifact_speedup" in known  # the fake profile reached the collector
    bad = []
    for where, expr, target in queries(dashboard()):
        bad += check(where, expr, target, known)
    assert not bad, "\n".join(bad)


def test_a_renamed_metric_or_label_would_fail() -> None:
    known = exported()
    expr = 'max by (namespace) (tunefleet_artifact_speedup{profile=~"$profile"})'
    assert not check("ok", expr, {}, known)
    renamed = {k: v for k, v in known.items() if k != "tunefleet_artifact_speedup"}
    assert check("renamed", expr, {}, renamed)
    relabelled = {
        **known,
        "tunefleet_artifact_speedup": known["tunefleet_artifact_speedup"] - {"profile"},
    }
    assert check("relabelled", expr, {}, relabelled)


def test_the_dashboard_shows_every_per_profile_metric_and_tells_stand_in_figures() -> None:
    used: set[str] = set()
    for where, expr, target in queries(dashboard()):
        parsed = Parsed(expr)
        used |= parsed.metrics
        if not any(
            m.startswith(("tunefleet_artifact_speedup", "tunefleet_artifact_saved"))
            for m in parsed.metrics
        ):
            continue
        # A figure is shown with its stand_in label: in the legend, or as a table's column.
        assert all("stand_in" in g for g in parsed.grouping), where
        if target.get("format") != "table":
            assert "{{stand_in}}" in target["legendFormat"], where
    per_profile = {
        "tunefleet_artifact_speedup", "tunefleet_artifact_speedup_low",
        "tunefleet_artifact_speedup_high", "tunefleet_artifact_saved_seconds",
        "tunefleet_artifact_promoted", "tunefleet_artifact_rejected", "tunefleet_artifact_pinned",
        "tunefleet_capture_coverage_ratio", "tunefleet_pods_untuned",
        "tunefleet_pods_served_total",
    }  # fmt: skip
    assert per_profile <= used, per_profile - used
    names = {v["name"] for v in dashboard()["templating"]["list"]}
    assert {"namespace", "profile"} <= names
