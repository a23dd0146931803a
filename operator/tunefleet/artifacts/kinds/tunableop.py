"""TunableOp results: one CSV of tuned GEMMs that torch loads at start (the only kind so far).

What the kind is made of already exists, and stays where it is: tuner_job's format layer
(results: the one parser; output: the file's name) and fit.py (which torch and GPU the rows
fit). This module only puts it behind `ArtifactKind` (kinds/__init__.py). The messages are
the ones fetch and publish gave before there were kinds: pinned by their tests.
"""

from __future__ import annotations

from tunefleet.artifacts import fit
from tuner_job.manifest import Manifest
from tuner_job.output import RESULTS_NAME
from tuner_job.results import (
    CsvFormatError,
    Outcomes,
    ResultsFile,
    count_outcomes,
    decode,
    parse_results,
)

NAME = "tunableop"
PAYLOAD = RESULTS_NAME
CONTENT_TYPE = "text/csv"
MOUNT_DIR = "/tunefleet/results"
# TunableOp reads the file of the current device: PYTORCH_TUNABLEOP_FILENAME with %d replaced
# by the ordinal, so every GPU a pod uses needs its own copy.
FILES = "tunableop_results%d.csv"
FormatError: type[Exception] = CsvFormatError

# What a serving container gets so that it loads the results, and does nothing else with
# TunableOp: no tuning (it would stall requests and write its findings nowhere), no recording
# of misses unless capture asks (pod_env).
_ENV = {
    "PYTORCH_TUNABLEOP_ENABLED": "1",
    "PYTORCH_TUNABLEOP_TUNING": "0",
    "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
    "PYTORCH_TUNABLEOP_FILENAME": f"{MOUNT_DIR}/{FILES}",
}


def parse(payload: bytes, source: str, *, require_rows: bool) -> ResultsFile:
    return parse_results(decode(payload), source, require_rows=require_rows)


def noncanonical(parsed: ResultsFile, source: str) -> str | None:
    """Published files are canonical: the tuner writes only rows torch reads as written, so a
    dropped or repeated row means torch would load something here that no tuner wrote."""
    if not parsed.dropped and not parsed.duplicates:
        return None
    return f"{PAYLOAD} holds rows TunableOp would load as garbage or twice: " + "; ".join(
        parsed.warnings(source)[:3]
    )


def outcomes(parsed: ResultsFile) -> Outcomes:
    return count_outcomes(parsed)


def disagreements(parsed: ResultsFile, manifest: Manifest) -> list[str]:
    """Where the results and their manifest disagree: GEMMs, validators, outcomes (a manifest
    from before outcomes were counted has none to disagree with)."""
    out: list[str] = []
    if manifest.gemms != parsed.gemms:
        out.append(f"manifest says {manifest.gemms} GEMMs, {PAYLOAD} has {parsed.gemms}")
    if manifest.validators != parsed.validators:
        out.append(f"manifest validators differ from {PAYLOAD}")
    counted = count_outcomes(parsed)
    if manifest.outcomes is not None and manifest.outcomes != counted:
        out.append(
            f"manifest outcomes {manifest.outcomes.to_dict()} differ from "
            f"{PAYLOAD}'s {counted.to_dict()}"
        )
    return out


def refusals(parsed: ResultsFile, manifest: Manifest, target: fit.Target) -> list[str]:
    """Why the rows must not be served to `target` (fit.py); empty when they fit."""
    solutions = (row.solution for row in parsed.rows)
    return fit.refusals(parsed.validators, solutions, manifest.identity, target)


def device_files(devices: int) -> list[tuple[str, str]]:
    return [(PAYLOAD, FILES % i) for i in range(devices)]


def pod_env(*, capture: bool) -> dict[str, str]:
    """With capture, TunableOp records the GEMMs it finds no result for (builders/capture.py
    says where, and the sidecar reads them)."""
    return {**_ENV, **({"PYTORCH_TUNABLEOP_RECORD_UNTUNED": "1"} if capture else {})}
