"""`kubectl tunefleet diff A B`: what changed between two results files (pure functions).

A GEMM is an (OpSig, ParamSig) pair. Between A and B it is added, removed, changed (another
solution won), retimed (same solution, another time: tuning noise, counted but not listed in
text) or unchanged. Validators are compared too: TunableOp loads a file only where every one
matches the running process, so a validator difference means the two serve different stacks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from tuner_job.gain import Gain
from tuner_job.results import ResultRow, ResultsFile, is_placeholder

from .report_parts import speedups

_MODEL_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True)
class Ref:
    """One side of a diff, as the user named it."""

    kind: str  # "s3" or "pvc" (an artifact URI), "local" (a directory or file), "profile"
    text: str
    namespace: str | None = None  # profile refs: None = the current namespace
    name: str = ""
    gpu_model: str | None = None


def parse_ref(text: str) -> Ref:
    """s3://.../<sha256>, a local path, or [namespace/]profile[:gpuModel].

    A local path is one that starts with /, ./, ../ or ~, a file:// URI, or any existing path:
    name ./x for a local directory x that shadows a profile x."""
    for scheme in ("s3", "pvc"):
        if text.startswith(f"{scheme}://"):
            return Ref(scheme, text)
    if text.startswith(("/", "./", "../", "~", "file://")) or os.path.exists(text):
        return Ref("local", text)
    head, _, model = text.partition(":")
    ns, _, name = head.rpartition("/")
    if (
        not name
        or not _NAME_RE.match(name)
        or (ns and not _NAME_RE.match(ns))
        or (model and not _MODEL_RE.match(model))
        or (":" in text and not model)
    ):
        raise ValueError(
            f"{text!r} is neither an artifact (s3://.../<sha256>), an existing local path, nor a "
            "profile reference [namespace/]profile[:gpuModel]"
        )
    return Ref("profile", text, ns or None, name, model or None)


def side_gain(side: dict[str, Any], profile: dict[str, Any] | None) -> dict[str, Any]:
    """What the profile's status says the side's artifact buys (its gain and the gate's
    verdict), found by GPU model and SHA-256 among the served artifacts and the history; {}
    when the profile keeps no such entry (gone, or replaced since it was read)."""
    st = (profile or {}).get("status") or {}
    for e in [*(st.get("artifacts") or []), *(st.get("history") or [])]:
        if not isinstance(e, dict) or e.get("sha256") != side.get("sha256"):
            continue
        if side.get("gpuModel") and e.get("gpuModel") != side.get("gpuModel"):
            continue
        return {k: e[k] for k in ("gain", "promotion") if k in e}
    return {}


def _entry(row: ResultRow) -> dict[str, Any]:
    return {"op": row.op, "params": row.params, "solution": row.solution, "ms": row.ms}


def _change(before: ResultRow, after: ResultRow) -> dict[str, Any]:
    a, b = before.ms, after.ms
    measured = not is_placeholder(before) and not is_placeholder(after)
    delta = (b - a) if measured and a is not None and b is not None else None
    ratio = (b / a) if delta is not None and a and b is not None else None
    return {
        "op": before.op,
        "params": before.params,
        "before": {"solution": before.solution, "ms": a},
        "after": {"solution": after.solution, "ms": b},
        "deltaMs": delta,
        "ratio": ratio,
    }


def diff_results(a: ResultsFile, b: ResultsFile) -> dict[str, Any]:
    """The difference from A to B, as plain data (the `-o json` form's body)."""
    rows_a = {r.key: r for r in a.rows}
    rows_b = {r.key: r for r in b.rows}
    added = [_entry(rows_b[k]) for k in sorted(rows_b.keys() - rows_a.keys())]
    removed = [_entry(rows_a[k]) for k in sorted(rows_a.keys() - rows_b.keys())]
    changed, retimed = [], []
    unchanged = 0
    before_total = after_total = 0.0
    timed = 0
    for k in sorted(rows_a.keys() & rows_b.keys()):
        ra, rb = rows_a[k], rows_b[k]
        if ra.ms is not None and rb.ms is not None:
            before_total += ra.ms
            after_total += rb.ms
            timed += 1
        if ra.solution != rb.solution:
            changed.append(_change(ra, rb))
        elif ra.ms_text != rb.ms_text:
            retimed.append(_change(ra, rb))
        else:
            unchanged += 1
    validators = [
        {"key": key, "before": a.validators.get(key), "after": b.validators.get(key)}
        for key in sorted(a.validators.keys() | b.validators.keys())
        if a.validators.get(key) != b.validators.get(key)
    ]
    return {
        "validators": validators,
        "added": added,
        "removed": removed,
        "changed": changed,
        "retimed": retimed,
        "summary": {
            "added": len(added),
            "removed": len(removed),
            "changed": len(changed),
            "retimed": len(retimed),
            "unchanged": unchanged,
            "validators": len(validators),
            "common": len(rows_a.keys() & rows_b.keys()),
            "commonTimed": timed,
            "commonMsBefore": before_total,
            "commonMsAfter": after_total,
            "identical": not (added or removed or changed or retimed or validators),
        },
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def _shown(value: str | None) -> str:
    return "(absent)" if value is None else value


def _side(label: str, side: dict[str, Any]) -> str:
    about = [str(side[k]) for k in ("gpuModel",) if side.get(k)]
    about.append(f"{side.get('gemms', '?')} GEMMs")
    if side.get("sha256"):
        about.append(f"sha256 {str(side['sha256'])[:12]}")
    return f"{label} {side['source']} ({', '.join(about)})"


def _figure_lines(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Each side's figures, where a profile's status holds them; nothing when neither does."""
    gains = [Gain.from_dict(a.get("gain")), Gain.from_dict(b.get("gain"))]
    if gains == [None, None]:
        return []
    lines = ["Figures (measured where each was tuned; above 1x is faster than without):"]
    for mark, gain in zip(("---", "+++"), gains, strict=True):
        lines.append(f"  {mark} {speedups(gain) if gain is not None else '(none recorded)'}")
    return lines


def format_diff(report: dict[str, Any]) -> str:
    """report: {"a": side, "b": side, **diff_results(...)}; side: source, gemms, sha256, and
    for a profile's artifact its gain and promotion (side_gain)."""
    lines = [_side("---", report["a"]), _side("+++", report["b"])]
    lines += _figure_lines(report["a"], report["b"])
    if report["validators"]:
        lines.append(
            f"Validators ({len(report['validators'])} differ: TunableOp loads a file only where "
            "every validator matches, so these serve different stacks):"
        )
        for v in report["validators"]:
            lines.append(f"  ~ {v['key']}: {_shown(v['before'])} -> {_shown(v['after'])}")
    if report["changed"]:
        lines.append(f"Changed ({len(report['changed'])}): another solution won")
        for c in report["changed"]:
            b, a = c["before"], c["after"]
            delta = "" if c["deltaMs"] is None else f"{c['deltaMs']:+.4g} ms"
            ratio = "" if c["ratio"] is None else f"x{c['ratio']:.2f}"
            change = ", ".join(p for p in (delta, ratio) if p) or "no time to compare"
            lines.append(f"  ~ {c['op']} {c['params']}")
            lines.append(
                f"      {b['solution']} {_ms(b['ms'])} -> {a['solution']} {_ms(a['ms'])} ({change})"
            )
    for key, mark, title in (("added", "+", "Added"), ("removed", "-", "Removed")):
        if report[key]:
            lines.append(f"{title} ({len(report[key])}):")
            for e in report[key]:
                lines.append(f"  {mark} {e['op']} {e['params']}  {e['solution']} {_ms(e['ms'])}")
    s = report["summary"]
    summary = (
        f"Summary: {s['changed']} changed, {s['added']} added, {s['removed']} removed, "
        f"{s['unchanged'] + s['retimed']} same solution ({s['retimed']} with another time), "
        f"{s['validators']} validator(s) differ"
    )
    if s["commonTimed"]:
        before, after = s["commonMsBefore"], s["commonMsAfter"]
        ratio = f", x{after / before:.2f}" if before else ""
        summary += (
            f"; the {s['commonTimed']} GEMMs in both: {before:.4g} ms -> {after:.4g} ms{ratio}"
        )
    if s["identical"]:
        summary += " (identical)"
    lines.append(summary)
    return "\n".join(lines) + "\n"
