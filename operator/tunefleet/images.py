"""Container image references, as the distribution/reference grammar defines them.

The CRD's `spec.image` pattern is REFERENCE_PATTERN (crds/ and the pydantic model use the same
text, checked by tests/unit/test_schema_drift.py), so a reference that a kubelet could not
parse never becomes a Job. `repository()` names what a reference points into, so the webhook can
tell the container that runs the tuned image (another tag or digest of it, or the same) from a
sidecar that never loads PyTorch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
# A first component is a registry only when it looks like a host (a dot, a port, localhost),
# as the runtimes decide; otherwise it is part of the (lowercase) repository path.
_DOMAIN = (
    rf"(?:localhost(?::[0-9]+)?|{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})+(?::[0-9]+)?"
    rf"|{_DOMAIN_COMPONENT}:[0-9]+|\[[a-fA-F0-9:]+\](?::[0-9]+)?)"
)
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

REFERENCE_PATTERN = (
    rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
)
_REFERENCE_RE = re.compile(REFERENCE_PATTERN)
_NAMED_RE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)
DEFAULT_DOMAIN = "docker.io"


@dataclass(frozen=True)
class Reference:
    domain: str
    path: str
    tag: str | None
    digest: str | None

    @property
    def repository(self) -> str:
        return f"{self.domain}/{self.path}"


def is_reference(text: str) -> bool:
    return len(text) <= 512 and bool(_REFERENCE_RE.match(text))


def parse(text: str) -> Reference:
    """Split a reference; docker.io and library/ are filled in as the runtimes do."""
    m = _NAMED_RE.match(text)
    if m is None or len(text) > 512:
        raise ValueError(f"{text!r} is not a container image reference")
    domain, path = m["domain"], m["path"]
    if domain is None:
        domain = DEFAULT_DOMAIN
        if "/" not in path:
            path = f"library/{path}"
    return Reference(domain, path, m["tag"], m["digest"])


def repository(text: str) -> str | None:
    """domain/path of a reference, or None when it is not one."""
    try:
        return parse(text).repository
    except ValueError:
        return None
