"""python -m tuner_job {record,tune,identify,run}: the tune container's entry point."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from . import __version__, measure
from . import caches as cc
from . import exchange as ex
from .config import ConfigError, TuningConfig
from .config import load as load_config
from .files import atomic_write_bytes, write_termination_log
from .gpu import EXIT_USAGE, TunerError
from .library import Settings, keys_of, library_key, partition, rows_for
from .machine import Machine, probe, probe_main
from .manifest import Manifest, ManifestExtra
from .output import (
    MANIFEST_NAME,
    RESULTS_NAME,
    RunFacts,
    rewrite_manifest,
    write_caches_output,
    write_output,
)
from .record import collect_untuned, record_workload, run_workload
from .results import (
    CsvFormatError,
    ResultsFile,
    UntunedFile,
    UntunedRow,
    dedupe_untuned,
    format_results,
    merge_results,
    read_untuned,
)
from .torchapi import settings_of
from .tune import TuneOutcome, TuneRun, child_main, tune, worker_main

PROG = "tuner_job"


def _log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuner_job",
        description="Record, tune and describe PyTorch TunableOp GEMMs (needs a ROCm or CUDA GPU).",
    )
    p.add_argument("--version", action="version", version=f"tuner_job {__version__}")
    p.add_argument(
        "--termination-log",
        default="/dev/termination-log",
        metavar="PATH",
        help="where a one-line failure reason goes for Kubernetes (default: %(default)s)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{record,tune,identify,run}")

    config_help = "tuning config JSON file (default: $TUNEFLEET_TUNING_CONFIG)"
    workload_help = (
        "the workload command and its arguments, after --, instead of workload.command in the "
        "config (the operator's Job passes them so, verbatim)"
    )
    rec = sub.add_parser("record", help="record the workload's GEMMs as untuned files")
    rec.add_argument("--config", metavar="FILE", help=config_help)
    rec.add_argument("--work", required=True, metavar="DIR", help="where untuned files go")
    rec.add_argument("workload", nargs="*", metavar="-- COMMAND [ARG]", help=workload_help)

    tn = sub.add_parser("tune", help="de-duplicate untuned GEMMs and tune them")
    tn.add_argument("--config", metavar="FILE", help=config_help + "; limits and gpus")
    tn.add_argument("--untuned", nargs="+", required=True, metavar="FILE", help="untuned CSVs")
    tn.add_argument("--out", required=True, metavar="FILE", help="results CSV to write")
    tn.add_argument("--gpus", type=int, metavar="N", help="GPUs to tune on (default: config or 1)")
    tn.add_argument("--budget-seconds", type=float, metavar="S", help="wall-clock budget")

    sub.add_parser("identify", help="print this machine's GPU/software identity and validators")

    run = sub.add_parser("run", help="record, tune, identify; write results.csv + manifest.json")
    run.add_argument("--config", metavar="FILE", help=config_help)
    run.add_argument("--out", required=True, metavar="DIR", help="directory publish reads")
    run.add_argument("--work", metavar="DIR", help="scratch directory (default: a temp dir)")
    run.add_argument("workload", nargs="*", metavar="-- COMMAND [ARG]", help=workload_help)

    # Internal (no help= keeps them out of --help): the tuning process, its workers, the probe.
    child = sub.add_parser("_tune-child")
    child.add_argument("--spec", required=True)
    worker = sub.add_parser("_tune-worker")
    worker.add_argument("--spec", required=True)
    worker.add_argument("--gpu", type=int, required=True)
    probe_ = sub.add_parser("_probe")
    probe_.add_argument("--spec", required=True)
    measure_ = sub.add_parser("_measure-gemms")
    measure_.add_argument("--spec", required=True)
    return p


def _load(args: argparse.Namespace, *, optional: bool = False) -> TuningConfig:
    try:
        cfg = load_config(args.config)
    except ConfigError:
        if optional and not args.config and not os.environ.get("TUNEFLEET_TUNING_CONFIG"):
            return TuningConfig()
        raise
    argv = getattr(args, "workload", None)
    if not argv:
        return cfg
    if cfg.command:
        raise ConfigError(
            "the workload command is given twice: after -- and as workload.command in the config"
        )
    return dataclasses.replace(cfg, command=tuple(argv), args=())


def _record(
    cfg: TuningConfig, work: Path, deadline: float, cache_env: Mapping[str, str] | None = None
) -> tuple[list[UntunedRow], Path, Machine]:
    """Record into a new directory under ``work``: torch appends to an untuned file that is
    already there, so a reused directory would bring back the GEMMs of an earlier run.

    The probe child checks torch, the GPU and the shapes (a refusal costs no recording),
    records the shapes and reads the identity; then the workload runs. This process never
    touches the GPU (see machine.py)."""
    work.mkdir(parents=True, exist_ok=True)
    record_dir = Path(tempfile.mkdtemp(prefix="record-", dir=work))
    started = time.monotonic()
    try:
        machine = probe(
            work, gpus=cfg.gpus, shapes=cfg.shapes, record_dir=record_dir, limits=cfg.limits
        )
    except BaseException:
        shutil.rmtree(record_dir, ignore_errors=True)  # a refusal leaves nothing recorded
        raise
    _log(f"recording into {record_dir}")
    if cfg.command:
        record_workload(
            cfg.workload_argv, record_dir, deadline - time.monotonic(), extra_env=cache_env
        )
    found = collect_untuned(record_dir)
    for path, f in found:
        _log(f"{path.name}: {len(f.rows)} GEMM(s)")
        for warning in f.warnings(path.name):
            # One row torch's offline tuner could not rebuild must not cost the others.
            _log(f"warning: not tuning {warning}")
    recorded = dedupe_untuned([f for _, f in found])
    captured = _captured(cfg)
    unique = dedupe_untuned([f for _, f in found] + captured)
    if captured:
        _log(
            f"{len(unique) - len(recorded)} captured GEMM(s) added to the "
            f"{len(recorded)} recorded (of {sum(len(f.rows) for f in captured)} captured)"
        )
    if not unique:
        raise TunerError(
            "recording found no GEMMs: the workload ran no matmul through TunableOp on the GPU "
            "(is it using this torch, and the GPU?)"
        )
    _log(
        f"recorded {len(unique)} unique GEMM(s) in {len(found)} file(s) "
        f"in {time.monotonic() - started:.2f}s"
    )
    return unique, record_dir, machine


def _captured(cfg: TuningConfig) -> list[UntunedFile]:
    """The untuned files the config adds (a retune's production misses), read as torch's
    offline tuner would read them: a row it could not rebuild is left out, with why."""
    out = []
    for name in cfg.untuned_files:
        try:
            f = read_untuned(name)
        except OSError as exc:
            raise TunerError(f"cannot read the captured GEMMs {name}: {exc.strerror}") from None
        for warning in f.warnings(Path(name).name):
            _log(f"warning: not tuning captured {warning}")
        out.append(f)
    return out


def cmd_record(args: argparse.Namespace) -> int:
    cfg = _load(args)
    cfg.require_workload()
    deadline = time.monotonic() + cfg.limits.budget_seconds
    unique, record_dir, _ = _record(cfg, Path(args.work), deadline)
    print(f"{PROG}: recorded {len(unique)} unique GEMM(s) into {record_dir}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    cfg = _load(args, optional=True)
    gpus = args.gpus or cfg.gpus
    budget = args.budget_seconds or cfg.limits.budget_seconds
    files = []
    for path in args.untuned:
        f = read_untuned(path)
        for warning in f.warnings(str(path)):
            _log(f"warning: dropped {warning}")
        files.append(f)
    unique = dedupe_untuned(files)
    outcome = tune(unique, TuneRun(gpus, cfg.limits, budget))
    atomic_write_bytes(args.out, format_results(outcome.results).encode("utf-8"))
    _report_timing(outcome)
    _report_partial(outcome, outcome.results.gemms, len(unique))
    print(f"{PROG}: tuned {outcome.results.gemms} of {len(unique)} GEMM(s) into {args.out}")
    return 0


def cmd_identify(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="tunefleet-identify-") as work:
        machine = probe(Path(work), gpus=1)
    doc = {"identity": machine.identity, "validators": machine.validators}
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


def _report_timing(outcome: TuneOutcome) -> None:
    if outcome.loop_seconds is None:
        return
    _log(
        f"tuning loop: {outcome.loop_seconds:.2f}s of the tuning process's "
        f"{outcome.seconds:.2f}s (the rest is its start-up: interpreter, torch import, GPU "
        "initialisation, and its report)"
    )


def _report_partial(outcome: TuneOutcome, tuned: int, total: int) -> None:
    stopped = outcome.stopped_early
    for r in outcome.rejected:
        _log(f"warning: torch's offline tuner rejected {r['op']},{r['params']}: {r['error']}")
    if stopped or tuned < total:
        why = "the tuning budget ran out" if stopped else "torch skipped or rejected some"
        if outcome.rejected:
            why += f"; {len(outcome.rejected)} rejected"
        _log(f"warning: tuned {tuned} of {total} GEMM(s) ({why}); the rest run untuned")


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    cfg.require_identity()
    cfg.require_workload()
    shard = cfg.shard_index()
    exchange = Path(cfg.exchange_dir) if cfg.exchange_dir else None
    if exchange is not None:
        ex.begin(exchange)
    ok, newly = False, 0
    try:
        if cfg.tunableop:
            newly = _run(args, cfg, shard, exchange)
        else:
            _run_caches(args, cfg)
        ok = True
    finally:
        # Success or failure, the sidecar makes its final checkpoint upload when it sees this.
        if exchange is not None:
            try:
                ex.finish(exchange, ok, newly)
            except OSError as exc:
                _log(f"warning: cannot write {exchange / ex.TUNE_DONE}: {exc}")
    return 0


@dataclass
class _Plan:
    """This pod's share of the recorded GEMMs, and where each comes from."""

    share: list[UntunedRow]
    reused: ResultsFile  # library rows for GEMMs of the share
    resumed: ResultsFile  # checkpoint rows for the rest of the share
    to_tune: list[UntunedRow]  # the share's misses


def _plan(unique: list[UntunedRow], cfg: TuningConfig, shard: int, prior: ex.Prior) -> _Plan:
    # The shares partition what every pod of the Job records alike, not each pod's own view
    # of the misses: pods read the library at different moments and each has its own
    # checkpoint, so shares of their misses could disagree and leave a GEMM to nobody.
    share = partition(unique, cfg.shards)[shard] if cfg.shards > 1 else list(unique)
    keys = keys_of(share)
    # This Job's own checkpoint first: a retried pod resumes what it tuned (a stopped pod's
    # sidecar also adds those rows to the library, which is for other Jobs and revisions).
    resumed = rows_for(prior.checkpoint, keys)
    reused = rows_for(prior.library, keys - resumed.keys())
    done = reused.keys() | resumed.keys()
    return _Plan(share, reused, resumed, [r for r in share if r.key not in done])


def _run(args: argparse.Namespace, cfg: TuningConfig, shard: int, exchange: Path | None) -> int:
    """record, identify, reuse, tune the misses, write the output; returns GEMMs newly tuned."""
    started = time.monotonic()
    deadline = started + cfg.limits.budget_seconds
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tunefleet-work-"))
    outcome: TuneOutcome | None = None
    out = Path(args.out)
    try:
        unique, _, machine = _record(cfg, work, deadline, _prepare(cfg, work))
        packed = _pack(cfg, work / "caches", out)
        identity, validators = machine.identity, machine.validators
        settings = settings_of(cfg.limits, machine.applied)
        prior = ex.Prior()
        if exchange is not None:
            prior = _gather(exchange, cfg, machine.validators, identity, settings, deadline)
        plan = _plan(unique, cfg, shard, prior)
        if cfg.shards > 1 or exchange is not None:
            _log_plan(plan, cfg, shard)
        if plan.to_tune:
            outcome = _tune(plan, cfg, exchange, deadline)
    finally:
        if not args.work:  # a scratch directory of our own; --work is kept for inspection
            shutil.rmtree(work, ignore_errors=True)
    results, newly = _combine(plan, outcome, validators)
    manifest = write_output(
        out,
        results,
        cfg.artifact_id,
        RunFacts(
            recorded=len(unique),
            identity=identity,
            seconds=outcome.seconds if outcome is not None else 0.0,
            extra=ManifestExtra(
                reused=len(plan.reused.rows),
                resumed=len(plan.resumed.rows),
                newly_tuned=newly,
                library_key=library_key(cfg.gpu_model, results.validators, identity),
                shards=cfg.shards,
                shard=shard if cfg.shards > 1 else None,
                library=prior.library_info,
                resume=prior.resume_info,
                wall_seconds=time.monotonic() - started,
                settings=settings.to_dict(),
            ),
        ),
        caches=packed,
    )
    if outcome is not None:
        _report_timing(outcome)
        _report_partial(outcome, newly, len(plan.to_tune))
    manifest = _measured(cfg, out, manifest, packed[0])
    seconds = outcome.seconds if outcome is not None else 0.0
    print(
        f"{PROG}: recorded {len(unique)} GEMM(s), reused {len(plan.reused.rows)}, resumed "
        f"{len(plan.resumed.rows)}, tuned {newly} in {seconds:.1f}s; wrote "
        f"{out / RESULTS_NAME} ({results.gemms} GEMM(s), sha256 {manifest.results_sha256}) "
        f"and {out / MANIFEST_NAME}"
    )
    return newly


def _prepare(cfg: TuningConfig, work: Path) -> dict[str, str]:
    """Each cache's empty directory under work/caches, and the variables pointing at them."""
    try:
        return cc.prepare(cfg.caches, work / "caches") if cfg.caches else {}
    except cc.CacheError as exc:
        raise TunerError(str(exc)) from None


def _pack(cfg: TuningConfig, root: Path, out: Path) -> tuple[list[cc.Packed], list[cc.Skipped]]:
    """Each cache the workload filled, packed into the output; one that came out empty or
    failed is said (and listed in the manifest), never fatal: the others still serve."""
    packed: list[cc.Packed] = []
    skipped: list[cc.Skipped] = []
    for spec in cfg.caches:
        got = cc.pack(spec, root, out)
        if isinstance(got, cc.Skipped):
            _log(f"warning: cache {spec.name} ({spec.kind}) not served: {got.reason}")
            skipped.append(got)
        else:
            _log(
                f"cache {spec.name} ({spec.kind}): {got.files} file(s), {got.bytes} bytes, "
                f"packed to {got.size} bytes, sha256 {got.sha256}"
            )
            packed.append(got)
    return packed, skipped


_TORCH_PROBE = (
    "import json, torch\n"
    "d = {'torch': str(torch.__version__)}\n"
    "cuda = getattr(torch.version, 'cuda', None); hip = getattr(torch.version, 'hip', None)\n"
    "d.update({'cuda': str(cuda)} if cuda else {})\n"
    "d.update({'hip': str(hip)} if hip else {})\n"
    "print(json.dumps(d))\n"
)


def _torch_identity() -> dict[str, str]:
    """torch's version (and CUDA or HIP build) in this image, from a child that imports it
    (this process never does); empty, with a warning, where python3 has no torch."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=300
        )
        doc = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        doc = None
    if not isinstance(doc, dict):
        _log("warning: could not import torch to record its version: the manifest has none")
        return {}
    return {str(k): str(v) for k, v in doc.items()}


def _run_caches(args: argparse.Namespace, cfg: TuningConfig) -> None:
    """Caches without TunableOp results: run the workload once with every cache pointed at an
    empty directory, pack what it wrote, publish the index. No GPU search runs: what the
    workload computes at start is the artifact."""
    started = time.monotonic()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tunefleet-work-"))
    out = Path(args.out)
    try:
        env = _prepare(cfg, work)
        _log(f"running the workload to fill {', '.join(s.name for s in cfg.caches)}")
        run_workload(cfg.workload_argv, env, cfg.limits.budget_seconds)
        ran = time.monotonic() - started
        packed, skipped = _pack(cfg, work / "caches", out)
    except cc.CacheError as exc:
        raise TunerError(str(exc)) from None
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    if not packed:
        raise TunerError(
            "no cache to publish: " + "; ".join(f"{s.name}: {s.reason}" for s in skipped)
        )
    manifest = write_caches_output(
        out,
        packed,
        skipped,
        cfg.artifact_id,
        RunFacts(
            identity=_torch_identity(),
            seconds=ran,
            extra=ManifestExtra(wall_seconds=time.monotonic() - started),
        ),
    )
    manifest = _measured(cfg, out, manifest, packed)
    print(
        f"{PROG}: packed {len(packed)} cache(s) ({', '.join(p.name for p in packed)}), "
        f"{len(skipped)} skipped; wrote {out / cc.INDEX_NAME} (sha256 "
        f"{manifest.results_sha256}) and {out / MANIFEST_NAME}"
    )


def _measured(
    cfg: TuningConfig, out: Path, manifest: Manifest, packed: Sequence[cc.Packed]
) -> Manifest:
    """The manifest with what the artifact buys (spec.promotion; tuner_job/measure.py), written
    again; as it was when nothing is to be measured. Measuring never fails the run: what it
    could not do is said in the figures' note."""
    gain = measure.measure(cfg, out, packed, manifest.identity.get("torch", ""))
    if gain is None:
        return manifest
    return rewrite_manifest(out, replace(manifest, gain=gain))


def _gather(
    exchange: Path,
    cfg: TuningConfig,
    validators: dict[str, str],
    identity: Mapping[str, str],
    settings: Settings,
    deadline: float,
) -> ex.Prior:
    """What the sync sidecar found for this identity: the library's rows and this Job's own
    checkpoint (tuner_job/exchange.py), waited for until the budget allows."""
    key = library_key(cfg.gpu_model, validators, identity)
    me = ex.Whoami(cfg.gpu_model, validators, identity, key, settings.to_dict())
    wait_s = min(cfg.exchange_wait_s, max(deadline - time.monotonic(), 0.0))
    return ex.gather(exchange, me, wait_s=wait_s, log=_log)


def _tune(plan: _Plan, cfg: TuningConfig, exchange: Path | None, deadline: float) -> TuneOutcome:
    """Tune the plan's misses within what is left of the budget."""
    run = TuneRun(
        cfg.gpus,
        cfg.limits,
        deadline - time.monotonic(),
        progress=exchange / ex.PROGRESS_CSV if exchange is not None else None,
        # Rows from the library or checkpoint, or a shard's share, are worth publishing even
        # if torch tuned none of the misses.
        allow_empty=bool(plan.reused.rows or plan.resumed.rows) or cfg.shards > 1,
    )
    return tune(plan.to_tune, run)


def _log_plan(plan: _Plan, cfg: TuningConfig, shard: int) -> None:
    where = f"shard {shard} of {cfg.shards}: " if cfg.shards > 1 else ""
    _log(
        f"{where}{len(plan.share)} GEMM(s): {len(plan.reused.rows)} reused from the "
        f"library, {len(plan.resumed.rows)} resumed from the checkpoint, "
        f"{len(plan.to_tune)} to tune"
    )


def _combine(
    plan: _Plan, outcome: TuneOutcome | None, validators: dict[str, str]
) -> tuple[ResultsFile, int]:
    """The share's results: reused + resumed + newly tuned rows (disjoint GEMMs)."""
    newly = rows_for(outcome.results if outcome is not None else None, keys_of(plan.to_tune))
    prior_rows = plan.reused.rows or plan.resumed.rows
    if newly.rows and newly.validators != validators and prior_rows:
        # identify() in this process and the tuning process must agree: reused rows were
        # checked against the former, and TunableOp loads a file only if every one matches.
        raise TunerError(
            "torch reported other validators in the tuning process than before it "
            f"({newly.validators} vs {validators}): rows from the library or checkpoint "
            "cannot be published with its results"
        )
    parts = [p for p in (plan.reused, plan.resumed, newly) if p.rows]
    if not parts:
        return ResultsFile(dict(validators), []), 0
    return merge_results(parts), len(newly.rows)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 3000 else line[:2997] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {
        "record": cmd_record,
        "tune": cmd_tune,
        "identify": cmd_identify,
        "run": cmd_run,
    }
    try:
        if args.command == "_tune-child":
            return child_main(args.spec)
        if args.command == "_tune-worker":
            return worker_main(args.spec, args.gpu)
        if args.command == "_probe":
            return probe_main(args.spec)
        if args.command == "_measure-gemms":
            return measure.child_main(args.spec)
        return handlers[args.command](args)
    except (TunerError, ConfigError, CsvFormatError) as exc:
        code = exc.exit_code if isinstance(exc, TunerError) else EXIT_USAGE
        if isinstance(exc, CsvFormatError):
            code = 1
        message = _one_line(str(exc))
    except KeyboardInterrupt:
        message, code = "interrupted", 130
    except Exception as exc:
        traceback.print_exc()
        message, code = _one_line(f"internal error: {type(exc).__name__}: {exc}"), 1
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    if not args.command.startswith("_"):
        write_termination_log(args.termination_log, f"{PROG}: error: {message}")
    return code
