"""Tune recorded GEMMs with TunableOp's offline API, within a wall-clock budget.

TunableOp's duration and iteration caps bound one solution's timing, not a run: a GEMM on ROCm
can have thousands of candidate solutions. So tuning runs in a child process that this one can
stop at the budget. The child:

* on one GPU, applies the profile's limits through the Python API and calls
  ``tune_gemm_in_file`` one GEMM at a time, checking the budget between GEMMs;
* on N GPUs, calls ``mgpu_tune_gemm_in_file`` on chunks of the GEMMs (checking the budget
  between chunks); its worker processes are spawned fresh and so see only environment
  variables: the same limits go to them that way.

With a progress path (the exchange directory's progress.csv), the child rewrites it with what
torch has tuned so far after every GEMM (one GPU) or chunk (N GPUs), for the sync sidecar to
checkpoint.

Results are taken from what torch itself produced: ``get_results()`` of the child and every
results file torch wrote (per ordinal, realtime-appended by recent torch, gathered by the mgpu
path), parsed and merged. A child stopped at the budget leaves real, partial results.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import string
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._proc import kill_group
from .config import Limits
from .files import atomic_write_bytes
from .gpu import TunerError, identify, import_torch, require_gpu, require_offline_api
from .results import (
    CsvFormatError,
    ResultRow,
    ResultsFile,
    UntunedRow,
    ValidatorMismatchError,
    format_ms,
    format_results,
    format_untuned,
    merge_results,
    parse_results,
    read_results,
    read_untuned,
)

Log = Callable[[str], None]

# numericalCheck: true means "reject solutions whose output differs from the default GEMM".
# Recent torch takes tolerances; 1e-2 lets half-precision GEMMs that merely sum in another order
# pass (the 1e-5 default would keep only the default solution for bf16).
NUMERICAL_ATOL = 1e-2
NUMERICAL_RTOL = 1e-2

# Settings the tuner owns in the tuning process; the user's values for them (env vars win over
# the Python API) are dropped so the profile decides. Library selection and logging are kept.
_OWNED_ENV = (
    "PYTORCH_TUNABLEOP_ENABLED",
    "PYTORCH_TUNABLEOP_TUNING",
    "PYTORCH_TUNABLEOP_RECORD_UNTUNED",
    "PYTORCH_TUNABLEOP_FILENAME",
    "PYTORCH_TUNABLEOP_UNTUNED_FILENAME",
    "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS",
    "PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS",
    "PYTORCH_TUNABLEOP_MAX_WARMUP_DURATION_MS",
    "PYTORCH_TUNABLEOP_MAX_WARMUP_ITERATIONS",
    "PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE",
    "PYTORCH_TUNABLEOP_NUMERICAL_CHECK",
)

GEMMS_FILE = "unique-a.csv"
GEMMS_PATTERN = "unique-?.csv"  # mgpu wants a wildcard; it matches exactly GEMMS_FILE
RESULTS_ENV_NAME = "tuned%d.csv"
REPORT_FILE = "report.json"
SPEC_FILE = "spec.json"
KILL_GRACE_S = 10.0
# N GPUs: mgpu_tune_gemm_in_file spawns a worker per GPU (a torch import and GPU start-up each)
# on every call, so chunks are big enough to pay for that, and small enough that progress is
# written and the budget checked now and then.
MGPU_CHUNK_PER_GPU = 16


def _log(msg: str) -> None:
    print(f"tuner_job: {msg}", file=sys.stderr, flush=True)


@dataclass
class TuneOutcome:
    results: ResultsFile
    attempted: int
    seconds: float
    stopped_early: bool
    failures: int
    identity: dict[str, str] | None
    loop_seconds: float | None = None  # torch's tuning calls alone, without process start-up


def path_is_mgpu_safe(path: str) -> bool:
    """mgpu_tune_gemm_in_file builds its glob from the character before the first '.' of the
    results path and names its copies with replace("0", i) over the whole path."""
    return "." not in path and "0" not in path


def make_tuning_dir(bases: Sequence[str | None] | None = None) -> Path:
    if bases is None:
        bases = (os.environ.get("TMPDIR"), "/tmp", "/dev/shm", os.getcwd())
    for base in bases:
        if not base:
            continue
        resolved = str(Path(base).resolve())
        if not path_is_mgpu_safe(resolved) or not os.access(resolved, os.W_OK):
            continue
        for _ in range(8):
            name = "tunefleet-tune-" + "".join(
                secrets.choice(string.ascii_lowercase) for _ in range(10)
            )
            path = Path(resolved) / name
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                continue
            return path
    raise TunerError(
        "no writable directory whose path has no '.' and no '0' (mgpu_tune_gemm_in_file needs "
        "one); set TMPDIR to such a directory"
    )


def tuning_env(base: dict[str, str], tuning_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in _OWNED_ENV}
    env.update(
        {
            "PYTORCH_TUNABLEOP_ENABLED": "1",
            "PYTORCH_TUNABLEOP_TUNING": "1",
            "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
            # Fresh per run: recent torch appends to an existing results file.
            "PYTORCH_TUNABLEOP_FILENAME": str(tuning_dir / RESULTS_ENV_NAME),
        }
    )
    # The child must import this very package, wherever it was copied to.
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent, *[p for p in paths if p != pkg_parent]])
    return env


def tune(
    gemms: Sequence[UntunedRow],
    *,
    gpus: int,
    limits: Limits,
    budget_s: float,
    python: str = sys.executable,
    keep_dir: bool = False,
    log: Log = _log,
    progress: Path | None = None,
    allow_empty: bool = False,
) -> TuneOutcome:
    """Tune unique GEMMs; return torch's results (possibly partial when the budget ran out).

    progress: a file the tuning process rewrites with its results so far, as it goes.
    allow_empty: tuning that produced nothing returns empty results instead of failing (the
    caller has other rows to publish).
    """
    if not gemms:
        raise TunerError("no GEMMs to tune")
    if budget_s <= 0:
        raise TunerError("the tuning budget is used up before tuning started")
    tuning_dir = make_tuning_dir()
    (tuning_dir / GEMMS_FILE).write_text(format_untuned(gemms), encoding="utf-8")
    started = time.monotonic()
    hard_deadline = time.time() + budget_s
    # The child stops between GEMMs a little before the hard deadline, leaving time to report.
    soft_deadline = hard_deadline - min(30.0, 0.1 * budget_s)
    spec = {
        "mode": "mgpu" if gpus > 1 else "single",
        "gpus": gpus,
        "dir": str(tuning_dir),
        "deadline": soft_deadline,
        "limits": asdict(limits),
        "progress": str(progress) if progress is not None else None,
    }
    (tuning_dir / SPEC_FILE).write_text(json.dumps(spec), encoding="utf-8")
    env = tuning_env(dict(os.environ), tuning_dir)
    log(f"tuning {len(gemms)} unique GEMM(s) on {gpus} GPU(s), budget {budget_s:.0f}s")
    proc = subprocess.Popen(
        [python, "-m", "tuner_job", "_tune-child", "--spec", str(tuning_dir / SPEC_FILE)],
        env=env,
        cwd=tuning_dir,
        start_new_session=True,  # the mgpu workers join its group, so a kill reaches them
        stdout=sys.stderr,
    )
    killed = False
    try:
        rc = proc.wait(timeout=max(hard_deadline - time.time(), 1.0))
    except subprocess.TimeoutExpired:
        log(f"tuning budget of {budget_s:.0f}s reached: stopping the tuning process")
        kill_group(proc, KILL_GRACE_S)
        killed, rc = True, proc.returncode
    except BaseException:
        kill_group(proc, KILL_GRACE_S)
        raise
    else:
        # Stray members of its group (mgpu workers) must not outlive it holding GPU memory.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    seconds = time.monotonic() - started
    try:
        return _gather(tuning_dir, len(gemms), seconds, rc, killed, log, allow_empty)
    finally:
        if not keep_dir:
            _remove_tree(tuning_dir)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _torch_files(tuning_dir: Path, log: Log) -> list[ResultsFile]:
    """Every results file torch wrote into the tuning directory (realtime-appended per ordinal),
    parsed as torch reads them: a row cut off by a kill is dropped, never the whole file."""
    out: list[ResultsFile] = []
    for path in sorted(tuning_dir.glob("tuned*.csv")):
        try:
            parsed = read_results(path)
        except CsvFormatError as exc:
            log(f"skipping a results file torch left unfinished: {exc}")
            continue
        # A row cut off by a kill is dropped; the rest of the file still counts.
        for warning in parsed.warnings(path.name):
            log(f"warning: {warning}")
        out.append(parsed)
    return out


def _gather(
    tuning_dir: Path,
    attempted: int,
    seconds: float,
    rc: int | None,
    killed: bool,
    log: Log,
    allow_empty: bool = False,
) -> TuneOutcome:
    report: dict[str, Any] = {}
    report_path = tuning_dir / REPORT_FILE
    if report_path.exists():
        report = json.loads(report_path.read_text(encoding="utf-8"))
    elif not killed:
        raise TunerError(f"the tuning process failed (exit status {rc}); see the log above")
    sources: list[ResultsFile] = []
    if report.get("results"):
        rows = [
            ResultRow(str(r[0]), str(r[1]), str(r[2]), format_ms(float(r[3])))
            for r in report["results"]
        ]
        text = format_results(ResultsFile(dict(report["validators"]), rows))
        try:
            sources.append(parse_results(text, "torch.cuda.tunable.get_results()"))
        except CsvFormatError as exc:
            raise TunerError(f"torch returned results this tuner cannot read: {exc}") from None
    # A file cut off by the budget's kill is skipped; the other sources still count.
    sources += _torch_files(tuning_dir, log)
    sources = [s for s in sources if s.rows]
    if sources:
        try:
            merged = merge_results(sources)
        except ValidatorMismatchError as exc:
            raise TunerError(str(exc)) from None
    elif allow_empty:
        merged = ResultsFile(dict(report.get("validators") or {}), [])
    else:
        why = "the budget ran out first" if killed else "torch tuned none of them"
        raise TunerError(f"tuning produced no results for {attempted} GEMM(s): {why}")
    stopped = killed or bool(report.get("stoppedEarly"))
    identity = report.get("identity")
    return TuneOutcome(
        results=merged,
        attempted=attempted,
        seconds=seconds,
        stopped_early=stopped,
        failures=int(report.get("failures", 0)),
        identity=dict(identity) if isinstance(identity, dict) else None,
        loop_seconds=float(report["loopSeconds"]) if "loopSeconds" in report else None,
    )


# --- the child process ---------------------------------------------------------------------


def _apply_limits(tunable: Any, limits: Limits, mgpu: bool) -> None:
    """Python API where torch has it; environment variables for what it lacks and for the mgpu
    workers (fresh processes that never see this process's API calls). Nothing in this process
    has used TunableOp yet, so environment variables set now are still read."""
    has_tolerances = hasattr(tunable, "set_numerical_check_tolerances")
    if limits.numerical_check:
        numerical_env = f"{NUMERICAL_ATOL}_{NUMERICAL_RTOL}" if has_tolerances else "1"
    else:
        numerical_env = "0"
    settings: list[tuple[str, str, Any]] = [
        (
            "set_max_tuning_duration",
            "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS",
            limits.max_duration_ms,
        ),
        (
            "set_max_tuning_iterations",
            "PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS",
            limits.max_iterations,
        ),
        (
            "set_max_warmup_duration",
            "PYTORCH_TUNABLEOP_MAX_WARMUP_DURATION_MS",
            limits.warmup_duration_ms,
        ),
        (
            "set_max_warmup_iterations",
            "PYTORCH_TUNABLEOP_MAX_WARMUP_ITERATIONS",
            limits.warmup_iterations,
        ),
        (
            "set_rotating_buffer_size",
            "PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE",
            limits.rotating_buffer_mb,
        ),
    ]
    for api, env, value in settings:
        if mgpu or not hasattr(tunable, api):
            os.environ[env] = str(value)
        if hasattr(tunable, api):
            getattr(tunable, api)(value)
    if mgpu or not has_tolerances:
        os.environ["PYTORCH_TUNABLEOP_NUMERICAL_CHECK"] = numerical_env
    if has_tolerances:
        tunable.set_numerical_check_tolerances(
            limits.numerical_check, NUMERICAL_ATOL, NUMERICAL_RTOL
        )


class _Progress:
    """progress.csv: what torch has tuned in this run so far, validators and rows, rewritten
    whole (temp file + rename) so that the sync sidecar only ever reads a complete file."""

    def __init__(self, path: Path | None, tunable: Any) -> None:
        self.path = path
        self.tunable = tunable
        # Each row's text, formatted once: the file is rewritten after every GEMM.
        self.lines: dict[tuple[str, str], tuple[tuple[str, str, float], str]] = {}

    def _write(self, validators: dict[str, str], rows: list[str]) -> None:
        assert self.path is not None
        head = "".join(f"Validator,{k},{v}\n" for k, v in sorted(validators.items()))
        data = (head + "".join(rows)).encode("utf-8")
        # No fsync: the file lives and dies with the pod; the rename keeps it whole.
        atomic_write_bytes(self.path, data, fsync=False)

    def write_api(self) -> None:
        """One GPU: this process's get_results() (all it tuned; nothing was loaded)."""
        if self.path is None:
            return
        validators = {str(k): str(v) for k, v in self.tunable.get_validators()}
        for op, params, sol, ms in self.tunable.get_results():
            key, value = (str(op), str(params)), (str(sol), str(ms), float(ms))
            cached = self.lines.get(key)
            if cached is None or cached[0] != value:
                self.lines[key] = (value, f"{key[0]},{key[1]},{value[0]},{format_ms(value[2])}\n")
        self._write(validators, [self.lines[k][1] for k in sorted(self.lines)])

    def write_files(self, tuning_dir: Path) -> None:
        """N GPUs: the results files the workers appended to."""
        if self.path is None:
            return
        files = [f for f in _torch_files(tuning_dir, _log) if f.rows]
        if files:
            try:
                merged = merge_results(files)
            except ValidatorMismatchError as exc:
                _log(f"progress not written: {exc}")
                return
            text = format_results(merged)
            self._write({}, [text])


def child_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    tuning_dir = Path(spec["dir"])
    gpus = int(spec["gpus"])
    deadline = float(spec["deadline"])
    limits = Limits(**spec["limits"])
    mgpu = spec["mode"] == "mgpu"
    torch = import_torch()
    require_gpu(torch, gpus)
    require_offline_api(torch, gpus)
    tunable = torch.cuda.tunable
    _apply_limits(tunable, limits, mgpu)
    tunable.enable(True)
    tunable.tuning_enable(True)
    if hasattr(tunable, "record_untuned_enable"):
        tunable.record_untuned_enable(False)
    rows = read_untuned(tuning_dir / GEMMS_FILE).rows
    progress = _Progress(Path(spec["progress"]) if spec.get("progress") else None, tunable)
    failures = 0
    stopped = False
    loop_started = time.monotonic()
    if mgpu:
        # Its workers are spawned: they re-import our __main__ (guarded) and read the env set
        # in _apply_limits; its copies land in tuning_dir, a path without '.' or '0'.
        size = MGPU_CHUNK_PER_GPU * gpus
        for start in range(0, len(rows), size):
            if time.time() >= deadline:
                stopped = True
                _log(f"budget reached after {start} of {len(rows)} GEMMs")
                break
            chunk = rows[start : start + size]
            (tuning_dir / GEMMS_FILE).write_text(format_untuned(chunk), encoding="utf-8")
            tunable.mgpu_tune_gemm_in_file(str(tuning_dir / GEMMS_PATTERN), gpus)
            torch.cuda.synchronize()
            # The workers' results are in their files, not in this process.
            progress.write_files(tuning_dir)
            _log(f"[{start + len(chunk)}/{len(rows)}] chunk of {len(chunk)} GEMM(s) tuned")
    else:
        one = tuning_dir / "current-gemm.csv"
        for i, row in enumerate(rows, start=1):
            if time.time() >= deadline:
                stopped = True
                _log(f"budget reached after {i - 1} of {len(rows)} GEMMs")
                break
            one.write_text(format_untuned([row]), encoding="utf-8")
            t0 = time.monotonic()
            try:
                tunable.tune_gemm_in_file(str(one))
                torch.cuda.synchronize()
            except Exception as exc:
                # One GEMM torch cannot tune offline must not cost the others.
                failures += 1
                _log(f"[{i}/{len(rows)}] {row.op},{row.params}: {type(exc).__name__}: {exc}")
                continue
            progress.write_api()
            _log(f"[{i}/{len(rows)}] {row.op},{row.params} in {time.monotonic() - t0:.1f}s")
    loop_seconds = time.monotonic() - loop_started
    results = [[str(r[0]), str(r[1]), str(r[2]), float(r[3])] for r in tunable.get_results()]
    identity, validators = identify(torch)
    report = {
        "results": results,
        "validators": validators,
        "identity": identity,
        "stoppedEarly": stopped,
        "failures": failures,
        "loopSeconds": round(loop_seconds, 3),
    }
    atomic_write_bytes(tuning_dir / REPORT_FILE, json.dumps(report).encode("utf-8"))
    return 0
