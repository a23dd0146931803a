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


# A key pair `cosign generate-key-pair` made (password "tunefleet-test"): the fleet's, in the
# unit tests of fleet adoption, which needs a signature by the adopter's key.
COSIGN = DATA / "cosign"
PUBLIC_KEY = (COSIGN / "cosign.pub").read_text()
# spec.storage.signing of a profile that signs with that pair and verifies with its public half.
KEYED = {"secret": {"name": "signing"}, "publicKey": PUBLIC_KEY}


def signing_dir(root: Path) -> Path:
    """The signing Secret as a tuning Job's publish step mounts it, under `root`."""
    from tunefleet.artifacts import signing

    d = root / "signing"
    d.mkdir(parents=True, exist_ok=True)
    (d / signing.PRIVATE_KEY).write_bytes((COSIGN / "cosign.key").read_bytes())
    (d / signing.PASSWORD).write_bytes(b"tunefleet-test")
    return d
