"""What an artifact buys, measured where it was tuned, and the gate that judges it (stdlib only).

Written and read here only: the tuner measures (tuner_job/measure.py) and writes a `Gain` into
the manifest's "gain" field; publish carries it into the artifact record; the operator judges it
against spec.promotion with `judge` before it serves the artifact; scripts/gpu_check.py prints it.
A workload that serves a model also reports its KV cache and decode speed (tuner_job/serving.py):
the gate rejects an artifact that costs either beyond the run's own noise, whatever it saves.

The statistics, and why:
- Runs alternate, baseline then tuned, then tuned then baseline (ABBA): a machine that warms
  up or slows down during the measurement shifts both arms alike.
- A figure is the median of the paired ratios baseline/tuned (> 1: the artifact is faster). A
  median, not a mean: one run disturbed by a neighbour moves it little.
- Its spread is a distribution-free confidence interval of that median, from order statistics
  (the binomial rule: no assumption of normal noise); with few pairs it is [min, max].
- Repetitions go on until the interval is narrow (TOLERANCE of the median) or the budget ends.
- The gate fails a figure only when even the top of its interval lies more than NOISE_FLOOR
  below the minimum gain: noise alone does not fail an artifact that is as fast as none (every
  pair's ratio would have to fall below it by chance), and a real loss does not hide behind
  one lucky run (the interval's top is an order statistic, not the best run).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .serving import Report

# What each figure times: "gemms", the recorded GEMMs (each as often as the workload ran it,
# where that is known) with the results loaded against TunableOp off; "workload", the profile's
# workload command from start to exit, with the artifact (results loaded, caches warm) against
# without (TunableOp off, caches empty): for compile caches, the first inference's saving.
FIGURES = ("gemms", "workload")
MODES = ("Eager", "CUDAGraphs")
TOLERANCE = 0.05  # stop once the interval is this narrow, relative to the median
NOISE_FLOOR = 0.02  # an interval reaching this close to the threshold never fails the gate
CONFIDENCE = 0.99  # of the median's interval: a gate that fails 1 run in 100 by chance is too many
MIN_PAIRS = 5
MAX_PAIRS = 15


@dataclass(frozen=True)
class Figure:
    name: str
    baseline_s: float  # median seconds without the artifact
    tuned_s: float  # median seconds with it
    speedup: float  # median of the paired ratios baseline/tuned
    low: float  # the median's interval
    high: float
    repetitions: int  # pairs

    @property
    def saved_s(self) -> float:
        """Seconds the artifact saves per run (the first iteration's, for the workload)."""
        return self.baseline_s - self.tuned_s

    def describe(self) -> str:
        return (
            f"{self.name} {self.speedup:.2f}x ({self.low:.2f}-{self.high:.2f}, "
            f"{self.repetitions} pairs; {self.baseline_s:.4g}s -> {self.tuned_s:.4g}s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "baselineSeconds": _round(self.baseline_s),
            "tunedSeconds": _round(self.tuned_s),
            "speedup": _round(self.speedup),
            "low": _round(self.low),
            "high": _round(self.high),
            "repetitions": self.repetitions,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Figure | None:
        """None for anything malformed: a figure is trusted only whole."""
        if not isinstance(doc, dict) or doc.get("name") not in FIGURES:
            return None
        nums = [doc.get(k) for k in ("baselineSeconds", "tunedSeconds", "speedup", "low", "high")]
        reps = doc.get("repetitions")
        if not all(_finite(v) for v in nums) or not isinstance(reps, int) or isinstance(reps, bool):
            return None
        base, tuned, speedup, low, high = (float(v) for v in nums if v is not None)
        if reps < 1 or min(base, tuned) < 0 or not 0 < low <= speedup <= high:
            return None
        return cls(str(doc["name"]), base, tuned, speedup, low, high, reps)


@dataclass(frozen=True)
class Failure:
    """A measured arm that failed with the artifact: the workload exited non-zero or hung with
    it loaded, or torch refused its results. The worst loss there is: the gate rejects it."""

    figure: str  # the figure whose arm failed: gemms or workload
    cause: str  # "exited with status 139 with the artifact", "torch did not load ..."

    def to_dict(self) -> dict[str, str]:
        return {"figure": self.figure, "cause": self.cause}

    @classmethod
    def from_dict(cls, doc: Any) -> Failure | None:
        if not isinstance(doc, dict) or doc.get("figure") not in FIGURES:
            return None
        cause = doc.get("cause")
        return cls(str(doc["figure"]), cause[:300] if isinstance(cause, str) else "")


@dataclass(frozen=True)
class Serving:
    """What a served model gets with the artifact against without, from the workload's serving
    reports (tuner_job/serving.py) of the same runs the workload figure times: the medians of
    each arm's ready seconds and KV cache tokens, how much the KV cache of the runs without it
    varied (the run's own noise), and decode speed as the paired ratio with/without (above 1:
    faster with it) with its interval."""

    pairs: int
    ready_s: tuple[float, float] | None = None  # (without, with)
    kv_tokens: tuple[int, int] | None = None
    kv_spread: float = 0.0  # (max - min) / median of the runs without it
    decode_tps: tuple[float, float] | None = None
    decode: tuple[float, float, float] | None = None  # ratio, low, high

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"pairs": self.pairs}
        if self.ready_s:
            doc["readySeconds"] = {"baseline": _round(self.ready_s[0]),
                                   "tuned": _round(self.ready_s[1])}  # fmt: skip
        if self.kv_tokens:
            doc["kvCacheTokens"] = {"baseline": self.kv_tokens[0], "tuned": self.kv_tokens[1],
                                    "baselineSpread": _round(self.kv_spread)}  # fmt: skip
        if self.decode_tps and self.decode:
            doc["decodeTokensPerSecond"] = {
                "baseline": _round(self.decode_tps[0]), "tuned": _round(self.decode_tps[1]),
                "ratio": _round(self.decode[0]), "low": _round(self.decode[1]),
                "high": _round(self.decode[2]),
            }  # fmt: skip
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> Serving | None:
        """None for anything malformed: like a figure, trusted only whole."""
        if not isinstance(doc, dict) or not _count(doc.get("pairs")):
            return None
        ready, kv, tps = (doc.get(k) for k in ("readySeconds", "kvCacheTokens",
                                               "decodeTokensPerSecond"))  # fmt: skip
        out = cls(int(doc["pairs"]))
        if ready is not None:
            pair = _pair(ready, ("baseline", "tuned"))
            if pair is None:
                return None
            out = replace(out, ready_s=pair)
        if kv is not None:
            pair = _pair(kv, ("baseline", "tuned"))
            spread: Any = kv.get("baselineSpread", 0) if isinstance(kv, dict) else None
            if pair is None or not _finite(spread) or not all(v.is_integer() for v in pair):
                return None
            out = replace(out, kv_tokens=(int(pair[0]), int(pair[1])), kv_spread=float(spread))
        if tps is not None:
            pair, ratio = _pair(tps, ("baseline", "tuned")), _pair(tps, ("ratio", "low", "high"))
            if pair is None or ratio is None or not ratio[1] <= ratio[0] <= ratio[2]:
                return None
            out = replace(out, decode_tps=pair, decode=(ratio[0], ratio[1], ratio[2]))
        return out

    def kv_loss(self, noise_floor: float = NOISE_FLOOR) -> str:
        """Why the artifact costs KV cache beyond the run's noise, or ""."""
        if not self.kv_tokens:
            return ""
        without, with_it = self.kv_tokens
        allowed = max(self.kv_spread, noise_floor)
        if with_it >= without * (1 - allowed):
            return ""
        return (
            f"the KV cache holds {with_it:,} tokens with the artifact against {without:,} "
            f"without ({(with_it / without - 1) * 100:.1f}%, beyond the {allowed * 100:.1f}% "
            f"the runs without it vary by, over {self.pairs} pairs)"
        )

    def decode_loss(self, noise_floor: float = NOISE_FLOOR) -> str:
        """Why the artifact slows decoding beyond the interval's noise, or ""."""
        if not self.decode or not self.decode_tps:
            return ""
        ratio, low, high = self.decode
        if high >= 1 - noise_floor:
            return ""
        return (
            f"decoding runs at {self.decode_tps[1]:.4g} tokens/s with the artifact against "
            f"{self.decode_tps[0]:.4g} without: {ratio:.2f}x ({low:.2f}-{high:.2f} over "
            f"{self.pairs} pairs)"
        )

    def describe(self) -> str:
        parts = []
        if self.kv_tokens:
            parts.append(f"KV cache {self.kv_tokens[0]:,} -> {self.kv_tokens[1]:,} tokens")
        if self.decode and self.decode_tps:
            parts.append(
                f"decode {self.decode_tps[0]:.4g} -> {self.decode_tps[1]:.4g} tokens/s "
                f"({self.decode[0]:.2f}x, {self.decode[1]:.2f}-{self.decode[2]:.2f})"
            )
        if self.ready_s:
            parts.append(f"ready {self.ready_s[0]:.4g}s -> {self.ready_s[1]:.4g}s")
        return ", ".join(parts)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _pair(doc: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(doc, dict) or not all(_finite(doc.get(k)) for k in keys):
        return None
    values = tuple(float(doc[k]) for k in keys)
    return values if min(values) > 0 else None


def serving(pairs: Sequence[tuple[Report, Report]]) -> Serving | None:
    """The Serving of the measured pairs (without, with); None when no run reported."""
    if not pairs:
        return None
    base, tuned = [b for b, _ in pairs], [t for _, t in pairs]
    out = Serving(len(pairs))

    def medians(values: list[float | None], others: list[float | None]) -> Any:
        a, b = [v for v in values if v], [v for v in others if v]
        return (statistics.median(a), statistics.median(b)) if a and b else None

    ready = medians([r.ready_s for r in base], [r.ready_s for r in tuned])
    kv = medians([r.kv_cache_tokens for r in base], [r.kv_cache_tokens for r in tuned])
    if ready:
        out = replace(out, ready_s=ready)
    if kv:
        kvs = [float(r.kv_cache_tokens) for r in base if r.kv_cache_tokens]
        spread = (max(kvs) - min(kvs)) / kv[0]
        out = replace(out, kv_tokens=(round(kv[0]), round(kv[1])), kv_spread=spread)
    ratios = [t.decode_tps / b.decode_tps for b, t in pairs if b.decode_tps and t.decode_tps]
    tps = medians([r.decode_tps for r in base], [r.decode_tps for r in tuned])
    if ratios and tps:
        low, high = median_interval(ratios)
        out = replace(out, decode_tps=tps, decode=(statistics.median(ratios), low, high))
    return out if out.ready_s or out.kv_tokens or out.decode else None


@dataclass(frozen=True)
class Gain:
    """An artifact's figures. stand_in: measured on the stand-in torch, whose timings are a
    knob's (FAKE_TORCH_GEMM_SLEEP, FAKE_TORCH_TUNED_SPEEDUP), never a real gain."""

    figures: tuple[Figure, ...] = ()
    stand_in: bool = False
    mode: str = "Eager"
    note: str = ""  # why a figure is missing (no GPU, the budget ended, ...)
    failed: Failure | None = None  # an arm with the artifact failed: rejected, whatever else
    # A served model's capacity and speed with and without it (workloads that report them).
    serving: Serving | None = None

    def figure(self, name: str) -> Figure | None:
        return next((f for f in self.figures if f.name == name), None)

    def headline(self) -> Figure | None:
        """The figure people are shown first: the workload's, end to end, else the GEMMs'."""
        return self.figure("workload") or self.figure("gemms")

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"figures": [f.to_dict() for f in self.figures], "mode": self.mode}
        if self.stand_in:
            doc["standIn"] = True
        if self.note:
            doc["note"] = self.note
        if self.failed is not None:
            doc["failed"] = self.failed.to_dict()
        if self.serving is not None:
            doc["serving"] = self.serving.to_dict()
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> Gain | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("figures"), list):
            return None
        figures = tuple(f for f in map(Figure.from_dict, doc["figures"]) if f is not None)
        mode = doc.get("mode") if doc.get("mode") in MODES else "Eager"
        note = doc.get("note")
        note = note[:300] if isinstance(note, str) else ""
        # A "failed" that does not parse still fails: a failure is never read as a pass.
        failed = Failure.from_dict(doc.get("failed")) if "failed" in doc else None
        if "failed" in doc and failed is None:
            failed = Failure("workload", "an unreadable failure record")
        served = Serving.from_dict(doc.get("serving"))
        return cls(figures, doc.get("standIn") is True, str(mode), note, failed, served)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _round(v: float) -> float:
    return float(f"{v:.6g}")


# --- statistics ------------------------------------------------------------------------------


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free interval for the median of `values`: the k-th smallest and largest,
    k the largest order whose binomial tail stays within (1 - confidence) / 2; [min, max]
    when there are too few values for that confidence."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("no values")
    alpha = (1 - confidence) / 2
    k, tail = 0, 0.0
    while k < n // 2:
        tail += math.comb(n, k) / 2**n  # P(fewer than k+1 values below the median)
        if tail > alpha:
            break
        k += 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


def paired(name: str, baseline: Sequence[float], tuned: Sequence[float]) -> Figure:
    """The figure of paired runs (baseline[i] and tuned[i] ran back to back)."""
    if len(baseline) != len(tuned) or not baseline:
        raise ValueError("paired runs need as many baseline as tuned timings, at least one")
    if min(*baseline, *tuned) <= 0:
        raise ValueError("a timing of 0 s or less is not a measurement")
    ratios = [b / t for b, t in zip(baseline, tuned, strict=True)]
    low, high = median_interval(ratios)
    return Figure(
        name,
        statistics.median(baseline),
        statistics.median(tuned),
        statistics.median(ratios),
        low,
        high,
        len(ratios),
    )


def settled(figure: Figure, tolerance: float = TOLERANCE) -> bool:
    return (figure.high - figure.low) <= tolerance * figure.speedup


@dataclass
class Measurement:
    """Runs both arms in ABBA pairs until the figure settles, MAX_PAIRS, or the budget (a pair
    is started only when the last one's time still fits)."""

    name: str
    baseline: Callable[[], float]  # one run without the artifact: its seconds
    tuned: Callable[[], float]
    budget_s: float
    min_pairs: int = MIN_PAIRS
    max_pairs: int = MAX_PAIRS
    clock: Callable[[], float] = time.monotonic
    runs: list[tuple[float, float]] = field(default_factory=list)

    def run(self) -> Figure | None:
        """The figure, or None when not even one pair fit the budget."""
        start = self.clock()
        pair_s = 0.0
        while len(self.runs) < self.max_pairs:
            left = self.budget_s - (self.clock() - start)
            if left < pair_s or left <= 0:
                break
            t0 = self.clock()
            if len(self.runs) % 2 == 0:
                b = self.baseline()
                t = self.tuned()
            else:
                t = self.tuned()
                b = self.baseline()
            pair_s = self.clock() - t0
            self.runs.append((b, t))
            if len(self.runs) >= self.min_pairs and settled(self.figure()):
                break
        return self.figure() if self.runs else None

    def figure(self) -> Figure:
        return paired(self.name, [b for b, _ in self.runs], [t for _, t in self.runs])


# --- the gate ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str
    failed: str = ""  # the figure that failed


def judge(gain: Gain | None, min_gain: float = 0.0, noise_floor: float = NOISE_FLOOR) -> Verdict:
    """Whether an artifact may be served under spec.promotion.minGain (a fraction: 0 is "not
    slower than without", 0.05 "at least 5% faster"). An arm that failed with the artifact
    fails it, whatever the figures say; every figure must pass; an artifact without figures
    passes, said as unmeasured (artifacts from before measuring, a profile without a workload
    or shapes to time, or a run whose budget left no time for it)."""
    if gain is not None and gain.failed is not None:
        label = " (stand-in)" if gain.stand_in else ""
        return Verdict(
            False,
            f"{gain.failed.figure} failed with the artifact: {gain.failed.cause}{label}",
            gain.failed.figure,
        )
    lost = (gain.serving.kv_loss() or gain.serving.decode_loss()) if (
        gain is not None and gain.serving is not None) else ""  # fmt: skip
    if lost:
        return Verdict(False, lost, "serving")
    if gain is None or not gain.figures:
        why = f": {gain.note}" if gain is not None and gain.note else ""
        return Verdict(True, f"not measured{why}")
    need = 1.0 + min_gain
    shown = "; ".join(f.describe() for f in gain.figures)
    label = " (stand-in figures, not a real gain)" if gain.stand_in else ""
    for f in gain.figures:
        if f.high < need * (1 - noise_floor):
            loss = (1 - f.speedup / need) * 100
            return Verdict(
                False,
                f"{f.name} {f.speedup:.2f}x ({f.low:.2f}-{f.high:.2f} over {f.repetitions} "
                f"pairs) is {loss:.1f}% below the {need:.2f}x spec.promotion asks{label}",
                f.name,
            )
    served = f"; {gain.serving.describe()}" if gain.serving is not None else ""
    return Verdict(True, f"passed: {shown}{served}{label}")
