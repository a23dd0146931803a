"""The exchange directory: files between the tune step and the tunefleet-sync sidecar (stdlib).

The tune step runs in the user's image without our dependencies or S3 credentials; the sidecar
(tunefleet's image) does all S3 traffic. They meet in an emptyDir, every write atomic
(temp file + rename):

========================  ==========  =====================================================
file                      written by  what
========================  ==========  =====================================================
checkpoint.csv            sync        this shard's checkpoint (results CSV), when one is valid
checkpoint.json           sync        {"status": "resumed"|"none"|"ignored", "reason", "gemms"}
checkpoint.done           sync        marker: the two above are final
identity.json             tune        {"gpuModel", "validators", "identity", "libraryKey"}
library.csv               sync        the verified, merged library of that key (if any rows)
library.json              sync        {"key", "entries", "gemms", "skipped": [...], "error"}
library.done              sync        marker: the two above are final
progress.csv              tune        what torch has tuned in this run so far (results CSV)
tune.done                 tune        {"ok": bool, "newlyTuned": int}, at the very end
========================  ==========  =====================================================
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import atomic_write_bytes
from .manifest import LibraryInfo, ResumeInfo
from .results import CsvFormatError, ResultsFile, read_results

CHECKPOINT_CSV = "checkpoint.csv"
CHECKPOINT_JSON = "checkpoint.json"
CHECKPOINT_DONE = "checkpoint.done"
IDENTITY_JSON = "identity.json"
LIBRARY_CSV = "library.csv"
LIBRARY_JSON = "library.json"
LIBRARY_DONE = "library.done"
PROGRESS_CSV = "progress.csv"
TUNE_DONE = "tune.done"

POLL_SECONDS = 0.1

Log = Callable[[str], None]


def write_json(path: Path, doc: Any, *, fsync: bool = True) -> None:
    data = (json.dumps(doc, sort_keys=True) + "\n").encode("utf-8")
    atomic_write_bytes(path, data, fsync=fsync)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in path, or None if it is missing or not a JSON object."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def mark(path: Path) -> None:
    atomic_write_bytes(path, b"")


def wait_for(paths: list[Path], deadline: float) -> bool:
    """True once every path exists; False at the deadline (time.monotonic())."""
    while True:
        if all(p.exists() for p in paths):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)


@dataclass
class Prior:
    """What the sidecar brought for this run: the library's rows and this shard's checkpoint,
    each already checked against this machine's validators (None when not usable), and what
    the manifest says about them (None when there is no exchange directory)."""

    library: ResultsFile | None = None
    checkpoint: ResultsFile | None = None
    library_info: LibraryInfo | None = None
    resume_info: ResumeInfo | None = None


def _validator_diff(a: Mapping[str, str], b: Mapping[str, str]) -> str:
    return "; ".join(
        f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
    )


def _checkpoint(
    directory: Path, arrived: bool, wait_s: float, validators: Mapping[str, str]
) -> tuple[ResultsFile | None, ResumeInfo]:
    if not arrived:
        return None, ResumeInfo("none", f"the sync sidecar gave no checkpoint within {wait_s:.0f}s")
    answer = CheckpointAnswer.read(directory)
    status, reason = answer.status, answer.reason
    if status != "resumed":
        return None, ResumeInfo(status if status == "ignored" else "none", reason)
    try:
        results = read_results(directory / CHECKPOINT_CSV)
    except (OSError, CsvFormatError) as exc:
        return None, ResumeInfo("ignored", f"checkpoint.csv is unreadable: {exc}")
    if results.validators != dict(validators):
        why = _validator_diff(results.validators, validators)
        return None, ResumeInfo("ignored", f"checkpoint was tuned under other validators: {why}")
    return results, ResumeInfo("resumed", reason)


def _library(
    directory: Path,
    arrived: bool,
    wait_s: float,
    key: str,
    validators: Mapping[str, str],
    settings: Mapping[str, Any] | None = None,
) -> tuple[ResultsFile | None, LibraryInfo]:
    if not arrived:
        return None, LibraryInfo(error=f"the sync sidecar gave no library within {wait_s:.0f}s")
    answer = LibraryAnswer.read(directory)
    info = LibraryInfo(
        entries=answer.entries,
        skipped=answer.skipped[: LibraryInfo.MAX_SKIPPED],
        skipped_count=len(answer.skipped),
    )
    error = answer.error
    if not error and answer.key != key:
        error = f"library.json is for key {answer.key!r}, this run's key is {key}"
    if not error and settings is not None and answer.settings != dict(settings):
        error = "library.json was read for other tuning settings than this run's"
    results = None
    if not error and (directory / LIBRARY_CSV).exists():  # no library.csv: an empty library
        try:
            results = read_results(directory / LIBRARY_CSV)
        except (OSError, CsvFormatError) as exc:
            error = f"library.csv is unreadable: {exc}"
        else:
            if results.validators != dict(validators):
                error = "library.csv carries other validators: " + _validator_diff(
                    results.validators, validators
                )
    if error:
        return None, dataclasses.replace(info, error=str(error))
    return results, info


@dataclass(frozen=True)
class Whoami:
    """What the tune step says of itself in identity.json: the GPU model, torch's validators,
    the machine's identity, the library key they make, and the settings it tunes with (the
    sidecar reuses only entries tuned with the same or stronger ones)."""

    gpu_model: str
    validators: Mapping[str, str]
    identity: Mapping[str, str]
    key: str
    settings: Mapping[str, Any] | None = None


def gather(directory: Path, me: Whoami, *, wait_s: float, log: Log) -> Prior:
    """Say who we are (identity.json), then wait, bounded, for the sidecar's checkpoint and
    library. Whatever does not come, or does not fit, is left out and said."""
    gpu_model, validators, identity, key, settings = (
        me.gpu_model, me.validators, me.identity, me.key, me.settings
    )  # fmt: skip
    write_json(
        directory / IDENTITY_JSON,
        {
            "gpuModel": gpu_model,
            "validators": dict(validators),
            "identity": dict(identity),
            "libraryKey": key,
            # The sidecar reuses only entries tuned with the same or stronger settings.
            "settings": dict(settings) if settings is not None else None,
        },
    )
    deadline = time.monotonic() + max(wait_s, 0.0)
    arrived_checkpoint = wait_for([directory / CHECKPOINT_DONE], deadline)
    arrived_library = wait_for([directory / LIBRARY_DONE], deadline)
    checkpoint, resume = _checkpoint(directory, arrived_checkpoint, wait_s, validators)
    library, info = _library(directory, arrived_library, wait_s, key, validators, settings)
    if checkpoint is not None:
        log(f"checkpoint: {checkpoint.gemms} GEMM(s) tuned by an earlier attempt")
    elif resume.status == "ignored" or not arrived_checkpoint:
        log(f"checkpoint not used: {resume.reason}")
    if info.error:
        log(f"library not used, tuning without it: {info.error}")
    else:
        rows = library.gemms if library is not None else 0
        log(
            f"library {key[:12]}...: {info.entries} entries, {rows} GEMM(s), "
            f"{info.skipped_count} entries skipped"
        )
    for obj, reason in info.skipped:
        log(f"library entry skipped: {obj}: {reason}")
    return Prior(library, checkpoint, info, resume)


# --- the sidecar's answers (written by tunefleet-sync, read by gather) ----------------------


@dataclass(frozen=True)
class CheckpointAnswer:
    """checkpoint.json: whether this shard resumes, and why (checkpoint.csv holds the rows)."""

    status: str  # "resumed", "none" or "ignored"
    reason: str = ""
    gemms: int = 0

    def write(self, directory: Path) -> None:
        doc = {"status": self.status, "reason": self.reason, "gemms": self.gemms}
        write_json(directory / CHECKPOINT_JSON, doc)

    @classmethod
    def read(cls, directory: Path) -> CheckpointAnswer:
        doc = read_json(directory / CHECKPOINT_JSON) or {}
        status = str(doc.get("status") or "none")
        gemms = doc.get("gemms")
        return cls(
            status if status in ("resumed", "none", "ignored") else "none",
            str(doc.get("reason") or ""),
            gemms if isinstance(gemms, int) and not isinstance(gemms, bool) else 0,
        )


@dataclass(frozen=True)
class LibraryAnswer:
    """library.json: what the library of `key` gave (library.csv holds its merged rows)."""

    key: str
    entries: int = 0
    gemms: int = 0
    skipped: tuple[tuple[str, str], ...] = ()  # (object, reason)
    error: str | None = None  # the library could not be read at all
    settings: dict[str, Any] | None = None  # the settings entries were checked against

    def write(self, directory: Path) -> None:
        doc = {
            "settings": self.settings,
            "key": self.key,
            "entries": self.entries,
            "gemms": self.gemms,
            "skipped": [{"object": o, "reason": r} for o, r in self.skipped],
            "error": self.error,
        }
        write_json(directory / LIBRARY_JSON, doc)

    @classmethod
    def read(cls, directory: Path) -> LibraryAnswer:
        doc = read_json(directory / LIBRARY_JSON)
        if doc is None:
            return cls("", error="library.json is missing or not JSON")
        skipped = tuple(
            (str(s.get("object", "")), str(s.get("reason", "")))
            for s in doc.get("skipped") or []
            if isinstance(s, dict)
        )
        entries, gemms = doc.get("entries"), doc.get("gemms")
        error = doc.get("error")
        settings = doc.get("settings")
        return cls(
            settings=settings if isinstance(settings, dict) else None,
            key=str(doc.get("key") or ""),
            entries=entries if isinstance(entries, int) and entries >= 0 else 0,
            gemms=gemms if isinstance(gemms, int) and gemms >= 0 else 0,
            skipped=skipped,
            error=str(error) if error else None,
        )


def answer_without(directory: Path, reason: str) -> None:
    """The sidecar cannot help (bad arguments, no store): tell the tuner not to wait."""
    directory.mkdir(parents=True, exist_ok=True)
    CheckpointAnswer("none", reason).write(directory)
    mark(directory / CHECKPOINT_DONE)
    LibraryAnswer("", error=reason).write(directory)
    mark(directory / LIBRARY_DONE)


def begin(directory: Path) -> None:
    """A re-run in the same pod starts over: the sidecar must not see an earlier end."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / TUNE_DONE).unlink(missing_ok=True)


def finish(directory: Path, ok: bool, newly_tuned: int) -> None:
    write_json(directory / TUNE_DONE, {"ok": ok, "newlyTuned": newly_tuned})
