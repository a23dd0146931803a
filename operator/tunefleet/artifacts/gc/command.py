"""The command line of tunefleet-gc: its arguments, checked before any request is made; one
run (read the fleet, open and list the store, decide, then apply or report); and the exit
status: 0 done, 1 an expected failure, 2 a bad argument, each failure one line on stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tunefleet.storage import cli_flags as storage_cli
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import open_store, parse_uri
from tunefleet.storage.store import Location, Store, StoreError, StoreOptions, check_key_parts

from .apply_plan import apply
from .common import PROG, GcError, UsageError, duration_text, store_uri
from .fleet_state import read_pinned, read_profiles
from .plan import DEFAULT_GRACE_S, DEFAULT_KEEP, Rules
from .report import report_lines
from .rules import collect

# --apply refuses a shorter grace: a publish runs up to ~4 minutes between its results.csv and
# its manifest (the imageID wait), a library read takes up to 240 s, and the operator writes an
# artifact into status only after publish ends.
MIN_APPLY_GRACE_S = 600.0
_DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")


def parse_duration(text: str) -> float:
    """Seconds of "90s", "15m", "6h", "2d" or a bare number of seconds."""
    m = _DURATION_RE.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a duration such as 90s, 15m, 6h or 2d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


_HELP = {
    "uri": "the store: s3://bucket/prefix, pvc://claim/prefix or file:///dir (what the "
    "profiles' spec.storage.uri says)",
    "apply": "write and delete (default: report only)",
    "keep": "unreferenced artifacts kept per (namespace, profile, GPU model), newest first "
    "(default: %(default)s)",
    "grace": "nothing younger is deleted (90s, 15m, 6h, 2d; default: %(default)s; --apply "
    f"needs at least {duration_text(MIN_APPLY_GRACE_S)})",
    "namespace": "read profiles and collect artifacts only in this namespace (repeatable; "
    "default: all); the cluster-scope library is compacted either way",
    "kubeconfig": "default: $KUBECONFIG, ~/.kube/config, else in-cluster",
    "context": "the kubeconfig context (default: its current one)",
    "unused-store-ok": "apply even though no profile names this store in spec.storage.uri (a "
    "wrong --context or --uri would make everything here look unreferenced, so --apply "
    "refuses that by default)",
    "verbose": "list every object to delete",
    "no-publish-in-flight": "allow --apply with a --grace under "
    f"{duration_text(MIN_APPLY_GRACE_S)}: only while no tuning Job, merge Job or library "
    "reader runs against this store in any cluster that shares it (tuning paused, a "
    "maintenance window), since a shorter grace would race their uploads",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Delete what the artifact store no longer needs and compact each GEMM "
        "library. A dry run unless --apply: it reports what it would delete and why.",
    )
    h = _HELP
    p.add_argument("--uri", required=True, help=h["uri"])
    p.add_argument("--apply", action="store_true", help=h["apply"])
    p.add_argument("--keep", type=int, metavar="N", default=DEFAULT_KEEP, help=h["keep"])
    grace = duration_text(DEFAULT_GRACE_S)
    p.add_argument("--grace", metavar="DURATION", default=grace, help=h["grace"])
    p.add_argument(
        "--namespace", action="append", dest="namespaces", metavar="NS", help=h["namespace"]
    )
    p.add_argument("--kubeconfig", metavar="FILE", help=h["kubeconfig"])
    p.add_argument("--context", metavar="NAME", help=h["context"])
    p.add_argument("--unused-store-ok", action="store_true", help=h["unused-store-ok"])
    p.add_argument("--no-publish-in-flight", action="store_true", help=h["no-publish-in-flight"])
    p.add_argument("-v", "--verbose", action="store_true", help=h["verbose"])
    storage_cli.add_arguments(p, timeout_s=3600.0)
    return p


@dataclass(frozen=True)
class Args:
    location: Location
    rules: Rules
    namespaces: list[str] | None
    options: StoreOptions


def check_args(args: argparse.Namespace) -> Args:
    """Everything the command line can get wrong, before any request is made."""
    try:
        location = parse_uri(args.uri)
        grace = parse_duration(args.grace)
        for ns in args.namespaces or []:
            check_key_parts(ns, "x", "x")
    except ValueError as e:
        raise UsageError(f"{e}: fix the argument") from None
    if args.keep < 0:
        raise UsageError(f"--keep {args.keep} is negative: give 0 or more")
    if args.apply and grace < MIN_APPLY_GRACE_S and not args.no_publish_in_flight:
        raise UsageError(
            f"--grace {args.grace} is under {duration_text(MIN_APPLY_GRACE_S)}: with --apply it "
            "would race publishes in flight (up to ~4 minutes between their two uploads) and "
            "library readers (240 s); give a longer --grace, or say --no-publish-in-flight "
            "when none runs against this store in any cluster"
        )
    rules = Rules(keep=args.keep, grace_s=grace)
    return Args(location, rules, args.namespaces, storage_cli.options(args))


def open_checked(location: Location, options: StoreOptions) -> Store:
    """The store; a directory that is not there is an error (it would list as empty)."""
    store = open_store(location, options)
    if isinstance(store, DirStore) and not store.root.is_dir():
        raise GcError(
            f"{store_uri(location)}: {store.root} is not a directory: check --uri/--pvc-root"
        )
    return store


def run(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    a = check_args(args)
    profiles = read_profiles(args.kubeconfig, args.context, a.namespaces)
    pinned = read_pinned(args.kubeconfig, args.context, a.namespaces)
    store = open_checked(a.location, a.options)
    plan = collect(store, a.location, profiles, a.rules, a.namespaces, pinned)
    if args.apply and plan.deletes and not plan.using_store and not args.unused_store_ok:
        raise GcError(
            f"refusing to apply: none of the {plan.profiles} profiles read names "
            f"{store_uri(a.location)} in spec.storage.uri, so nothing there looks referenced "
            "(a wrong --context or --uri?); check with a dry run, then pass --unused-store-ok "
            "if so"
        )
    mode = "applying" if args.apply else "dry run, nothing is deleted (--apply deletes)"
    out(f"{PROG}: {store_uri(a.location)}: {mode}")
    if args.apply:
        apply(plan, store, out)
    for line in report_lines(plan, applied=args.apply, verbose=args.verbose):
        out(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def out(line: str) -> None:
        print(line, flush=True)

    try:
        return run(args, out)
    except GcError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except StoreError as e:
        line = " ".join(str(e).split())
        fix = "check --uri, the endpoint and the credentials"
        print(f"{PROG}: error: {line}: {fix}", file=sys.stderr)
        return 1
