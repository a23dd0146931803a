"""The local cluster's OCI registry (hack/cluster-up.sh: CNCF Distribution with TLS and two
identities) and cosign (built from Go modules by hack/build-tools.sh --cosign), for the e2e
tests of oci:// stores. cosign here is the independent check: it verifies what tunefleet
signed with none of tunefleet's code."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.cluster import ROOT, state_dir


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
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {
                ".dockerconfigjson": _b64((who / ".dockerconfigjson").read_bytes()),
                "ca.crt": _b64(self.ca.read_bytes()),
            },
        }

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
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [cosign_binary(), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def manifest_json(reg: Registry, repository: str, reference: str) -> dict[str, Any]:
    """A manifest read straight from the registry's HTTP API (curl: not tunefleet's client)."""
    auth = json.loads((reg.writer / ".dockerconfigjson").read_text())["auths"][reg.host]["auth"]
    out = subprocess.run(
        [
            "curl", "-sf", "--cacert", str(reg.ca), "-H", f"Authorization: Basic {auth}",
            "-H", "Accept: application/vnd.oci.image.manifest.v1+json",
            f"https://{reg.host}/v2/{repository}/manifests/{reference}",
        ],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def delete_manifest(reg: Registry, repository: str, digest: str) -> None:
    auth = json.loads((reg.writer / ".dockerconfigjson").read_text())["auths"][reg.host]["auth"]
    subprocess.run(
        [
            "curl", "-sf", "-X", "DELETE", "--cacert", str(reg.ca),
            "-H", f"Authorization: Basic {auth}",
            f"https://{reg.host}/v2/{repository}/manifests/{digest}",
        ],
        check=True, timeout=30,
    )  # fmt: skip
