"""The TuningProfile status as the operator builds and reads it: one typed model, built by the
reconcile's status step (reconciler/status.py), serialised once, at the write
(`TuningProfileStatus.to_status`), and read back typed (`from_status`: what announce compares,
what a reconcile's Outcome holds). crds/ is its schema: its conditions and capture entries are
the api models' (models.py, checked against the CRD by tests/unit/test_schema_drift.py), its
artifacts the artifact record's own type (contracts/artifact_record.py writes and reads them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from tunefleet.api.base import Model
from tunefleet.api.conditions import Phase, Type
from tunefleet.api.models import CaptureStatus, Condition
from tunefleet.contracts.artifact_record import ArtifactRecord


def _dump(model: Model) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(by_alias=True, exclude_none=True)
    return dumped


class JobLine(Model):
    """status.jobs[]: one tuning or merge Job of the current revision."""

    gpu_model: str
    name: str
    state: str
    message: str
    uid: str | None = None
    reason: str | None = None
    shards: str | None = None  # "done/all" of a sharded tuning Job
    failed_attempts: int | None = None
    last_failure: str | None = None


@dataclass(frozen=True)
class Summary:
    """The printer columns' fields (`kubectl get tp`, `-o wide`); None: not shown."""

    gpu_models: str | None = None
    gemms: int | None = None
    tuned_gemms: str | None = None
    note: str | None = None
    reuse: str | None = None
    short_sha256: str | None = None
    kinds: str | None = None
    last_tuned_at: str | None = None
    gain: str | None = None
    source: str | None = None

    @classmethod
    def from_status(cls, raw: dict[str, Any]) -> Summary:
        """The printer columns as read (any shape: a field of the wrong type is None)."""
        gemms = raw.get("gemms")
        return cls(
            gpu_models=_text(raw.get("gpuModels")),
            gemms=gemms if isinstance(gemms, int) and not isinstance(gemms, bool) else None,
            tuned_gemms=_text(raw.get("tunedGemms")),
            note=_text(raw.get("note")),
            reuse=_text(raw.get("reuse")),
            short_sha256=_text(raw.get("shortSha256")),
            kinds=_text(raw.get("kinds")),
            last_tuned_at=_text(raw.get("lastTunedAt")),
            gain=_text(raw.get("gain")),
            source=_text(raw.get("source")),
        )

    def to_status(self) -> dict[str, Any]:
        fields = {
            "gpuModels": self.gpu_models,
            "gemms": self.gemms,
            "tunedGemms": self.tuned_gemms,
            "note": self.note,
            "reuse": self.reuse,
            "shortSha256": self.short_sha256,
            "kinds": self.kinds,
            "lastTunedAt": self.last_tuned_at,
            "gain": self.gain,
            "source": self.source,
        }
        return {k: v for k, v in fields.items() if v is not None}


@dataclass
class TuningProfileStatus:
    """status of a TuningProfile. `revision`, `progress` and the summary are None (not
    written) for an invalid spec; `capture` and `coverage` only with capture."""

    observed_generation: int
    phase: Phase
    conditions: list[Condition]
    artifacts: list[ArtifactRecord]
    history: list[ArtifactRecord]
    jobs: list[JobLine] = field(default_factory=list)
    unadmitted_pods: int = 0
    revision: str | None = None
    summary: Summary = field(default_factory=Summary)
    progress: str | None = None
    capture: list[CaptureStatus] | None = None
    coverage: str | None = None

    def condition(self, type_: Type) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @classmethod
    def from_status(cls, raw: Any) -> TuningProfileStatus:
        """A status as read from the API server (any shape: written by another version, by
        hand, or not at all), typed: what does not parse is left out, never trusted. A status
        this model wrote reads back as itself (to_status, then from_status)."""
        raw = raw if isinstance(raw, dict) else {}
        generation = raw.get("observedGeneration")
        try:
            phase = Phase(raw.get("phase"))
        except ValueError:
            phase = Phase.PENDING  # none yet (a new profile), or a word this version lacks
        unadmitted = raw.get("unadmittedPods")
        return cls(
            observed_generation=generation if isinstance(generation, int) else 0,
            phase=phase,
            conditions=_parsed(raw.get("conditions"), Condition.model_validate),
            artifacts=records(raw.get("artifacts")),
            history=records(raw.get("history")),
            jobs=_parsed(raw.get("jobs"), JobLine.model_validate),
            unadmitted_pods=unadmitted if isinstance(unadmitted, int) else 0,
            revision=_text(raw.get("revision")),
            summary=Summary.from_status(raw),
            progress=_text(raw.get("progress")),
            capture=_parsed(raw.get("capture"), CaptureStatus.model_validate) or None,
            coverage=_text(raw.get("coverage")),
        )

    def to_status(self) -> dict[str, Any]:
        """The one serialisation: what is written to the API server."""
        out: dict[str, Any] = {"observedGeneration": self.observed_generation}
        out["phase"] = str(self.phase)
        if self.revision is not None:
            out["revision"] = self.revision
        out.update(self.summary.to_status())
        out["conditions"] = [_dump(c) for c in self.conditions]
        out["jobs"] = [_dump(j) for j in self.jobs]
        if self.progress is not None:
            out["progress"] = self.progress
        out["artifacts"] = [a.to_status() for a in self.artifacts]
        out["history"] = [a.to_status() for a in self.history]
        out["unadmittedPods"] = self.unadmitted_pods
        if self.capture:
            out["capture"] = [_dump(c) for c in self.capture]
        if self.coverage:
            out["coverage"] = self.coverage
        return out


def records(entries: Any) -> list[ArtifactRecord]:
    """status.artifacts[] or history[] as read (from the API server: any shape), as records;
    an entry without its uri and sha256 is dropped, never trusted."""
    out = []
    for entry in entries if isinstance(entries, list) else []:
        record = ArtifactRecord.from_status(entry) if isinstance(entry, dict) else None
        if record is not None:
            out.append(record)
    return out


T = TypeVar("T")


def _parsed(entries: Any, parse: Callable[[Any], T]) -> list[T]:
    """The entries of a list as read that parse (the others are left out)."""
    out = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            out.append(parse(entry))
        except ValidationError:
            continue
    return out


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
