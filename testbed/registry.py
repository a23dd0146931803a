"""The local cluster's OCI registry (hack/cluster-up.sh: CNCF Distribution with TLS and two
identities) and cosign (built from Go modules by hack/build-tools.sh --cosign), for the e2e
tests of oci:// stores. cosign here is the independent check: it verifies what tunefleet
signed with none of tunefleet's code."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.builders.objects import manifest
from testbed.cluster import ROOT, state_dir


@dataclass(frozen=True)
class Registry:
    host: str  # host:port, as pods and this machine reach it
    ca: Path
    writer: Path  # directories laid out as a dockerconfigjson Secret mounts
    reader: Path
    data: Path  # the registry's filesystem storage (tests tamper with blobs there)

    @classmethod
    def from_state(cls) -> Registry:
        env: dict[str, str] = {}
        for line in (state_dir() / "oci.env").read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                env[key.strip()] = value.strip()
        return cls(
            host=env["TUNEFLEET_OCI_REGISTRY"],
            ca=Path(env["TUNEFLEET_OCI_CA"]),
            writer=Path(env["TUNEFLEET_OCI_CONFIG"]),
            reader=Path(env["TUNEFLEET_OCI_READER_CONFIG"]),
            data=state_dir() / "oci" / "data",
        )

    def secret(self, name: str, who: Path) -> dict[str, Any]:
        """A kubernetes.io/dockerconfigjson Secret of an identity, with the registry's CA."""
        data = {
            ".dockerconfigjson": _b64((who / ".dockerconfigjson").read_bytes()),
            "ca.crt": _b64(self.ca.read_bytes()),
        }
        return manifest("v1", "Secret", name, type="kubernetes.io/dockerconfigjson", data=data)

    def blob_path(self, digest: str) -> Path:
        hexdigest = digest.split(":", 1)[1]
        return self.data / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def tool_env(self, who: Path) -> dict[str, str]:
        """What a Go tool (cosign) needs to reach the registry as `who`."""
        return {**os.environ, "DOCKER_CONFIG": str(who), "SSL_CERT_FILE": str(self.ca)}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def cosign_binary() -> str:
    out = subprocess.run(
        [str(ROOT / "hack/build-tools.sh"), "--cosign"],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return out.stdout.strip().splitlines()[-1]


def cosign(
    args: list[str], env: dict[str, str], timeout: float = 120, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """cosign, run in a temporary directory of its own unless told where: `generate-key-pair
    k8s://...` also writes cosign.pub into its working directory (it once landed at the
    repository's root)."""
    with tempfile.TemporaryDirectory(prefix="cosign-") as scratch:
        return subprocess.run(
            [cosign_binary(), *args], capture_output=True, text=True, env=env, timeout=timeout,
            cwd=cwd or scratch,
        )  # fmt: skip


def _curl(reg: Registry, *args: str, url: str) -> subprocess.CompletedProcess[str]:
    """The registry's HTTP API as the writer, with curl (not tunefleet's client)."""
    auth = json.loads((reg.writer / ".dockerconfigjson").read_text())["auths"][reg.host]["auth"]
    return subprocess.run(
        [
            "curl", "-s", "--cacert", str(reg.ca), "-H", f"Authorization: Basic {auth}",
            "-H", "Accept: application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.oci.image.index.v1+json", *args,
            f"https://{reg.host}/v2/{url}",
        ],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def manifest_json(reg: Registry, repository: str, reference: str) -> dict[str, Any]:
    done = _curl(reg, "-f", url=f"{repository}/manifests/{reference}")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def manifest_digest(reg: Registry, repository: str, reference: str) -> str | None:
    """The digest of the manifest a tag or digest names; None when the registry has none."""
    done = _curl(reg, "-I", url=f"{repository}/manifests/{reference}")
    status = done.stdout.split(None, 2)[1] if done.stdout else ""
    assert status in ("200", "404"), done.stdout[:300]
    if status == "404":
        return None
    return next(
        line.split(":", 1)[1].strip()
        for line in done.stdout.splitlines()
        if line.lower().startswith("docker-content-digest:")
    )


def delete_manifest(reg: Registry, repository: str, reference: str) -> None:
    """Delete the manifest a tag or digest names (Distribution deletes by digest only)."""
    digest = manifest_digest(reg, repository, reference)
    assert digest is not None, reference
    done = _curl(reg, "-f", "-X", "DELETE", url=f"{repository}/manifests/{digest}")
    assert done.returncode == 0, done.stderr


def delete_signatures(reg: Registry, repository: str, digest: str) -> None:
    """Every cosign signature of the image at `digest`, in both formats: the legacy `.sig`
    manifest, and the Sigstore bundles attached as referrers with their `sha256-<hex>` index
    (Distribution has no referrers API, so the index lists them all)."""
    tag = digest.replace(":", "-", 1)
    if manifest_digest(reg, repository, tag + ".sig") is not None:
        delete_manifest(reg, repository, tag + ".sig")
    if manifest_digest(reg, repository, tag) is None:
        return
    for referrer in manifest_json(reg, repository, tag).get("manifests") or []:
        if manifest_digest(reg, repository, referrer["digest"]) is not None:
            delete_manifest(reg, repository, referrer["digest"])
    delete_manifest(reg, repository, tag)


def key_pair(where: Path, password: str) -> Path:
    """A key pair, as `cosign generate-key-pair` writes it, in the new directory `where`."""
    where.mkdir()
    made = subprocess.run(
        [cosign_binary(), "generate-key-pair"], cwd=where, capture_output=True, text=True,
        env={**os.environ, "COSIGN_PASSWORD": password}, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return where


def signing_secret(c: Any, namespace: str, keys: Path, password: str) -> None:
    """The Secret `signing` a profile's storage.signing names: key_pair's files."""
    c.kubectl(
        "create", "secret", "generic", "signing", "-n", namespace,
        f"--from-file=cosign.key={keys / 'cosign.key'}",
        f"--from-file=cosign.pub={keys / 'cosign.pub'}",
        f"--from-literal=cosign.password={password}",
    )  # fmt: skip
