"""The GEMM library's identity key, its entries, tuning checkpoints, and sharding (stdlib only).

A tuned GEMM is valid wherever TunableOp's validators and the GPU model are the same, so every
published artifact also becomes an entry of the library of its *identity*; a later tuning of the
same identity reuses what the library holds and tunes only the rest. The identity key is one
function, ``library_key``, used by the tune step (the user's image) and by the sync sidecar,
publish and merge (tunefleet's image) alike.

What goes into the key, and why (docs/tuner.md says the same):

* ``gpuModel``: the node label value the Job ran on. Two GPUs with the same validators can still
  differ (CUDA validates little beyond PT_VERSION on older torch), and the model is what serving
  pods select by.
* every TunableOp validator (PT_VERSION, and on ROCm HIP/ROCm, hipBLASLt, rocBLAS, GCN arch; on
  recent CUDA torch cuBLASLt and the device): TunableOp drops a whole results file when any one
  differs, so rows tuned under other validators can never be served together.
* from the manifest's identity, only what decides which kernels exist and how fast they are but
  is not (always) a validator: ``arch``, ``computeCapability``, ``cuda``, ``cublas``,
  ``cublasLt``, ``hip``, ``hipVersion``, ``hipblaslt``, ``rocblas``, ``rocm``, and the device's
  ``multiProcessorCount`` and ``partition`` (a GPU partition is not the whole GPU).

Left out: ``gpuName`` (the model says it), ``gpuCount`` (tuning is per GPU), ``gpuMemoryMiB``
(memory size does not change a kernel's speed), ``driver`` (a node's driver update would split
the library though the libraries that pick kernels are the same), ``torch`` (PT_VERSION is a
validator).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .results import (
    CsvFormatError,
    ResultsFile,
    UntunedRow,
    parse_op_signature,
    parse_param_signature,
    parse_results,
)

# The manifest identity fields that take part in the key (see the module docstring).
IDENTITY_FIELDS = (
    "arch",
    "computeCapability",
    "cuda",
    "cublas",
    "cublasLt",
    "hip",
    "hipVersion",
    "hipblaslt",
    "rocblas",
    "rocm",
    # What the tuner's own device reports: a partition of a GPU (AMD CPX, NVIDIA MIG) has the
    # arch, validators and product label of the whole GPU but fewer compute units, and other
    # kernels win on it.
    "multiProcessorCount",
    "partition",
)
WHOLE_GPU = "whole"


def partition_name(compute: str = "", memory: str = "", mig: str = "") -> str:
    """One name for a GPU partition, as the identity's ``partition`` and the webhook use it:
    ``whole``; an AMD compute and memory partition mode as the AMD device plugin names them
    (``cpx_nps1``; SPX with NPS1 is the whole GPU); an NVIDIA MIG profile (``mig-1g.10gb``)."""
    if mig:
        return f"mig-{mig.lower()}"
    c, m = compute.strip().lower(), memory.strip().lower()
    if c in ("", "spx") and m in ("", "nps1"):
        return WHOLE_GPU
    return f"{c or 'spx'}_{m or 'nps1'}"


ENTRY_SCHEMA = "tunefleet.io/library-entry/v1"
CHECKPOINT_SCHEMA = "tunefleet.io/checkpoint/v1"
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def identity_subset(identity: Mapping[str, str]) -> dict[str, str]:
    """The part of a manifest identity that the library key covers."""
    return {k: str(identity[k]) for k in IDENTITY_FIELDS if k in identity}


def canonical_json(doc: Any) -> bytes:
    """One byte form per document: sorted keys, no spaces, ASCII only."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def library_key(gpu_model: str, validators: Mapping[str, str], identity: Mapping[str, str]) -> str:
    """sha256 (hex) of the canonical JSON of {gpuModel, validators (all), identity (subset)}."""
    doc = {
        "gpuModel": gpu_model,
        "validators": {str(k): str(v) for k, v in validators.items()},
        "identity": identity_subset(identity),
    }
    return hashlib.sha256(canonical_json(doc)).hexdigest()


# --- sharding --------------------------------------------------------------------------------

# Cost bounds of one GEMM's tuning, in m*n*k*batch units. TunableOp times every candidate for at
# most maxIterations runs or maxDurationMs (100 / 30 ms by default), so tuning time grows with a
# GEMM's size only between two bounds: below ~1300^3 a run is launch-bound (100 runs of a few
# microseconds: flat), above ~4100^3 the duration cap binds (flat), for a GPU of ~500 dense
# TFLOP/s. Unclamped, one 8192^3 GEMM would weigh as much as 30,000 decode-sized ones.
COST_FLOOR = 1 << 31
COST_CAP = 1 << 36


def gemm_cost(row: UntunedRow) -> int:
    """Estimated tuning cost from the ParamSig: m*n*k*batch (a wildcard dimension counts as 1),
    clamped to [COST_FLOOR, COST_CAP]."""
    try:
        p = parse_param_signature(row.params, parse_op_signature(row.op))
    except ValueError:
        return COST_FLOOR
    cost = 1
    for dim in (p.m, p.n, p.k, p.batch):
        cost *= dim or 1
    return min(max(cost, COST_FLOOR), COST_CAP)


def partition(rows: Iterable[UntunedRow], count: int) -> list[list[UntunedRow]]:
    """Split GEMMs into ``count`` disjoint shares of about equal estimated cost.

    Longest processing time first: the most expensive GEMM goes to the least loaded share,
    ties broken by (op, params) and by share index, so the same set of GEMMs in any order gives
    the same shares. Duplicates (same op and params) count once. Each share lists its GEMMs
    most expensive first.
    """
    if count < 1:
        raise ValueError(f"cannot partition into {count} shares")
    unique: dict[tuple[str, str], UntunedRow] = {}
    for row in rows:
        unique.setdefault(row.key, row)
    ordered = sorted(unique.values(), key=lambda r: (-gemm_cost(r), r.key))
    shares: list[list[UntunedRow]] = [[] for _ in range(count)]
    loads = [(0, i) for i in range(count)]  # a heap of (load, share index)
    for row in ordered:
        load, i = heapq.heappop(loads)
        shares[i].append(row)
        heapq.heappush(loads, (load + gemm_cost(row), i))
    return shares


def share_cost(rows: Iterable[UntunedRow]) -> int:
    return sum(gemm_cost(r) for r in rows)


# --- tuning settings -------------------------------------------------------------------------

SETTINGS_FIELDS = (
    "maxDurationMs",
    "maxIterations",
    "warmupDurationMs",
    "warmupIterations",
    "rotatingBufferMB",
    "numericalCheck",
    "atol",
    "rtol",
    "cublasltAlgoCount",
)


@dataclass(frozen=True)
class Settings:
    """The tuning settings that choose a GEMM's winner: how long and how often each candidate
    is timed (and warmed up), whether the cache is kept cold (rotating buffer), whether
    candidates must agree with Default (and how closely), and how many cuBLASLt algorithms
    take part. A library entry records them; a run reuses an entry only if the entry's settings
    are the same as or stronger than its own (``covers``), so that asking for more (the no-gain
    advice: raise maxDurationMs or maxIterations; turn numericalCheck on) really retunes."""

    max_duration_ms: int
    max_iterations: int
    warmup_duration_ms: int
    warmup_iterations: int
    rotating_buffer_mb: int  # -1: the L2 cache size, 0: off
    numerical_check: bool
    atol: float
    rtol: float
    cublaslt_algo_count: int | None  # None: this torch has no cuBLASLt candidates

    def to_dict(self) -> dict[str, Any]:
        return {
            "maxDurationMs": self.max_duration_ms,
            "maxIterations": self.max_iterations,
            "warmupDurationMs": self.warmup_duration_ms,
            "warmupIterations": self.warmup_iterations,
            "rotatingBufferMB": self.rotating_buffer_mb,
            "numericalCheck": self.numerical_check,
            "atol": self.atol,
            "rtol": self.rtol,
            "cublasltAlgoCount": self.cublaslt_algo_count,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Settings:
        """Raises ValueError on anything but a complete settings document."""
        if not isinstance(doc, dict) or set(doc) != set(SETTINGS_FIELDS):
            raise ValueError(f"tuning settings must have exactly {', '.join(SETTINGS_FIELDS)}")
        ints = ("maxDurationMs", "maxIterations", "warmupDurationMs", "warmupIterations")
        for name in (*ints, "rotatingBufferMB"):
            if not isinstance(doc[name], int) or isinstance(doc[name], bool):
                raise ValueError(f"tuning settings: {name} is not an integer")
        if not isinstance(doc["numericalCheck"], bool):
            raise ValueError("tuning settings: numericalCheck is not a boolean")
        for name in ("atol", "rtol"):
            if not isinstance(doc[name], int | float) or isinstance(doc[name], bool):
                raise ValueError(f"tuning settings: {name} is not a number")
        count = doc["cublasltAlgoCount"]
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
            raise ValueError("tuning settings: cublasltAlgoCount is not an integer or null")
        return cls(
            doc["maxDurationMs"],
            doc["maxIterations"],
            doc["warmupDurationMs"],
            doc["warmupIterations"],
            doc["rotatingBufferMB"],
            doc["numericalCheck"],
            float(doc["atol"]),
            float(doc["rtol"]),
            count,
        )

    def falls_short_of(self, wanted: Settings) -> str | None:
        """Why rows tuned with these settings must not serve a run that wants ``wanted``, or
        None when these are the same or stronger in every respect."""
        short = []
        for name, mine, theirs in (
            ("maxDurationMs", self.max_duration_ms, wanted.max_duration_ms),
            ("maxIterations", self.max_iterations, wanted.max_iterations),
            ("warmupDurationMs", self.warmup_duration_ms, wanted.warmup_duration_ms),
            ("warmupIterations", self.warmup_iterations, wanted.warmup_iterations),
        ):
            if mine < theirs:
                short.append(f"{name} {mine} < {theirs}")
        rb, want_rb = self.rotating_buffer_mb, wanted.rotating_buffer_mb
        # 0 (off) is the weakest; among sizes a larger buffer is colder. The L2 size (-1) and
        # an explicit size are not comparable without the GPU's L2 size: only equal covers.
        if want_rb != 0 and rb != want_rb and not (rb > 0 and want_rb > 0 and rb > want_rb):
            short.append(f"rotatingBufferMB {rb} vs {want_rb}")
        if wanted.numerical_check:
            if not self.numerical_check:
                short.append("numericalCheck off, this run checks")
            elif self.atol > wanted.atol or self.rtol > wanted.rtol:
                short.append(
                    f"checked with atol/rtol {self.atol:g}/{self.rtol:g}, looser than "
                    f"{wanted.atol:g}/{wanted.rtol:g}"
                )
        mine_n, want_n = self.cublaslt_algo_count, wanted.cublaslt_algo_count
        if want_n is not None and (mine_n is None or mine_n < want_n):
            short.append(f"cublasltAlgoCount {mine_n} < {want_n}")
        return "; ".join(short) or None


# --- library entries -------------------------------------------------------------------------


class LibraryEntryError(ValueError):
    """A library entry that must not be merged; the message is the short reason shown."""


@dataclass(frozen=True)
class EntrySource:
    namespace: str
    profile: str
    revision: str
    sha256: str  # of the artifact's results.csv

    def to_dict(self) -> dict[str, str]:
        return {
            "namespace": self.namespace,
            "profile": self.profile,
            "revision": self.revision,
            "sha256": self.sha256,
        }


def make_entry(
    *,
    gpu_model: str,
    validators: Mapping[str, str],
    identity: Mapping[str, str],
    source: EntrySource,
    results_text: str,
    settings: Settings | None = None,
) -> bytes:
    """An entry's bytes; it is stored under the SHA-256 of exactly these bytes. settings: what
    the rows were tuned with (an artifact from before tunefleet recorded them has none, and its
    entry is then reused by no run)."""
    doc: dict[str, Any] = {
        "schema": ENTRY_SCHEMA,
        "gpuModel": gpu_model,
        "key": library_key(gpu_model, validators, identity),
        "validators": dict(validators),
        "identity": identity_subset(identity),
        "source": source.to_dict(),
        "results": results_text,
    }
    if settings is not None:
        doc["settings"] = settings.to_dict()
    return canonical_json(doc) + b"\n"


def _str_map(doc: dict[str, Any], field: str) -> dict[str, str]:
    value = doc.get(field)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise LibraryEntryError(f"field {field!r} is not a map of strings")
    return dict(value)


def parse_entry(
    data: bytes,
    *,
    name_sha256: str,
    key: str,
    gpu_model: str,
    validators: Mapping[str, str],
    settings: Settings | None = None,
) -> tuple[EntrySource, ResultsFile]:
    """Verify one entry read from ``<...>/<gpu_model>/<key>/<name_sha256>.json``.

    Checks, in order: the bytes hash to the name; they are an entry document; its validators and
    GPU model are the reader's; its key recomputes from its own fields and is the directory's;
    (with ``settings``, the reader's) it was tuned with the same or stronger settings; its
    results parse, under the same validators, with no row torch would load as garbage.
    Raises LibraryEntryError(reason).
    """
    actual = hashlib.sha256(data).hexdigest()
    if not _SHA_RE.match(name_sha256) or actual != name_sha256:
        raise LibraryEntryError(f"content has SHA-256 {actual[:12]}..., not its name")
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LibraryEntryError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != ENTRY_SCHEMA:
        raise LibraryEntryError(f"not a {ENTRY_SCHEMA} document")
    entry_model = doc.get("gpuModel")
    entry_validators = _str_map(doc, "validators")
    entry_identity = _str_map(doc, "identity")
    if not isinstance(entry_model, str):
        raise LibraryEntryError("field 'gpuModel' is not a string")
    if entry_validators != dict(validators):
        diff = "; ".join(
            f"{k} {entry_validators.get(k)!r} vs {validators.get(k)!r}"
            for k in sorted(set(entry_validators) | set(validators))
            if entry_validators.get(k) != validators.get(k)
        )
        raise LibraryEntryError(f"tuned under other validators ({diff})")
    if entry_model != gpu_model:
        raise LibraryEntryError(f"it is for GPU model {entry_model!r}, not {gpu_model!r}")
    recomputed = library_key(entry_model, entry_validators, entry_identity)
    if doc.get("key") != recomputed:
        raise LibraryEntryError("its key does not match its own gpuModel/validators/identity")
    if recomputed != key:
        raise LibraryEntryError(f"it belongs to library key {recomputed[:12]}..., not this one")
    if settings is not None:
        _check_settings(doc, settings)
    source = doc.get("source")
    if not isinstance(source, dict) or not all(
        isinstance(source.get(f), str) for f in ("namespace", "profile", "revision", "sha256")
    ):
        raise LibraryEntryError("field 'source' lacks namespace/profile/revision/sha256")
    results = _entry_results(doc, entry_validators)
    src = EntrySource(source["namespace"], source["profile"], source["revision"], source["sha256"])
    return src, results


def _check_settings(doc: dict[str, Any], settings: Settings) -> None:
    """An entry is reused only if tuned with the reader's settings or stronger ones."""
    if "settings" not in doc:
        raise LibraryEntryError(
            "it records no tuning settings (published before tunefleet recorded them): "
            "not reused, its GEMMs are tuned again"
        )
    try:
        tuned_with = Settings.from_dict(doc["settings"])
    except ValueError as exc:
        raise LibraryEntryError(str(exc)) from None
    short = tuned_with.falls_short_of(settings)
    if short:
        raise LibraryEntryError(f"tuned with weaker settings than this run's ({short})")


def _entry_results(doc: dict[str, Any], validators: dict[str, str]) -> ResultsFile:
    """An entry's results, parsed as torch reads them, with nothing torch would misread and
    the entry's own validators."""
    text = doc.get("results")
    if not isinstance(text, str):
        raise LibraryEntryError("field 'results' is not a string")
    try:
        results = parse_results(text, "results", require_rows=True)
    except CsvFormatError as exc:
        raise LibraryEntryError(f"results do not parse: {exc}") from None
    if results.dropped or results.duplicates:
        raise LibraryEntryError(f"results hold rows torch would misread: {results.warnings()[0]}")
    if results.validators != validators:
        raise LibraryEntryError("its results carry other validators than the entry")
    return results


# --- checkpoints -----------------------------------------------------------------------------


class CheckpointError(ValueError):
    """A checkpoint this Job must not resume from; the message says why, in one line."""


@dataclass(frozen=True)
class CheckpointId:
    namespace: str
    profile: str
    gpu_model: str
    revision: str
    shard: int
    shards: int


def make_checkpoint(ident: CheckpointId, results_text: str, updated_at: str) -> bytes:
    doc = {
        "schema": CHECKPOINT_SCHEMA,
        "namespace": ident.namespace,
        "profile": ident.profile,
        "gpuModel": ident.gpu_model,
        "revision": ident.revision,
        "shard": ident.shard,
        "shards": ident.shards,
        "results": results_text,
        "updatedAt": updated_at,
    }
    return canonical_json(doc) + b"\n"


def parse_checkpoint(data: bytes, expected: CheckpointId) -> ResultsFile:
    """The checkpoint's results, if it is this Job's (namespace, profile, model, revision,
    shard i of N); CheckpointError with the reason otherwise."""
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != CHECKPOINT_SCHEMA:
        raise CheckpointError(f"checkpoint is not a {CHECKPOINT_SCHEMA} document")
    for field, label, want in (
        ("namespace", "namespace", expected.namespace),
        ("profile", "profile", expected.profile),
        ("gpuModel", "GPU model", expected.gpu_model),
        ("revision", "revision", expected.revision),
    ):
        if doc.get(field) != want:
            raise CheckpointError(
                f"checkpoint is for {label} {doc.get(field)!r}, this Job tunes {want!r}"
            )
    got = (doc.get("shard"), doc.get("shards"))
    if got != (expected.shard, expected.shards):
        raise CheckpointError(
            f"checkpoint is for shard {got[0]!r} of {got[1]!r}, this pod is shard "
            f"{expected.shard} of {expected.shards}"
        )
    text = doc.get("results")
    if not isinstance(text, str):
        raise CheckpointError("checkpoint has no results text")
    try:
        return parse_results(text, "checkpoint results")
    except CsvFormatError as exc:
        raise CheckpointError(f"checkpoint results do not parse: {exc}") from None


def rows_for(results: ResultsFile | None, keys: Iterable[tuple[str, str]]) -> ResultsFile:
    """The rows of ``results`` for the given GEMMs, under the same validators."""
    if results is None:
        return ResultsFile()
    wanted = set(keys)
    return ResultsFile(dict(results.validators), [r for r in results.rows if r.key in wanted])


def keys_of(rows: Sequence[UntunedRow]) -> set[tuple[str, str]]:
    return {r.key for r in rows}
