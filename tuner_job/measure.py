"""Measure what the artifact just made buys, on the GPU (and in the image) it was made for.

Two figures (tuner_job/gain.py has the statistics and the gate):
- "gemms": workload.shapes' GEMMs in one child process with torch, TunableOp switched off
  and on (the results loaded, tuning off) by its Python API between passes, so both arms share
  one CUDA context and one set of operands. In CUDAGraphs mode each arm's GEMMs are captured
  once and replayed, as a server that captures its graphs runs them (TunableOp's per-call
  lookup is then paid at capture only).
- "workload": the profile's workload command, start to exit, with the artifact (results
  loaded, TunableOp on, tuning off; each cache a fresh copy of what was packed) against
  without (TunableOp off; each cache an empty directory). For compile caches this is the
  first inference's saving; each run gets fresh directories, so no run warms the next.

Where the image's torch is the stand-in (its version says "standin"), the timings are its knob
(FAKE_TORCH_GEMM_SLEEP, FAKE_TORCH_TUNED_SPEEDUP) and the figures say standIn: never a gain.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import caches as cc
from . import serving as sv
from .config import Shape, TuningConfig
from .gain import Failure, Figure, Gain, Measurement, serving
from .gpu import TunerError
from .output import RESULTS_NAME
from .record import WorkloadExited, WorkloadTimedOut, run_workload, shape_gemm

Log = Callable[[str], None]
# TunableOp's own variables win over its Python API: the GEMM child runs without them.
_TUNABLEOP_PREFIX = "PYTORCH_TUNABLEOP_"
CHILD_PASS_SECONDS = 0.2  # a pass of the GEMM child times at least this long
# The stand-in torch's timing knob (tests/unit/data/fake_torch): without it there is no timing.
STAND_IN_KNOB = "FAKE_TORCH_GEMM_SLEEP"


def _log(msg: str) -> None:
    print(f"tuner_job: {msg}", file=sys.stderr, flush=True)


def is_stand_in(torch_version: str) -> bool:
    return "standin" in torch_version


def measure(
    cfg: TuningConfig,
    out: Path,
    packed: Sequence[cc.Packed],
    torch_version: str,
    log: Log = _log,
) -> Gain | None:
    """The artifact's figures, within spec.promotion's budget; None when not asked for."""
    p = cfg.promotion
    if not p.measure:
        return None
    stand_in = is_stand_in(torch_version)
    results = out / RESULTS_NAME if cfg.tunableop else None
    if results is not None and not results.is_file():
        results = None
    if stand_in and not os.environ.get(STAND_IN_KNOB):
        # It computes nothing: both arms would time Python overhead, not kernels.
        return Gain(
            (), True, p.mode, f"the stand-in torch computes nothing ({STAND_IN_KNOB} unset)"
        )
    if p.budget_seconds <= 0:
        return Gain((), stand_in, p.mode, "no time left to measure before the Job's deadline")
    deadline = time.monotonic() + p.budget_seconds
    figures: list[Figure] = []
    notes: list[str] = []
    failed: Failure | None = None
    served = None
    work = Path(tempfile.mkdtemp(prefix="tunefleet-measure-"))
    try:
        if results is not None and cfg.shapes:
            share = p.budget_seconds / 2 if cfg.command else p.budget_seconds
            got = _gemms(cfg, results, work, min(share, deadline - time.monotonic()), log)
            figures += [got] if isinstance(got, Figure) else []
            notes += [got] if isinstance(got, str) else []
            failed = got if isinstance(got, Failure) else None
        if cfg.command and failed is None:
            left = deadline - time.monotonic()
            arms = _Arms(cfg, results, packed, out)
            got = _workload(arms, work, left, log)
            figures += [got] if isinstance(got, Figure) else []
            notes += [got] if isinstance(got, str) else []
            failed = got if isinstance(got, Failure) else None
            failed = failed or _loaded_empty(arms.reports)
            served = serving(arms.pairs())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gain = Gain(tuple(figures), stand_in, p.mode, "; ".join(notes), failed, served)
    for f in figures:
        log(f"measured {f.describe()}" + (" [stand-in timings]" if stand_in else ""))
    if served is not None:
        log(f"served with and without the artifact: {served.describe()}")
    if failed is not None:
        log(f"{failed.figure} failed with the artifact: {failed.cause} (the gate rejects it)")
    return gain


# --- the workload, start to exit ----------------------------------------------------------------


def _results_env(results: Path, gpus: int, where: Path) -> dict[str, str]:
    """TunableOp on, tuning off, the results copied once per device ordinal."""
    where.mkdir(parents=True, exist_ok=True)
    for i in range(max(gpus, 1)):
        shutil.copyfile(results, where / f"tunableop_results{i}.csv")
    return {
        "PYTORCH_TUNABLEOP_ENABLED": "1",
        "PYTORCH_TUNABLEOP_TUNING": "0",
        "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
        "PYTORCH_TUNABLEOP_FILENAME": str(where / "tunableop_results%d.csv"),
    }


class _Arms:
    """Fresh directories for every run: a run never warms the next."""

    def __init__(
        self, cfg: TuningConfig, results: Path | None, packed: Sequence[cc.Packed], out: Path
    ) -> None:
        self.cfg, self.results, self.packed, self.out = cfg, results, packed, out
        self.runs = 0
        # Each finished run's serving report (tuner_job/serving.py), by arm, in run order.
        self.reports: dict[bool, list[sv.Report]] = {False: [], True: []}

    def report_path(self, work: Path) -> Path:
        return work / f"report{self.runs}.json"

    def take_report(self, work: Path, tuned: bool) -> None:
        """The serving report the run just finished wrote, if it wrote one."""
        try:
            got = sv.parse(self.report_path(work).read_text(errors="replace"))
        except OSError:
            return
        if got is not None:
            self.reports[tuned].append(got)

    def pairs(self) -> list[tuple[sv.Report, sv.Report]]:
        """Reports of runs without and with the artifact, paired in the order they ran."""
        return list(zip(self.reports[False], self.reports[True], strict=False))

    def env(self, work: Path, tuned: bool) -> dict[str, str]:
        self.runs += 1
        root = work / f"run{self.runs}"
        env: dict[str, str] = {sv.REPORT_ENV: str(self.report_path(work))}
        if self.results is not None:
            if tuned:
                env.update(_results_env(self.results, self.cfg.gpus, root / "results"))
            else:
                env["PYTORCH_TUNABLEOP_ENABLED"] = "0"
        caches = root / "caches"
        env.update(cc.prepare(self.cfg.caches, caches))
        if tuned:
            for entry in self.packed:
                spec = next(s for s in self.cfg.caches if s.name == entry.name)
                target = caches / spec.name
                shutil.rmtree(target, ignore_errors=True)
                cc.unpack_file(self.out / entry.payload, target, source=entry.payload)
        return env


class _ArtifactFailed(Exception):
    """The arm with the artifact exited non-zero, or hung, where the one without ran."""


# A run with the artifact stopped after this many times the slowest run without it is a hang:
# no noise makes a run twice as slow, and minGain (>= 0) rejects any run slower than without.
# One stopped sooner is the budget ending mid-pair (the last pair of a measurement, or a
# baseline that took most of it), not a loss to reject.
HANG_FACTOR = 2.0


def _workload(arms: _Arms, work: Path, budget_s: float, log: Log) -> Figure | Failure | str:
    cfg = arms.cfg
    if arms.results is None and not arms.packed:
        return "workload: nothing to load"
    # A run that hangs is stopped where the budget ends, not a whole budget later: the builder
    # sized the budget to end before the Job's deadline.
    deadline = time.monotonic() + budget_s

    def timed(tuned: bool) -> Callable[[], float]:
        def run() -> float:
            env = arms.env(work, tuned)
            started = time.monotonic()
            left = max(deadline - started, 1.0)
            try:
                run_workload(cfg.workload_argv, env, left, log=lambda m: None)
            except WorkloadExited as exc:
                # Without the artifact first in every first pair: a workload that fails
                # either way never gets here with tuned set before a baseline ran.
                if tuned and baseline_s:
                    raise _ArtifactFailed(_exited(exc.status)) from None
                raise
            except WorkloadTimedOut as exc:
                raise _timed_out(tuned, exc.timeout_s, baseline_s) from None
            finally:
                shutil.rmtree(work / f"run{arms.runs}", ignore_errors=True)
            took = time.monotonic() - started
            arms.take_report(work, tuned)
            if not tuned:
                baseline_s.append(took)
            return took

        return run

    baseline_s: list[float] = []  # every run without the artifact that finished
    log(f"measuring the workload with and without the artifact (budget {budget_s:.0f}s)")
    measurement = Measurement("workload", timed(False), timed(True), budget_s)
    try:
        figure = measurement.run()
    except _ArtifactFailed as exc:
        return Failure("workload", str(exc))
    except (TunerError, cc.CacheError, OSError) as exc:
        if not measurement.runs:
            return f"workload not measured: {exc}"
        log(f"workload: measuring stopped ({exc}); the pairs run before it are the figure")
        figure = measurement.figure()
    return figure if figure is not None else "workload: the budget ended before one pair ran"


def _loaded_empty(reports: dict[bool, list[sv.Report]]) -> Failure | None:
    """A run with the artifact whose server loaded a compiled model with nothing in it: it
    serves eager for life (vllm#56879), so the artifact is refused whatever it timed."""
    said = next((r.empty_artifact for r in reports[True] if r.empty_artifact), "")
    if not said:
        return None
    return Failure("workload", f"the server loaded an empty compiled model from it: {said}"[:300])


def _timed_out(tuned: bool, allowed_s: float, baseline_s: Sequence[float]) -> Exception:
    """Whose a stopped run is: the artifact's (a hang), or nobody's (nothing to compare)."""
    if not tuned:
        return TunerError(f"without the artifact the workload did not finish in {_secs(allowed_s)}")
    slowest = max(baseline_s, default=0.0)
    if slowest and allowed_s >= HANG_FACTOR * slowest:
        return _ArtifactFailed(
            f"with the artifact the workload did not finish in {_secs(allowed_s)}; "
            f"without it, it took {_secs(slowest)}"
        )
    return TunerError(
        f"the budget ended {_secs(allowed_s)} into a run with the artifact, under "
        f"{HANG_FACTOR:g}x the {_secs(slowest)} the workload took without it: not a hang"
    )


def _secs(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.2g} s"


def _exited(status: int) -> str:
    """How a run with the artifact ended, in words (a negative status is the signal)."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"the workload was killed by {name} with the artifact loaded (without it, it ran)"
    return f"the workload exited with status {status} with the artifact loaded (without it, it ran)"


# --- the GEMMs, in a child with torch --------------------------------------------------------


# The GEMM child's exit status when torch refused the results (read_file failed): the artifact
# is unusable in the very image it was tuned in, a failure, not "not measured".
_REFUSED_EXIT = 3


def _gemms(
    cfg: TuningConfig, results: Path, work: Path, budget_s: float, log: Log
) -> Figure | Failure | str:
    spec = work / "gemms.json"
    spec.write_text(
        json.dumps(
            {
                "results": str(results),
                "mode": cfg.promotion.mode,
                "budgetSeconds": budget_s,
                "shapes": [asdict(s) for s in cfg.shapes],
            }
        ),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(_TUNABLEOP_PREFIX)}
    package = str(Path(__file__).resolve().parent)
    argv = [sys.executable, package, "_measure-gemms", "--spec", str(spec)]
    log(f"measuring {len(cfg.shapes)} GEMM shape(s), TunableOp off and on ({cfg.promotion.mode})")
    try:
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=max(budget_s, 1.0) + 60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        # Not the artifact's, unlike a workload that hangs with it: the child times both arms
        # in one process and says nothing until it ends, so a timeout (60 s past a budget
        # its own loop keeps) may be torch's import, CUDA's start or a baseline pass as well
        # as a tuned one. Blaming the results would need the child to report the arm it is in.
        return f"gemms not measured: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        if proc.returncode == _REFUSED_EXIT:
            return Failure("gemms", tail[0][:200])
        # The child holds the results loaded the whole time it runs: its crash is theirs.
        how = (
            f"killed by {signal.Signals(-proc.returncode).name}"
            if -proc.returncode in {s.value for s in signal.Signals}
            else f"exit {proc.returncode}"
        )
        return Failure("gemms", f"the GEMM measuring process died ({how}) with the results "
                       f"loaded: {tail[0][:200]}")  # fmt: skip
    try:
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
        figure = Figure.from_dict(doc.get("figure"))
    except (ValueError, IndexError, AttributeError):
        return "gemms not measured: the child's report is not JSON"
    note = doc.get("note") if isinstance(doc.get("note"), str) else ""
    if note:
        log(f"gemms: {note}")
    return figure if figure is not None else f"gemms not measured: {note or 'no pair fit'}"


def child_main(spec_path: str) -> int:
    """The GEMM child: one JSON line {"figure": ..., "note": ...} on stdout."""
    doc = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    import torch  # the user's image's torch; this child is where it is imported

    shapes = [Shape(**s) for s in doc["shapes"]]
    try:
        bench = _GemmBench(torch, shapes, str(doc["results"]), str(doc["mode"]))
    except _Refused as exc:
        print(str(exc), file=sys.stderr)
        return _REFUSED_EXIT
    except TunerError as exc:  # nothing to time (float8 alone): not measured, no failure
        print(json.dumps({"figure": None, "note": str(exc)}))
        return 0
    figure = Measurement("gemms", bench.baseline, bench.tuned, float(doc["budgetSeconds"])).run()
    print(json.dumps({"figure": figure.to_dict() if figure else None, "note": bench.note}))
    return 0


class _Refused(TunerError):
    """torch.cuda.tunable.read_file refused the results."""


class _GemmBench:
    """Both arms over the same operands, TunableOp toggled by its API between passes."""

    def __init__(self, torch: Any, shapes: Sequence[Shape], results: str, mode: str) -> None:
        self.torch = torch
        self.tunable = torch.cuda.tunable
        self.note = ""
        self.ops = [op for op in map(self._op, shapes) if op is not None]
        if len(self.ops) < len(shapes):
            self.note = "float8 shapes are not timed"
        if not self.ops:
            raise TunerError("no shape to time")
        self.tunable.tuning_enable(False)
        self.tunable.record_untuned_enable(False)
        self.tunable.enable(True)
        self.tunable.set_filename(results, False)
        if not self.tunable.read_file(results):
            raise _Refused(
                f"torch refused the results ({results}): read_file failed in the image they "
                "were tuned in (validators differ, or the file does not parse)"
            )
        self.graphs = mode == "CUDAGraphs" and self._capture()
        self.repeat = self._calibrate()

    def _op(self, s: Shape) -> Callable[[], Any] | None:
        """What record.py runs for the shape, with its TF32 setting (TunableOp names a TF32
        GEMM apart, "tf32"); float8 shapes are not timed."""
        if s.dtype.startswith("float8"):
            return None
        gemm = shape_gemm(self.torch, s)
        matmul = self.torch.backends.cuda.matmul

        def run() -> Any:
            matmul.allow_tf32 = s.tf32
            return gemm()

        return run

    def _capture(self) -> bool:
        graph = getattr(self.torch.cuda, "CUDAGraph", None)
        if graph is None:
            self.note = "this torch has no CUDA graphs: GEMMs timed eagerly"
            return False
        self.captured = {}
        for on in (False, True):
            self.tunable.enable(on)
            for op in self.ops:
                op()  # warm: TunableOp looks the result up before capture
            self.torch.cuda.synchronize()
            g = graph()
            with self.torch.cuda.graph(g):
                for op in self.ops:
                    op()
            self.captured[on] = g
        return True

    def _pass(self, on: bool, repeat: int) -> float:
        self.tunable.enable(on)
        self.torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(repeat):
            if self.graphs:
                self.captured[on].replay()
            else:
                for op in self.ops:
                    op()
        self.torch.cuda.synchronize()
        return time.perf_counter() - started

    def _calibrate(self) -> int:
        """Passes long enough to time: as many repetitions as fill CHILD_PASS_SECONDS."""
        self._pass(False, 1)
        self._pass(True, 1)
        one = max(self._pass(False, 1), 1e-6)
        return max(1, min(10000, int(CHILD_PASS_SECONDS / one)))

    def baseline(self) -> float:
        return self._pass(False, self.repeat)

    def tuned(self) -> float:
        return self._pass(True, self.repeat)
