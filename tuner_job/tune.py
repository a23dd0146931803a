"""Tune recorded GEMMs with TunableOp's offline API, within a wall-clock budget.

TunableOp's duration and iteration caps bound one solution's timing, not a run: a GEMM on ROCm
can have thousands of candidate solutions. So tuning runs in processes this one can stop:

* the tuning process (``_tune-child``, its own session): with N GPUs an orchestrator that never
  imports torch, splitting the GEMMs into one share per GPU (balanced by estimated cost) and
  starting one worker per GPU; with one GPU it is that GPU's worker itself;
* each worker (``_tune-worker``) imports torch, selects its GPU, applies the profile's limits
  through the Python API and calls ``tune_gemm_in_file`` one GEMM at a time, checking the budget
  between GEMMs. A GEMM torch's offline tuner rejects is skipped and reported, as torch's own
  single-GPU path would; the others go on.

Why not ``mgpu_tune_gemm_in_file``: in torch 2.11 it is a process pool whose worker names its
results file after the first GEMM it runs and never selects a device, so GEMMs meant for two GPUs
can be timed on one at once; one rejected GEMM re-raises in the parent and discards every result
(2.15: "offline tuning processes failed"); and its parent calls torch.cuda.synchronize(), which
holds a CUDA context on GPU 0 while the workers tune. One process per GPU, as 2.15 does it, with
a per-GEMM try, keeps every finished GEMM, and no process but the workers touches a GPU.

With a progress path (the exchange directory's progress.csv), the orchestrator rewrites it with
what the workers have tuned so far, for the sync sidecar to checkpoint.

Results are taken from what torch itself produced: each worker's ``get_results()`` and every
results file torch wrote (one per worker, realtime-appended by recent torch), parsed and
merged. A run stopped at the budget leaves real, partial results.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._proc import kill_group
from .config import Limits
from .files import atomic_write_bytes
from .gpu import EXIT_FAILED, TunerError, identify, import_torch, require_gpu, require_offline_api
from .library import partition
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
from .torchapi import OWNED_ENV, apply_limits

Log = Callable[[str], None]

# The tuner_job package directory: child processes run it by path (`python <dir> ...`), so the
# image's PYTHONPATH stays as it is and a user's PYTHONPATH cannot shadow this package.
PACKAGE_DIR = Path(__file__).resolve().parent

GEMMS_FILE = "unique-gemms.csv"
SHARE_FILE = "share-{}.csv"
RESULTS_ENV_NAME = "tuned%d.csv"
RESULTS_FILE = "tuned{}.csv"  # each worker's results file (set_filename, not the env ordinal)
PROGRESS_FILE = "progress-{}.csv"
WORKER_REPORT = "report-{}.json"
REPORT_FILE = "report.json"
SPEC_FILE = "spec.json"
KILL_GRACE_S = 10.0
POLL_S = 0.1


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
    rejected: list[dict[str, str]] = field(default_factory=list)  # GEMMs torch refused
    applied: dict[str, Any] = field(default_factory=dict)  # what TunableOp reported back


def path_is_mgpu_safe(path: str) -> bool:
    """mgpu_tune_gemm_in_file builds its glob from the character before the first '.' of the
    results path and names its copies with replace("0", i) over the whole path. The tuner no
    longer calls it, but keeps its directories safe for it (scripts and users still may)."""
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
        "no writable directory whose path has no '.' and no '0'; set TMPDIR to such a directory"
    )


def tuning_env(base: dict[str, str], tuning_dir: Path) -> dict[str, str]:
    """The tuning processes' environment: the container's, less what the tuner owns. PYTHONPATH
    is left as the image has it (the children are started by path)."""
    env = {k: v for k, v in base.items() if k not in OWNED_ENV}
    env.update(
        {
            "PYTORCH_TUNABLEOP_ENABLED": "1",
            "PYTORCH_TUNABLEOP_TUNING": "1",
            "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
            # Fresh per run: recent torch appends to an existing results file. Each worker also
            # names its own file (set_filename wins over this variable).
            "PYTORCH_TUNABLEOP_FILENAME": str(tuning_dir / RESULTS_ENV_NAME),
        }
    )
    return env


def package_command(python: str, *args: str) -> list[str]:
    return [python, str(PACKAGE_DIR), *args]


@dataclass(frozen=True)
class TuneRun:
    """How a tuning run goes: on how many GPUs, with which limits, within what budget.
    progress: a file rewritten with the results so far, as the workers go. allow_empty: tuning
    that produced nothing returns empty results instead of failing (the caller has other rows
    to publish). python and keep_dir: the interpreter the workers run, and whether their
    directory is kept (tests, debugging)."""

    gpus: int
    limits: Limits
    budget_s: float
    progress: Path | None = None
    allow_empty: bool = False
    python: str = sys.executable
    keep_dir: bool = False


@dataclass(frozen=True)
class _Ended:
    """How the tuning process ended: its exit status (None: never reaped), whether the budget
    killed it, and the seconds it ran."""

    rc: int | None
    killed: bool
    seconds: float


def tune(gemms: Sequence[UntunedRow], run: TuneRun, log: Log = _log) -> TuneOutcome:
    """Tune unique GEMMs; return torch's results (possibly partial when the budget ran out)."""
    gpus, limits, budget_s, progress = run.gpus, run.limits, run.budget_s, run.progress
    python, keep_dir, allow_empty = run.python, run.keep_dir, run.allow_empty
    if not gemms:
        raise TunerError("no GEMMs to tune")
    if budget_s <= 0:
        raise TunerError("the tuning budget is used up before tuning started")
    tuning_dir = make_tuning_dir()
    (tuning_dir / GEMMS_FILE).write_text(format_untuned(gemms), encoding="utf-8")
    started = time.monotonic()
    hard_deadline = time.time() + budget_s
    # Workers stop between GEMMs a little before the hard deadline, leaving time to report
    # (their get_results() and identity, the orchestrator's merge).
    soft_deadline = hard_deadline - min(30.0, max(1.0, 0.1 * budget_s))
    spec = {
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
        package_command(python, "_tune-child", "--spec", str(tuning_dir / SPEC_FILE)),
        env=env,
        cwd=tuning_dir,
        start_new_session=True,  # the workers join its group, so a kill reaches them
        stdout=sys.stderr,
    )
    rc, killed = _wait(proc, hard_deadline, budget_s, log)
    seconds = time.monotonic() - started
    try:
        return _gather(tuning_dir, len(gemms), _Ended(rc, killed, seconds), log, allow_empty)
    finally:
        if not keep_dir:
            _remove_tree(tuning_dir)


def _wait(
    proc: subprocess.Popen[bytes], hard_deadline: float, budget_s: float, log: Log
) -> tuple[int | None, bool]:
    """Wait for the tuning process until the hard deadline, killing its group then (or when
    interrupted): its exit status, and whether it was killed for the budget."""
    try:
        rc = proc.wait(timeout=max(hard_deadline - time.time(), 1.0))
    except subprocess.TimeoutExpired:
        log(f"tuning budget of {budget_s:.0f}s reached: stopping the tuning process")
        kill_group(proc, KILL_GRACE_S)
        return proc.returncode, True
    except BaseException:
        kill_group(proc, KILL_GRACE_S)
        raise
    # Stray members of its group (workers) must not outlive it holding GPU memory.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return rc, False


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _torch_files(tuning_dir: Path, log: Log) -> list[ResultsFile]:
    """Every results file torch wrote into the tuning directory (realtime-appended per worker),
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


def _report_results(report: dict[str, Any]) -> ResultsFile | None:
    if not report.get("results"):
        return None
    rows = [
        ResultRow(str(r[0]), str(r[1]), str(r[2]), format_ms(float(r[3])))
        for r in report["results"]
    ]
    text = format_results(ResultsFile(dict(report["validators"]), rows))
    try:
        return parse_results(text, "torch.cuda.tunable.get_results()")
    except CsvFormatError as exc:
        raise TunerError(f"torch returned results this tuner cannot read: {exc}") from None


def _gather(
    tuning_dir: Path, attempted: int, ended: _Ended, log: Log, allow_empty: bool = False
) -> TuneOutcome:
    rc, killed, seconds = ended.rc, ended.killed, ended.seconds
    report: dict[str, Any] = {}
    report_path = tuning_dir / REPORT_FILE
    if report_path.exists():
        report = json.loads(report_path.read_text(encoding="utf-8"))
    elif not killed:
        raise TunerError(f"the tuning process failed (exit status {rc}); see the log above")
    else:  # killed before the orchestrator reported: what the workers did report still counts
        report = _merge_reports(_worker_reports(tuning_dir))
    sources: list[ResultsFile] = []
    from_api = _report_results(report)
    if from_api is not None:
        sources.append(from_api)
    # A file cut off by the budget's kill loses its last row; the other sources still count.
    sources += _torch_files(tuning_dir, log)
    sources = [s for s in sources if s.rows]
    error = report.get("error")
    if sources:
        try:
            merged = merge_results(sources)
        except ValidatorMismatchError as exc:
            raise TunerError(str(exc)) from None
    elif error and not killed:
        raise TunerError(str(error["message"]), int(error.get("code", EXIT_FAILED)))
    elif allow_empty:
        merged = ResultsFile(dict(report.get("validators") or {}), [])
    else:
        ran_out = killed or bool(report.get("stoppedEarly"))
        why = "the budget ran out first" if ran_out else "torch tuned none of them"
        raise TunerError(f"tuning produced no results for {attempted} GEMM(s): {why}")
    if error:
        log(f"warning: {error['message']}")
    stopped = killed or bool(report.get("stoppedEarly"))
    identity = report.get("identity")
    rejected = [dict(r) for r in report.get("rejected") or []]
    return TuneOutcome(
        results=merged,
        attempted=attempted,
        seconds=seconds,
        stopped_early=stopped,
        failures=int(report.get("failures", len(rejected))),
        identity=dict(identity) if isinstance(identity, dict) else None,
        loop_seconds=float(report["loopSeconds"]) if "loopSeconds" in report else None,
        rejected=rejected,
        applied=dict(report.get("applied") or {}),
    )


# --- the tuning process: an orchestrator without torch --------------------------------------


def _worker_reports(tuning_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(tuning_dir.glob(WORKER_REPORT.format("*"))):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text(encoding="utf-8")))
    return out


def _merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from the workers': their results (disjoint shares), the first worker's
    identity and validators, every rejected GEMM, the first error when a worker failed."""
    merged: dict[str, Any] = {
        "results": [],
        "validators": {},
        "identity": None,
        "stoppedEarly": False,
        "rejected": [],
        "failures": 0,
        "applied": {},
    }
    loops = [float(r["loopSeconds"]) for r in reports if "loopSeconds" in r]
    if loops:  # the workers ran side by side: the longest is the loop's time
        merged["loopSeconds"] = round(max(loops), 3)
    for r in sorted(reports, key=lambda r: int(r.get("gpu", 0))):
        merged["results"] += r.get("results") or []
        if r.get("validators") and not merged["validators"]:
            merged["validators"] = r["validators"]
        if r.get("identity") and merged["identity"] is None:
            merged["identity"] = r["identity"]
        if r.get("applied") and not merged["applied"]:
            merged["applied"] = r["applied"]
        merged["stoppedEarly"] |= bool(r.get("stoppedEarly"))
        merged["rejected"] += r.get("rejected") or []
        if r.get("error") and "error" not in merged:
            merged["error"] = r["error"]
    merged["failures"] = len(merged["rejected"])
    return merged


class _ProgressMerger:
    """progress.csv: the workers' progress files merged, rewritten when one of them changed
    (temp file + rename) so that the sync sidecar only ever reads a complete file."""

    def __init__(self, path: Path | None, tuning_dir: Path) -> None:
        self.path = path
        self.tuning_dir = tuning_dir
        self.seen: dict[str, int] = {}

    def poll(self) -> None:
        if self.path is None:
            return
        files = sorted(self.tuning_dir.glob(PROGRESS_FILE.format("*")))
        stamps: dict[str, int] = {}
        for f in files:
            with contextlib.suppress(OSError):
                stamps[f.name] = f.stat().st_mtime_ns
        if stamps == self.seen:
            return
        self.seen = stamps
        parsed = []
        for f in files:
            with contextlib.suppress(OSError, CsvFormatError):
                got = read_results(f)
                if got.rows:
                    parsed.append(got)
        if not parsed:
            return
        try:
            merged = merge_results(parsed)
        except ValidatorMismatchError as exc:
            _log(f"progress not written: {exc}")
            return
        atomic_write_bytes(self.path, format_results(merged).encode("utf-8"), fsync=False)


def child_main(spec_path: str) -> int:
    """The orchestrator: one worker per GPU with work, each on its share; no torch here."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    tuning_dir = Path(spec["dir"])
    gpus = int(spec["gpus"])
    rows = read_untuned(tuning_dir / GEMMS_FILE).rows
    if gpus == 1:
        # One GPU: this process is its worker (its parent, the tuner, holds no GPU).
        (tuning_dir / SHARE_FILE.format(0)).write_text(format_untuned(rows), encoding="utf-8")
        progress_path = spec.get("progress")
        worker_main(spec_path, 0, progress=Path(progress_path) if progress_path else None)
        merged = _merge_reports(_worker_reports(tuning_dir))
        atomic_write_bytes(tuning_dir / REPORT_FILE, json.dumps(merged).encode("utf-8"))
        return 0
    shares = partition(rows, gpus)
    workers: list[tuple[int, subprocess.Popen[bytes]]] = []
    for gpu, share in enumerate(shares):
        if not share:
            continue
        (tuning_dir / SHARE_FILE.format(gpu)).write_text(format_untuned(share), encoding="utf-8")
        cmd = package_command(
            sys.executable, "_tune-worker", "--spec", spec_path, "--gpu", str(gpu)
        )
        workers.append((gpu, subprocess.Popen(cmd, cwd=tuning_dir, stdout=sys.stderr)))
    if gpus > 1:
        sizes = ", ".join(f"GPU {g}: {len(shares[g])}" for g, _ in workers)
        _log(f"{len(rows)} GEMM(s) split across {len(workers)} GPU(s) ({sizes})")
    progress = _ProgressMerger(Path(spec["progress"]) if spec.get("progress") else None, tuning_dir)
    codes: dict[int, int] = {}
    while len(codes) < len(workers):
        for gpu, proc in workers:
            if gpu not in codes and proc.poll() is not None:
                codes[gpu] = proc.returncode
        progress.poll()
        if len(codes) < len(workers):
            time.sleep(POLL_S)
    progress.poll()
    reports = _worker_reports(tuning_dir)
    reported = {int(r.get("gpu", -1)) for r in reports}
    for gpu, code in sorted(codes.items()):
        if gpu not in reported:
            reports.append(
                {
                    "gpu": gpu,
                    "error": {
                        "message": f"the tuning worker of GPU {gpu} failed (exit status {code})",
                        "code": EXIT_FAILED,
                    },
                }
            )
    merged = _merge_reports(reports)
    atomic_write_bytes(tuning_dir / REPORT_FILE, json.dumps(merged).encode("utf-8"))
    return 0


# --- a worker: one GPU, its share, one GEMM at a time ---------------------------------------


class _Progress:
    """This worker's progress file: what torch has tuned so far (nothing was loaded, so
    get_results() is exactly that), rewritten whole after every GEMM."""

    def __init__(self, path: Path | None, tunable: Any) -> None:
        self.path = path
        self.tunable = tunable
        # Each row's text, formatted once: the file is rewritten after every GEMM.
        self.lines: dict[tuple[str, str], tuple[tuple[str, str, float], str]] = {}

    def write(self) -> None:
        if self.path is None:
            return
        validators = {str(k): str(v) for k, v in self.tunable.get_validators()}
        for op, params, sol, ms in self.tunable.get_results():
            key, value = (str(op), str(params)), (str(sol), str(ms), float(ms))
            cached = self.lines.get(key)
            if cached is None or cached[0] != value:
                self.lines[key] = (value, f"{key[0]},{key[1]},{value[0]},{format_ms(value[2])}\n")
        head = "".join(f"Validator,{k},{v}\n" for k, v in sorted(validators.items()))
        data = head + "".join(self.lines[k][1] for k in sorted(self.lines))
        # No fsync: the file lives and dies with the pod; the rename keeps it whole.
        atomic_write_bytes(self.path, data.encode("utf-8"), fsync=False)


def worker_main(spec_path: str, gpu: int, progress: Path | None = None) -> int:
    """progress: where to write progress directly (one GPU: no orchestrator merges for it)."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    tuning_dir = Path(spec["dir"])
    report_path = tuning_dir / WORKER_REPORT.format(gpu)
    try:
        report = _work(spec, tuning_dir, gpu, progress)
    except TunerError as exc:
        report = {"gpu": gpu, "error": {"message": str(exc), "code": exc.exit_code}}
    atomic_write_bytes(report_path, json.dumps(report).encode("utf-8"))
    return 0


def _work(
    spec: dict[str, Any], tuning_dir: Path, gpu: int, progress_path: Path | None
) -> dict[str, Any]:
    gpus = int(spec["gpus"])
    deadline = float(spec["deadline"])
    limits = Limits(**spec["limits"])
    torch = import_torch()
    require_gpu(torch, gpus)
    require_offline_api(torch, 1)
    torch.cuda.set_device(gpu)  # before TunableOp starts: its context belongs to this GPU
    tunable = torch.cuda.tunable
    tunable.set_filename(str(tuning_dir / RESULTS_FILE.format(gpu)), False)
    try:
        applied = apply_limits(tunable, limits, _log)
    except ValueError as exc:
        raise TunerError(str(exc)) from None
    tunable.enable(True)
    tunable.tuning_enable(True)
    tunable.record_untuned_enable(False)
    rows = read_untuned(tuning_dir / SHARE_FILE.format(gpu)).rows
    progress = _Progress(progress_path or tuning_dir / PROGRESS_FILE.format(gpu), tunable)
    rejected: list[dict[str, str]] = []
    stopped = False
    where = f"GPU {gpu} " if gpus > 1 else ""
    one = tuning_dir / f"current-{gpu}.csv"
    loop_started = time.monotonic()
    for i, row in enumerate(rows, start=1):
        if time.time() >= deadline:
            stopped = True
            _log(f"{where}budget reached after {i - 1} of {len(rows)} GEMMs")
            break
        one.write_text(format_untuned([row]), encoding="utf-8")
        t0 = time.monotonic()
        try:
            tunable.tune_gemm_in_file(str(one))
            torch.cuda.synchronize()
        except Exception as exc:
            # One GEMM torch cannot tune offline must not cost the others (on any GPU).
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            rejected.append({"op": row.op, "params": row.params, "error": reason})
            _log(f"{where}[{i}/{len(rows)}] {row.op},{row.params}: {reason}")
            continue
        progress.write()
        _log(f"{where}[{i}/{len(rows)}] {row.op},{row.params} in {time.monotonic() - t0:.1f}s")
    loop_seconds = time.monotonic() - loop_started
    results = [[str(r[0]), str(r[1]), str(r[2]), float(r[3])] for r in tunable.get_results()]
    identity, validators = identify(torch)
    with contextlib.suppress(Exception):  # raises on some builds without a device
        applied["rotatingBufferSize"] = int(tunable.get_rotating_buffer_size())
    return {
        "gpu": gpu,
        "results": results,
        "validators": validators,
        "identity": identity,
        "stoppedEarly": stopped,
        "rejected": rejected,
        "loopSeconds": round(loop_seconds, 3),
        "applied": applied,
    }
