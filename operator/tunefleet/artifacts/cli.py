"""What the artifact CLIs (publish, merge, fetch, sync) share: where an artifact lives, the
termination log, and the one way they end (a JSON line, or one error line)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunefleet.storage import cli_flags as storage_cli
from tunefleet.storage.store import StoreError
from tuner_job.files import write_termination_log
from tuner_job.manifest import ManifestError

from . import fit

TERMINATION_LIMIT = 4096  # bytes Kubernetes keeps of a termination message


def add_where(p: argparse.ArgumentParser) -> None:
    """The artifact's place: a store URI and (namespace, profile, GPU model)."""
    p.add_argument(
        "--uri", required=True, help="s3://bucket/prefix, pvc://claim/prefix or file:///dir"
    )
    p.add_argument("--namespace", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--gpu-model", required=True)


def add_fit(p: argparse.ArgumentParser) -> None:
    """What the artifact must fit (fit.py): the GPU model's vendor and whether it is a
    stand-in. The operator's Job passes both; without --gpu-vendor the vendor rules are
    skipped (a Job made before them)."""
    p.add_argument("--gpu-vendor", choices=sorted(fit.VENDORS), help="the GPU model's vendor")
    p.add_argument(
        "--stand-in-model",
        action="store_true",
        help="the GPU model names no real GPU (tests, demos): stand-in torch output fits it",
    )


def target(args: argparse.Namespace) -> fit.Target:
    """The target of add_fit's arguments. A command from before them (no --gpu-vendor) does
    not say whether its model is a stand-in either (None: that rule is skipped), unless the
    model's name does."""
    stand_in: bool | None = args.stand_in_model or fit.is_stand_in_model(args.gpu_model)
    if not stand_in and not args.gpu_vendor:
        stand_in = None
    return fit.Target(args.gpu_model, args.gpu_vendor or "", stand_in)


def add_identity(p: argparse.ArgumentParser) -> None:
    """What the artifact is tuned for (naming.identity_document): the operator writes it into
    the tuning ConfigMap, publish and merge into the manifest, where the signature covers it."""
    p.add_argument(
        "--identity-file",
        type=Path,
        help="JSON document of what the artifact is tuned for (into the manifest's fleetIdentity)",
    )


def identity(path: Path | None, prog: str) -> dict[str, Any] | None:
    """The identity document at `path`; None (said on stderr) when it is not there or not a
    JSON object: the artifact then serves its own profile as always, and no fleet adopts it
    (failing the Job would leave the profile unserved for a document only adoption reads)."""
    if path is None:
        return None
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        print(f"{prog}: warning: no identity document ({exc}): no fleet adopts this artifact",
              file=sys.stderr)  # fmt: skip
        return None
    if not isinstance(doc, dict):
        print(f"{prog}: warning: {path} is not a JSON object: no fleet adopts this artifact",
              file=sys.stderr)  # fmt: skip
        return None
    return doc


def add_common(p: argparse.ArgumentParser, *, timeout_s: float) -> None:
    storage_cli.add_arguments(p, timeout_s=timeout_s)
    p.add_argument("--termination-log", default="/dev/termination-log")


def finish(
    prog: str, termination_log: str, run: Callable[[], str], errors: tuple[type[Exception], ...]
) -> int:
    """Run; its message (the record) goes to stdout and the termination log. An expected
    failure is one line there instead, and exit status 1."""
    caught: tuple[type[Exception], ...] = (StoreError, ManifestError, *errors)
    try:
        message = run()
    except caught as exc:
        line = " ".join(str(exc).split())
        print(f"{prog}: error: {line}", file=sys.stderr)
        write_termination_log(termination_log, f"{prog}: error: {line}"[:TERMINATION_LIMIT])
        return 1
    write_termination_log(termination_log, message)
    print(message)
    return 0
