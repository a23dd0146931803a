"""`tunefleet-operator`: run the operator (kopf) against the current kubeconfig or cluster."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import kopf

# The allocator the operator runs under, unless the environment names its own. glibc's malloc
# for every object (PYTHONMALLOC=malloc), so that malloc_trim hands back each freed page: under
# pymalloc a 1 MiB arena stays while any small object in it lives, and after a restart's list
# or the deletion of thousands of profiles most arenas kept one. Two glibc arenas rather than
# eight per core: each thread (reflectors, workers, the webhook) would keep freed memory in
# an arena of its own. And a fixed mmap threshold (glibc's starting one, 128 KiB): glibc raises
# it after each large free, so list pages and watch buffers came to live in the heap, where
# what they leave behind is not handed back. Measured in bench/scale.md.
ALLOCATOR_ENV = {
    "PYTHONMALLOC": "malloc",
    "MALLOC_ARENA_MAX": "2",
    "MALLOC_MMAP_THRESHOLD_": "131072",
}


def _with_allocator() -> None:
    """Start again (same process, exec) under ALLOCATOR_ENV: both are read only as the
    interpreter and libc start. The command line stays what it was (`python
    .../tunefleet-operator ARGS`, or `python -m tunefleet ARGS`): what ps, pkill and the
    tests find the operator by."""
    missing = {k: v for k, v in ALLOCATOR_ENV.items() if k not in os.environ}
    if not missing:
        return
    script = sys.argv[0]
    if not script or os.path.basename(script) == "__main__.py" or not os.path.isfile(script):
        how = ["-m", "tunefleet"]  # started as a module (the script itself is the package's)
    else:
        how = [script]  # the console script, run again by the same interpreter
    os.execve(sys.executable, [sys.executable, *how, *sys.argv[1:]], {**os.environ, **missing})


def main() -> None:
    _with_allocator()
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
