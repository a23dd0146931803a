"""`tuner_output(out, **manifest_over)`: what `python -m tuner_job run` leaves in its output
directory (results.csv from tests/unit/data and a manifest describing it), for unit tests of
publish, fetch and delivery."""

from __future__ import annotations

from pathlib import Path

from tuner_job.files import sha256_hex
from tuner_job.manifest import Manifest, rfc3339_utc
from tuner_job.results import read_results

DATA = Path(__file__).parent.parent / "unit" / "data"


def tuner_output(out: Path, results: Path = DATA / "rocm_results.csv", **over: object) -> Manifest:
    """What `tuner_job run` leaves: results.csv + a manifest describing it."""
    out.mkdir(parents=True, exist_ok=True)
    data = results.read_bytes()
    (out / "results.csv").write_bytes(data)
    parsed = read_results(results)
    fields: dict[str, object] = {
        "namespace": "ml",
        "profile": "llama",
        "revision": "3f2a9c01de",
        "gpu_model": "AMD_Instinct_MI300X_OAM",
        "results_sha256": sha256_hex(data),
        "gemms": parsed.gemms,
        "recorded": parsed.gemms + 2,
        "validators": parsed.validators,
        "identity": {"gpuName": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-"},
        "tuning_seconds": 812.5,
        "tuned_at": rfc3339_utc(),
        "tool_version": "0.1.0",
    }
    fields.update(over)
    manifest = Manifest(**fields)  # type: ignore[arg-type]
    (out / "manifest.json").write_bytes(manifest.to_json())
    return manifest
