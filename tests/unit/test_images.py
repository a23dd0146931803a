"""Image references: what the CRD accepts is what a runtime can parse; repositories compare."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tunefleet.images import REFERENCE_PATTERN, is_reference, parse, repository

CRD = Path(__file__).resolve().parents[2] / "crds" / "tunefleet.io_tuningprofiles.yaml"

VALID = [
    "nginx",
    "nginx:1.25",
    "library/nginx",
    "docker.io/library/nginx:latest",
    "registry.example.com/ml/mistral-serve:1.9.0-cu130",
    "Registry.Example.COM/ml/serve",  # host names are case-insensitive
    "localhost/img",
    "localhost:5000/a/b:t",
    "10.89.0.1:5000/img:t",
    "[::1]:5000/img",
    "ghcr.io/x/y@sha256:" + "a" * 64,
    "ghcr.io/x/y:1.0@sha256:" + "b" * 64,
    "a__b/c.d/e-f---g",
]
INVALID = [
    "",
    "image with space",
    "ml/serve:1.0 ",
    "UPPER/serve",  # a first part without '.', ':' or localhost is a path: lowercase only
    "serve/Model",
    "x:y:z",
    "foo//bar",
    "-a",
    "a___b",
    "img:" + "t" * 129,
    "img@sha256:abc",
    "img@sha256:" + "g" * 64,
    "https://registry.example.com/img",
]


@pytest.mark.parametrize("ref", VALID)
def test_valid_references(ref: str) -> None:
    assert is_reference(ref)


@pytest.mark.parametrize("ref", INVALID)
def test_invalid_references(ref: str) -> None:
    assert not is_reference(ref)


def test_repository_normalises_as_runtimes_do() -> None:
    assert (
        repository("nginx") == repository("docker.io/library/nginx:1") == "docker.io/library/nginx"
    )
    assert repository("serve:1") == repository("serve@sha256:" + "c" * 64)
    assert repository("registry.example.com/serve:1") != repository("serve:1")
    assert repository("not a ref") is None
    assert parse("localhost:5000/a/b:t@sha256:" + "d" * 64).digest == "sha256:" + "d" * 64


def test_the_crd_rule_uses_this_very_pattern() -> None:
    doc = yaml.safe_load(CRD.read_text())
    image = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["image"]
    (rule,) = image["x-kubernetes-validations"]
    assert rule["rule"] == f'self.matches(r"{REFERENCE_PATTERN}")'
