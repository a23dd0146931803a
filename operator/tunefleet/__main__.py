"""`tunefleet-operator`: run the operator (kopf) against the current kubeconfig or cluster."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import sysconfig
from collections.abc import Mapping

import kopf

from tunefleet import __version__

# The allocator the operator runs under, unless the environment names its own. Every object
# through malloc (PYTHONMALLOC=malloc), so that freed memory can go back to the system: under
# pymalloc a 1 MiB arena stays while any small object in it lives, and after a restart's list
# or the deletion of thousands of profiles most arenas kept one.
#
# jemalloc where it is installed (the image has Debian's libjemalloc2; LD_PRELOAD, read as the
# process starts): its size classes keep objects of a size together in slabs and hand emptied
# ones back (a background thread, dirty pages after 1 s, and at each housekeeping pass). Under
# glibc the survivors of a deletion pinned the small free chunks between them (33k chunks of
# ~1.8 KB at 3,000 deleted profiles), which malloc_trim cannot hand back: after deletion 1.21
# of the empty operator at 3,000 under glibc, 1.08 under jemalloc (bench/scale.md). One arena
# and no thread caches: the GIL lets one thread allocate at a time, so more arenas only split
# the same objects over more half-used slabs, and an idle thread's cache keeps what the burst
# freed (and the slabs it sits in) until that thread allocates again.
#
# Without jemalloc (or TUNEFLEET_ALLOCATOR=glibc): glibc with two arenas and a fixed mmap
# threshold (glibc's starting one, 128 KiB): glibc raises it after each large free, so list
# pages and watch buffers came to live in the heap, where what they leave behind is not handed
# back.
JEMALLOC = "libjemalloc.so.2"
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1,tcache:false"
GLIBC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
ALLOCATORS = ("auto", "jemalloc", "glibc")


def jemalloc_path() -> str | None:
    """Debian's libjemalloc2 (or a distribution's under lib64 or /usr/local), if installed."""
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    for where in (f"/usr/lib/{arch}", "/usr/lib64", "/usr/lib", "/usr/local/lib"):
        path = os.path.join(where, JEMALLOC)
        if os.path.isfile(path):
            return path
    return None


def allocator_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What the environment lacks of the allocator's settings (empty: nothing to do). A
    variable the environment sets is kept; an LD_PRELOAD of anything else means glibc's
    settings only (the preloaded library is the user's choice)."""
    choice = environ.get("TUNEFLEET_ALLOCATOR", "auto")
    if choice not in ALLOCATORS:
        raise SystemExit(
            f"tunefleet-operator: TUNEFLEET_ALLOCATOR={choice!r} is not one of "
            f"{', '.join(ALLOCATORS)}"
        )
    want = {"PYTHONMALLOC": "malloc"}
    preload = environ.get("LD_PRELOAD", "")
    lib = jemalloc_path() if choice != "glibc" and not preload else None
    if choice == "jemalloc" and lib is None and JEMALLOC not in preload:
        raise SystemExit(
            f"tunefleet-operator: TUNEFLEET_ALLOCATOR=jemalloc but {JEMALLOC} is not installed "
            "(Debian: apt-get install libjemalloc2), or LD_PRELOAD names another library"
        )
    if JEMALLOC in preload or lib is not None:
        want["MALLOC_CONF"] = JEMALLOC_CONF
        if lib is not None:
            want["LD_PRELOAD"] = lib
    else:
        want.update(GLIBC_ENV)
    return {k: v for k, v in want.items() if k not in environ}


def _with_allocator() -> None:
    """Start again (same process, exec) under allocator_env: all of it is read only as the
    dynamic loader, libc and the interpreter start. The command line stays what it was
    (`python .../tunefleet-operator ARGS`, or `python -m tunefleet ARGS`): what ps, pkill and
    the tests find the operator by."""
    missing = allocator_env(os.environ)
    if not missing:
        return
    script = sys.argv[0]
    if not script or os.path.basename(script) == "__main__.py" or not os.path.isfile(script):
        how = ["-m", "tunefleet"]  # started as a module (the script itself is the package's)
    else:
        how = [script]  # the console script, run again by the same interpreter
    os.execve(sys.executable, [sys.executable, *how, *sys.argv[1:]], {**os.environ, **missing})


def startup_line(environ: Mapping[str, str]) -> str:
    """The operator's first log line: its release (what `kubectl tunefleet version` and the
    chart's app.kubernetes.io/version label say) and the allocator it runs under."""
    allocator = "jemalloc" if JEMALLOC in environ.get("LD_PRELOAD", "") else "glibc"
    return f"tunefleet operator {__version__} starting; allocator: {allocator}"


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
    parser.add_argument("--version", action="version", version=f"tunefleet-operator {__version__}")
    args = parser.parse_args()
    namespaces = args.namespace or [
        n for n in os.environ.get("TUNEFLEET_NAMESPACES", "").split(",") if n
    ]

    import tunefleet.handlers  # noqa: F401  (registers the handlers with kopf)
    from tunefleet.handlers.startup import Operator

    kopf.configure(verbose=args.verbose)
    logging.getLogger("tunefleet").info(startup_line(os.environ))
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
        # The one object that owns the process: kopf hands every handler a shallow copy of
        # this memo (startup and cleanup, the webhook's), so each reaches it as memo.operator.
        memo=kopf.Memo(operator=Operator()),
    )


if __name__ == "__main__":
    main()
