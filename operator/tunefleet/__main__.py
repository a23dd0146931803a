"""`tunefleet-operator`: run the operator (kopf) against the current kubeconfig or cluster."""

from __future__ import annotations

import argparse
import logging
import os

import kopf


def main() -> None:
    parser = argparse.ArgumentParser(prog="tunefleet-operator", description=__doc__)
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: all namespaces "
        "(or TUNEFLEET_NAMESPACES, comma-separated)",
    )
    parser.add_argument(
        "--liveness",
        default=os.environ.get("TUNEFLEET_LIVENESS", ""),
        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    namespaces = args.namespace or [
        n for n in os.environ.get("TUNEFLEET_NAMESPACES", "").split(",") if n
    ]

    import tunefleet.handlers  # noqa: F401  (registers the handlers with kopf)

    kopf.configure(verbose=args.verbose)
    if not args.verbose:
        # "Handler 'job_event' succeeded." for every watch event is noise at this scale: the
        # reconciler logs what it does; kopf's warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        # One access line per admission besides ours ("admission pod ...: injected in ms").
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    kopf.run(
        standalone=True,  # one replica; no peering CRD to install
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness or None,
    )


if __name__ == "__main__":
    main()
