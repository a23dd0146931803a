"""kubectl-tunefleet: the CLI (argument parsing, reads, output); the reports are pure modules.

Exit status: 0 on success; 1 on an error (one line on stderr: what happened, what to do);
2 on a usage error. `diff` exits like diff(1) and `kubectl diff`: 0 when A and B are the
same, 1 when they differ, 2 on an error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from tunefleet import __version__
from tunefleet.artifacts.fetch import MAX_DEVICES
from tunefleet.contracts import pin as pins

from . import cluster as cluster_mod
from .artifacts import (
    S3Options,
    download,
    format_download,
    load_side,
    not_found_profile,
)
from .diff_cmd import diff_results, format_diff, parse_ref, side_gain
from .errors import PluginError
from .retune_cmd import format_retune, retune_patch, retune_request
from .rollback_cmd import (
    choose,
    format_rollback,
    format_unpin,
    rollback_pins,
    sha_prefix,
    unpin_request,
)
from .status_cmd import format_status, status_report
from .version_cmd import SELECTOR, format_version, version_report
from .why_cmd import explain, format_why

PROG = "kubectl-tunefleet"
DEBUG_ENV = "KUBECTL_TUNEFLEET_DEBUG"  # set to 1: unexpected errors print their traceback


class UsageError(PluginError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other error (argparse would print the usage block first).
        if message.endswith("required: command"):
            message = (
                "name a command: status, why, download, diff, retune, rollback, unpin or version"
            )
        sub = self.prog.split()[2:]  # "kubectl tunefleet <command>"
        raise UsageError(f"{message}: see `kubectl tunefleet {' '.join([*sub, '--help'])}`")


def _devices(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_DEVICES:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_DEVICES}, got {text!r}")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: the flags may come before or after the subcommand without one undoing the other.
    s = argparse.SUPPRESS
    p.add_argument("-n", "--namespace", default=s, help="namespace (default: the context's)")
    p.add_argument("--kubeconfig", default=s, help="kubeconfig file (default: $KUBECONFIG)")
    p.add_argument("--context", default=s, help="kubeconfig context (default: the current one)")
    p.add_argument(
        "-o", "--output", default=s, choices=["text", "json"], help="text (default) or json"
    )


def _s3(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--endpoint-url",
        help="S3 endpoint (default: $AWS_ENDPOINT_URL_S3, else the profile's "
        "spec.storage.endpoint, else AWS)",
    )
    p.add_argument("--region", help="S3 region (default: the profile's, else $AWS_REGION)")
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds for all store reads (default 60)"
    )
    p.add_argument(
        "--pvc-root",
        default=S3Options.pvc_root,
        help="where a pvc:// store's claim is mounted on this machine (default: %(default)s)",
    )


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kubectl tunefleet",
        description="Inspect tunefleet TuningProfiles and their artifacts.",
    )
    p.add_argument("--version", action="version", version=f"kubectl-tunefleet {__version__}")
    _common(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    st = sub.add_parser("status", help="a profile's phase, conditions, artifacts, Jobs, Events")
    st.add_argument("profile")
    why = sub.add_parser("why", help="whether a pod got its artifact, why (not), and the fix")
    why.add_argument("pod")
    dl = sub.add_parser(
        "download", help="fetch and verify a profile's current artifact into a directory"
    )
    dl.add_argument("profile")
    dl.add_argument("--gpu-model", help="required when the profile tunes several models")
    dl.add_argument("--dest", required=True, help="directory for the files")
    dl.add_argument(
        "--devices",
        type=_devices,
        default=1,
        metavar="N",
        help="results files to write, one per GPU ordinal (default 1)",
    )
    _s3(dl)
    df = sub.add_parser(
        "diff",
        help="GEMMs added, removed and changed between two artifacts",
        description="A and B: s3://.../<sha256>, a local directory (results.csv or "
        "tunableop_results0.csv) or CSV file, or [namespace/]profile[:gpuModel] (its current "
        "artifact). Exits 0 when they are the same, 1 when they differ, 2 on an error.",
    )
    df.add_argument("a", metavar="A")
    df.add_argument("b", metavar="B")
    _s3(df)
    rt = sub.add_parser(
        "retune",
        help="retune a profile now from its captured misses (whatever spec.capture.retune says)",
        description="Asks the operator to tune the captured shapes the current artifact lacks "
        "(status.capture), once, by annotating the profile (tunefleet.io/retune). It starts "
        "when the GPU model's tuning is settled; `kubectl tunefleet status` shows it.",
    )
    rt.add_argument("profile")
    rt.add_argument("--gpu-model", default="", help="only this GPU model (default: every one)")
    rb, up = _rollback_parsers(sub)
    ver = sub.add_parser(
        "version",
        help="this client's version and the operator's (read from the cluster)",
        description="Prints this client's version, then each tunefleet operator release the "
        "context can see: its version (the chart's app.kubernetes.io/version label on the "
        "operator Deployments), namespace, ready replicas and image. Looks in every namespace, "
        "or only in -n NAMESPACE. No operator found is said, not an error (exit 0).",
    )
    ver.add_argument(
        "--client", action="store_true", help="only this client's version (no cluster needed)"
    )
    for sp in (st, why, dl, df, rt, rb, up, ver):
        _common(sp)
    return p


def _to(text: str) -> str:
    try:
        return sha_prefix(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _reason(text: str) -> str:
    # Checked here rather than cut: the annotation keeps REASON_LIMIT characters, and a reason
    # cut short without a word could say something else.
    if len(text) > pins.REASON_LIMIT:
        raise argparse.ArgumentTypeError(f"at most {pins.REASON_LIMIT} characters")
    return " ".join(text.split())


def _rollback_parsers(sub: Any) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    rb = sub.add_parser(
        "rollback",
        help="serve an earlier artifact of the same revision (a pin), not the newest that passed",
        description="Pins a GPU model to an earlier artifact of the revision it tunes now (the "
        "newest one in status.history that the promotion gate did not reject, or --to), by "
        "annotating the profile (tunefleet.io/pin); the operator serves it until `kubectl "
        "tunefleet unpin`.",
    )
    rb.add_argument("profile")
    rb.add_argument("--gpu-model", default="", help="required when several models are served")
    rb.add_argument(
        "--to", type=_to, default=None, metavar="SHA256", help="this artifact (7+ hex digits)"
    )
    rb.add_argument("--reason", type=_reason, default="", help="why, kept with the pin")
    rb.add_argument(
        "--force", action="store_true", help="serve an artifact the promotion gate rejected"
    )
    up = sub.add_parser(
        "unpin",
        help="return to the newest artifact that passed the gate (undo rollback)",
        description="Removes the pin of --gpu-model (default: every pin) from the profile's "
        "tunefleet.io/pin annotation. Nothing pinned is said, not an error (exit 0).",
    )
    up.add_argument("profile")
    up.add_argument("--gpu-model", default="", help="only this GPU model (default: every one)")
    return rb, up


def _opt(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, None)


Connect = Callable[[str | None, str | None, str | None], cluster_mod.Cluster]


def _connect(args: argparse.Namespace) -> cluster_mod.Cluster:
    connect: Connect = _opt(args, "connect") or cluster_mod.connect
    return connect(_opt(args, "kubeconfig"), _opt(args, "context"), _opt(args, "namespace"))


def _s3_options(args: argparse.Namespace) -> S3Options:
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    return S3Options(args.endpoint_url, args.region, args.timeout, args.pvc_root)


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    if _opt(args, "output") == "json":
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(text)


def _version(args: argparse.Namespace) -> int:
    if args.client:
        report = version_report([])
        report["operators"] = None
        _emit(args, report, format_version(report))
        return 0
    namespace = _opt(args, "namespace")  # given: that namespace only; else every one
    try:
        kube = _connect(args)
        deployments = kube.deployments(namespace, SELECTOR)
    except PluginError as e:
        if _opt(args, "output") != "json":
            # The client's version still, as `kubectl version` prints it before the server's.
            client_only = {"client": {"version": __version__}, "operators": None}
            sys.stdout.write(format_version(client_only))
        if namespace is None and "not allowed to read Deployments" in str(e):
            raise PluginError(
                f"{e} (or name the operator's namespace: kubectl tunefleet version -n NAMESPACE)"
            ) from None
        raise
    report = version_report(deployments, namespace)
    _emit(args, report, format_version(report))
    return 0


def run(args: argparse.Namespace) -> int:
    """One subcommand; its exit status."""
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "version": _version,
        "status": _status,
        "why": _why,
        "retune": _retune,
        "rollback": _rollback,
        "unpin": _unpin,
        "download": _download,
        "diff": _diff,
    }
    return commands[args.command](args)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _profile(args: argparse.Namespace) -> tuple[cluster_mod.Cluster, dict[str, Any]]:
    """The cluster, and the profile args name in its namespace (or the error that says how to
    find one)."""
    kube = _connect(args)
    profile = kube.profile(kube.namespace, args.profile)
    if profile is None:
        raise not_found_profile(args.profile, kube.namespace)
    return kube, profile


def _status(args: argparse.Namespace) -> int:
    kube, profile = _profile(args)
    report = status_report(profile, kube.profile_events(profile))
    _emit(args, report, format_status(report, _now()))
    return 0


def _why(args: argparse.Namespace) -> int:
    kube = _connect(args)
    pod = kube.pod(kube.namespace, args.pod)
    if pod is None:
        raise PluginError(
            f"Pod {args.pod!r} not found in namespace {kube.namespace!r}: list them with "
            f"`kubectl get pods -n {kube.namespace}`"
        )
    from tunefleet import naming

    name = ((pod.get("metadata") or {}).get("labels") or {}).get(naming.PROFILE_LABEL)
    profile = kube.profile(kube.namespace, name) if name else None
    events = kube.profile_events(profile) if profile else []
    report = explain(pod, profile, events)
    _emit(args, report, format_why(report, _now()))
    return 0


def _update(
    args: argparse.Namespace,
    change: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any] | None]],
) -> dict[str, Any]:
    """change's report, its patch written with the resourceVersion it was computed from
    (plugin/cluster.py: a concurrent writer's change is read again, never overwritten)."""
    kube = _connect(args)
    done = kube.update_profile(kube.namespace, args.profile, change)
    if done is None:
        raise not_found_profile(args.profile, kube.namespace)
    return done[0]


def _retune(args: argparse.Namespace) -> int:
    def change(profile: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        report = retune_request(profile, args.gpu_model)
        return report, retune_patch(profile, report)

    report = _update(args, change)
    _emit(args, report, format_retune(report))
    return 0


def _rollback(args: argparse.Namespace) -> int:
    def change(profile: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        report = choose(profile, args.gpu_model, args.to or "", args.force)
        pinned = rollback_pins(profile, report, args.reason, pins.now())
        report["pin"] = pinned[report["gpuModel"]].to_dict()
        return report, pins.patch(pinned)

    report = _update(args, change)
    _emit(args, report, format_rollback(report))
    return 0


def _unpin(args: argparse.Namespace) -> int:
    report = _update(args, lambda profile: unpin_request(profile, args.gpu_model))
    _emit(args, report, format_unpin(report))
    return 0


def _download(args: argparse.Namespace) -> int:
    opts = _s3_options(args)
    _, profile = _profile(args)
    report = download(profile, args.gpu_model, Path(args.dest), args.devices, opts)
    _emit(args, report, format_download(report))
    return 0


def _diff(args: argparse.Namespace) -> int:
    """0 when the two sides hold the same results, 1 when they differ (as diff(1))."""
    opts = _s3_options(args)
    try:
        refs = [parse_ref(args.a), parse_ref(args.b)]
    except ValueError as e:
        raise UsageError(str(e)) from None
    connected: list[cluster_mod.Cluster] = []

    def lazy() -> cluster_mod.Cluster:
        # Only profile references need the API server: diffing two URIs works without one.
        if not connected:
            connected.append(_connect(args))
        return connected[0]

    (ra, side_a), (rb, side_b) = (load_side(r, lazy, opts) for r in refs)
    for ref, side in zip(refs, (side_a, side_b), strict=True):
        if ref.kind == "profile":
            # What an artifact buys is in the profile's status, not in the store: read it again
            # (load_side keeps only what the results need) and find the same SHA-256 there.
            kube = lazy()
            side.update(side_gain(side, kube.profile(ref.namespace or kube.namespace, ref.name)))
    report = {"a": side_a, "b": side_b, **diff_results(ra, rb)}
    _emit(args, report, format_diff(report))
    return 0 if report["summary"]["identical"] else 1


def main(argv: Sequence[str] | None = None, connect: Connect | None = None) -> int:
    """kubectl-tunefleet; `connect(kubeconfig, context, namespace)` makes its cluster client
    (cluster.connect; unit tests hand in a stand-in)."""
    command = ""
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        args.connect = connect
        command = args.command
        return run(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except PluginError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2 if command == "diff" else 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug: still one line, the traceback on request
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        print(
            f"{PROG}: error: internal error ({reason}): rerun with {DEBUG_ENV}=1 for the "
            "traceback and report it",
            file=sys.stderr,
        )
        return 2 if command == "diff" else 1


if __name__ == "__main__":
    sys.exit(main())
