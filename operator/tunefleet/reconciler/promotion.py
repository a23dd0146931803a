"""Which artifact of a GPU model is served: the gate (spec.promotion) and pins. Pure.

Every artifact a model has had (the Job's fresh record, what status serves, what status.history
keeps) is judged again each reconcile against spec.promotion with tuner_job/gain.py's `judge`:
level-based, so a changed minGain re-judges all of them, and a verdict written in status is
shown, never trusted. The served one is, in order:
1. the pinned one (contracts/pin.py), when it is an artifact of this model and of the revision
   the model tunes now or the spec's (an artifact tuned for another spec may not fit the image
   now served);
2. else the newest of the model's current revision that passes the gate (a rejected fresh
   artifact is kept in history, never served);
3. else what was served before, whatever its revision (the previous one keeps serving),
   unless it was a rejected artifact served only by a pin now gone;
4. else the newest that passes, of any revision (unpinned from a rejected one).
Everything else of the model stays in history, newest first, with its verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tunefleet.contracts.artifact_record import PASSED, PINNED, REJECTED, UNMEASURED, ArtifactRecord
from tunefleet.contracts.pin import Pin
from tuner_job.gain import judge


@dataclass
class Choice:
    served: ArtifactRecord | None = None
    history: list[ArtifactRecord] = field(default_factory=list)
    # The model's newest artifact of its current revision, when the gate refused it.
    rejected: ArtifactRecord | None = None
    pin_problem: str = ""  # a pin that was not honoured, and why


def judged(record: ArtifactRecord, min_gain: float) -> ArtifactRecord:
    """The record with the gate's verdict; an unmeasured one keeps none (status unchanged for
    every artifact from before the gate)."""
    if record.gain is None:
        return replace(record, verdict="", verdict_message="")
    verdict = judge(record.gain, min_gain)
    if not verdict.passed:
        return replace(record, verdict=REJECTED, verdict_message=verdict.message)
    word = PASSED if record.gain.figures else UNMEASURED
    return replace(record, verdict=word, verdict_message=verdict.message)


def _key(r: ArtifactRecord) -> tuple[str, str, str]:
    """One artifact as tuned for one revision: the same bytes tuned again under another spec
    (the library gave every row back) were measured anew, under that spec, and are judged so."""
    return (r.uri, r.sha256, r.revision)


def _candidates(
    model: str,
    fresh: ArtifactRecord | None,
    old: ArtifactRecord | None,
    history: list[ArtifactRecord],
) -> list[ArtifactRecord]:
    """The model's artifacts, newest first as status ordered them, each once. A fresh record
    already in status keeps how it is delivered there (its ConfigMap's name and uid), or every
    reconcile while the Job is kept would deliver it anew."""
    known: list[ArtifactRecord] = []
    if old is not None:
        known.append(old)
    known += [record for record in history if record.gpu_model == model]
    out: list[ArtifactRecord] = []
    if fresh is not None:
        # By its bytes, whatever the revision: one ConfigMap per artifact, named by its SHA-256.
        was = next((r for r in known if _key(r)[:2] == _key(fresh)[:2]), None)
        if was is not None:
            fresh = replace(
                fresh,
                config_map=was.config_map,
                config_map_uid=was.config_map_uid,
                delivery=was.delivery,
            )
        out.append(fresh)
    for r in known:
        if all(_key(r) != _key(o) for o in out):
            out.append(r)
    return out


def _pinned(
    pin: Pin | None, candidates: list[ArtifactRecord], revisions: tuple[str, ...]
) -> tuple[ArtifactRecord | None, str]:
    if pin is None:
        return None, ""
    named = [c for c in candidates if c.sha256 == pin.sha256]
    target = next((c for c in named if c.revision in revisions), named[0] if named else None)
    if target is None:
        return None, f"the pin of {pin.sha256[:12]} is ignored: no artifact of this model has it"
    if target.revision not in revisions:
        return None, (
            f"the pin of {pin.sha256[:12]} is ignored: it was tuned for revision "
            f"{target.revision or '?'}, the model tunes revision {revisions[0]} now"
        )
    gate = target.verdict_message or "not measured"
    pinned = replace(
        target,
        verdict=PINNED,
        verdict_message=f"pinned ({pin.reason or 'no reason given'}); the gate said: {gate}",
        pinned_reason=pin.reason or "pinned",
        pinned_at=pin.at,
    )
    return pinned, ""


@dataclass(frozen=True)
class Had:
    """Every artifact a GPU model has had: its Job's fresh record (None: none), what status
    serves (None: nothing) and what status.history keeps."""

    fresh: ArtifactRecord | None
    old: ArtifactRecord | None
    history: list[ArtifactRecord]


def choose(
    model: str, had: Had, pin: Pin | None, revisions: tuple[str, ...], min_gain: float
) -> Choice:
    """revisions: the one the model tunes now (a retune's, else the spec's), then the spec's:
    what a pin may name (a retune's artifacts and the spec's fit the same image)."""
    fresh, old, history = had.fresh, had.old, had.history
    revision = revisions[0]
    candidates = [
        replace(judged(c, min_gain), pinned_reason="", pinned_at="")
        for c in _candidates(model, fresh, old, history)
    ]
    choice = Choice()
    chosen, choice.pin_problem = _pinned(pin, candidates, revisions)
    passing = [c for c in candidates if c.verdict != REJECTED]
    passing.sort(key=lambda c: c.tuned_at, reverse=True)  # stable: ties keep status order
    if chosen is None:
        chosen = next((c for c in passing if c.revision == revision), None)
    was = next((c for c in candidates if old is not None and _key(c) == _key(old)), None)
    if (
        chosen is None
        and was is not None
        and not (old and old.pinned_reason and was.verdict == REJECTED)
    ):
        chosen = was  # the previous one keeps serving
    if chosen is None:
        chosen = passing[0] if passing else None  # unpinned from a rejected one: the newest passing
    newest = next((c for c in candidates if c.revision == revision), None)
    if newest is not None and newest.verdict == REJECTED:
        choice.rejected = newest
    # The one status serves, unchanged, is kept as it was read (its entry is not rewritten).
    choice.served = old if old is not None and old == chosen else chosen
    choice.history = _history(model, candidates, chosen, history)
    return choice


def _history(
    model: str,
    candidates: list[ArtifactRecord],
    chosen: ArtifactRecord | None,
    history: list[ArtifactRecord],
) -> list[ArtifactRecord]:
    """history with the model's entries as judged now, the served one out of it, and the ones
    that just left serving (or never served: a rejected fresh one) at the front."""
    keep = {_key(c): c for c in candidates if chosen is None or _key(c) != _key(chosen)}
    in_history: set[tuple[str, str, str]] = set()
    rest: list[ArtifactRecord] = []
    for record in history:
        if record.gpu_model != model:
            rest.append(record)  # another model's: as it was read
            continue
        key = _key(record)
        if key in keep and key not in in_history:
            in_history.add(key)
            rest.append(keep[key])
    front = [c for c in candidates if _key(c) in keep and _key(c) not in in_history]
    return front + rest
