"""python -m tuner_job {record,tune,identify,run}: the tune container's entry point."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from ._fs import atomic_write_bytes, write_termination_log
from .config import ConfigError, TuningConfig
from .config import load as load_config
from .gpu import (
    EXIT_USAGE,
    TunerError,
    identify,
    import_torch,
    require_gpu,
    require_offline_api,
)
from .output import MANIFEST_NAME, RESULTS_NAME, write_output
from .record import check_shapes, collect_untuned, record_shapes, record_workload
from .results import CsvFormatError, UntunedRow, dedupe_untuned, format_results, read_untuned
from .tune import TuneOutcome, child_main, tune

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

    child = sub.add_parser("_tune-child")  # internal: no help= keeps it out of --help
    child.add_argument("--spec", required=True)
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


def _gpu(gpus: int) -> object:
    torch = import_torch()
    require_gpu(torch, gpus)
    require_offline_api(torch, gpus)
    return torch


def _record(
    cfg: TuningConfig, torch: object, work: Path, deadline: float
) -> tuple[list[UntunedRow], Path]:
    """Record into a new directory under ``work``: torch appends to an untuned file that is
    already there, so a reused directory would bring back the GEMMs of an earlier run."""
    check_shapes(torch, cfg.shapes)  # before anything runs: a refusal costs no recording
    work.mkdir(parents=True, exist_ok=True)
    record_dir = Path(tempfile.mkdtemp(prefix="record-", dir=work))
    _log(f"recording into {record_dir}")
    started = time.monotonic()
    if cfg.command:
        record_workload(cfg.workload_argv, record_dir, deadline - time.monotonic())
    if cfg.shapes:
        record_shapes(torch, cfg.shapes, record_dir)
    found = collect_untuned(record_dir)
    for path, f in found:
        _log(f"{path.name}: {len(f.rows)} GEMM(s)")
    unique = dedupe_untuned([f for _, f in found])
    if not unique:
        raise TunerError(
            "recording found no GEMMs: the workload ran no matmul through TunableOp on the GPU "
            "(is it using this torch, and the GPU?)"
        )
    _log(
        f"recorded {len(unique)} unique GEMM(s) in {len(found)} file(s) "
        f"in {time.monotonic() - started:.2f}s"
    )
    return unique, record_dir


def cmd_record(args: argparse.Namespace) -> int:
    cfg = _load(args)
    cfg.require_workload()
    torch = _gpu(cfg.gpus)
    deadline = time.monotonic() + cfg.limits.budget_seconds
    unique, record_dir = _record(cfg, torch, Path(args.work), deadline)
    print(f"{PROG}: recorded {len(unique)} unique GEMM(s) into {record_dir}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    cfg = _load(args, optional=True)
    gpus = args.gpus or cfg.gpus
    budget = args.budget_seconds or cfg.limits.budget_seconds
    _gpu(gpus)
    unique = dedupe_untuned([read_untuned(p) for p in args.untuned])
    outcome = tune(unique, gpus=gpus, limits=cfg.limits, budget_s=budget)
    atomic_write_bytes(args.out, format_results(outcome.results).encode("utf-8"))
    _report_timing(outcome)
    _report_partial(outcome.stopped_early, outcome.results.gemms, len(unique))
    print(f"{PROG}: tuned {outcome.results.gemms} of {len(unique)} GEMM(s) into {args.out}")
    return 0


def cmd_identify(args: argparse.Namespace) -> int:
    torch = import_torch()
    require_gpu(torch, 1)
    identity, validators = identify(torch)
    print(json.dumps({"identity": identity, "validators": validators}, indent=2, sort_keys=True))
    return 0


def _report_timing(outcome: TuneOutcome) -> None:
    if outcome.loop_seconds is None:
        return
    _log(
        f"tuning loop: {outcome.loop_seconds:.2f}s of the tuning process's "
        f"{outcome.seconds:.2f}s (the rest is its start-up: interpreter, torch import, GPU "
        "initialisation, and its report)"
    )


def _report_partial(stopped: bool, tuned: int, total: int) -> None:
    if stopped or tuned < total:
        why = "the tuning budget ran out" if stopped else "torch skipped or failed some"
        _log(f"warning: tuned {tuned} of {total} GEMM(s) ({why}); the rest run untuned")


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    cfg.require_identity()
    cfg.require_workload()
    started = time.monotonic()
    deadline = started + cfg.limits.budget_seconds
    torch = _gpu(cfg.gpus)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tunefleet-work-"))
    try:
        unique, _ = _record(cfg, torch, work, deadline)
        outcome = tune(
            unique, gpus=cfg.gpus, limits=cfg.limits, budget_s=deadline - time.monotonic()
        )
    finally:
        if not args.work:  # a scratch directory of our own; --work is kept for inspection
            shutil.rmtree(work, ignore_errors=True)
    if outcome.identity is not None:
        identity = outcome.identity
    else:  # the tuning process was stopped before it could describe the machine
        identity, _ = identify(torch)
    out = Path(args.out)
    manifest = write_output(
        out,
        outcome.results,
        namespace=cfg.namespace,
        profile=cfg.profile,
        revision=cfg.revision,
        gpu_model=cfg.gpu_model,
        recorded=len(unique),
        identity=identity,
        tuning_seconds=outcome.seconds,
    )
    _report_timing(outcome)
    _report_partial(outcome.stopped_early, outcome.results.gemms, len(unique))
    print(
        f"{PROG}: recorded {len(unique)} GEMM(s), tuned {outcome.results.gemms} in "
        f"{outcome.seconds:.1f}s; wrote {out / RESULTS_NAME} "
        f"(sha256 {manifest.results_sha256}) and "
        f"{out / MANIFEST_NAME}"
    )
    return 0


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
    if args.command != "_tune-child":
        write_termination_log(args.termination_log, f"{PROG}: error: {message}")
    return code
