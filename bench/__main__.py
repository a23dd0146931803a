"""`make bench`: tunefleet's benchmarks; figures to bench/results.json and, generated from it,
bench/results.md (each figure group with the commit and date of the run that made it).

    python -m bench                      every routine, in order (what `make bench` runs)
    python -m bench --only scale,gc      some routines
    python -m bench gc                   one routine (options: python -m bench <routine> --help)
    python -m bench scale --profiles 10000 --namespaces 100    one size of the scale routine
    python -m bench --list               the routines

The routines need the local control plane (started if needed), but those listed as "no
cluster" (nodemap, metrics, bids), which start none when run alone. Progress lines go to
stderr. This module imports nothing heavy before the arguments are read.
"""

from __future__ import annotations

import argparse
import sys

from bench.routines import ROUTINES


def _add_options(p: argparse.ArgumentParser, routine: str | None) -> None:
    """The options of one routine (all of them for a full run)."""
    every = routine is None
    if every or routine == "storm":
        p.add_argument("--kills", type=int, default=100, help="storm: SIGKILLs (%(default)s)")
    if every or routine == "churn":
        p.add_argument(
            "--churn-profiles", type=int, default=1000, help="churn: profiles (%(default)s)"
        )
        p.add_argument("--cycles", type=int, default=5, help="churn: cycles (%(default)s)")
    if every or routine == "artifacts":
        p.add_argument("--runs", type=int, default=7, help="artifacts: runs (%(default)s)")
    if every or routine == "nodemap":
        p.add_argument("--nodes", type=int, default=10_000, help="nodemap: nodes (%(default)s)")
    if every or routine == "bundles":
        p.add_argument(
            "--bundle-pods", type=int, default=5, help="bundles: pods per arm (%(default)s)"
        )
    if every or routine == "vllm":
        p.add_argument(
            "--vllm-pods", type=int, default=5, help="vllm: server pods per arm (%(default)s)"
        )
        p.add_argument(
            "--vllm-model",
            choices=("real", "tiny"),
            default="real",
            help="vllm: Qwen3-0.6B's architecture, or the image's 2-layer Llama (%(default)s)",
        )
    if every or routine == "large":
        p.add_argument(
            "--large-pods", type=int, default=3, help="large: fetching pods (%(default)s)"
        )
        p.add_argument(
            "--large-volume-pods",
            type=int,
            default=10,
            help="large: image-volume pods on the one node (%(default)s)",
        )
    if every or routine == "oci":
        p.add_argument("--oci-pods", type=int, default=20, help="oci: pods per burst (%(default)s)")
        p.add_argument("--oci-rounds", type=int, default=2, help="oci: rounds (%(default)s)")
    _add_fleet_trust_options(p, routine)
    if every or routine == "capture":
        p.add_argument(
            "--no-loop",
            dest="loop",
            action="store_false",
            help="capture: the sidecar's figures only, not the loop on the real node",
        )


def _add_fleet_trust_options(p: argparse.ArgumentParser, routine: str | None) -> None:
    """The options of the fleet's and trust's routines (issue 54's figures)."""
    every = routine is None
    if every or routine == "bids":
        p.add_argument(
            "--bid-trials", type=int, default=400, help="bids: trials per case (%(default)s)"
        )
    if every or routine == "trust":
        p.add_argument(
            "--pin-writers",
            type=int,
            default=100,
            help="trust: concurrent pin writers (%(default)s)",
        )
        p.add_argument(
            "--trust-pods",
            type=int,
            default=50,
            help="trust: pods at once on the slowed registry's volume models (%(default)s)",
        )
    if every or routine == "broker":
        p.add_argument(
            "--broker-rounds", type=int, default=2, help="broker: rounds per arm (%(default)s)"
        )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="tunefleet's benchmarks (make bench): figures to bench/results.json and "
        "bench/results.md, each group stamped with the commit and date of its run.",
    )
    p.add_argument(
        "--only",
        metavar="ROUTINES",
        help="comma-separated routines to run (default: all, in the order listed)",
    )
    p.add_argument("--list", action="store_true", help="list the routines and exit")
    _add_options(p, None)
    sub = p.add_subparsers(dest="routine", metavar="ROUTINE")
    for name, what in ROUTINES.items():
        if name == "scale":
            # Its own parser (bench/bench_scale.py): sizes, profilers, --create, --no-write.
            sub.add_parser(name, help=what + " (python -m bench scale --help)", add_help=False)
            continue
        _add_options(sub.add_parser(name, help=what, description=what), name)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["scale"]:
        from bench import bench_scale

        bench_scale.main(argv[1:])
        return
    args = parser().parse_args(argv)
    if args.list:
        for name, what in ROUTINES.items():
            print(f"{name:<10} {what}")
        return
    if args.routine:
        only = [args.routine]
    elif args.only:
        only = [r.strip() for r in args.only.split(",") if r.strip()]
        unknown = [r for r in only if r not in ROUTINES]
        if unknown:
            parser().error(f"unknown routine(s) {unknown}; choose from {list(ROUTINES)}")
        only = [r for r in ROUTINES if r in only]  # the full run's order
    else:
        only = list(ROUTINES)
    defaults = {
        "kills": 100, "churn_profiles": 1000, "cycles": 5, "runs": 7, "nodes": 10_000,
        "bundle_pods": 5, "vllm_pods": 5, "vllm_model": "real", "large_pods": 3, "large_volume_pods": 10, "oci_pods": 20, "oci_rounds": 2,
        "bid_trials": 400, "pin_writers": 100, "trust_pods": 50,
    }  # fmt: skip
    options = {**defaults, "loop": True, **vars(args)}

    from bench import suite  # the cluster, kubernetes and the test support: only now

    suite.run_parts(only, options)


if __name__ == "__main__":
    main()
