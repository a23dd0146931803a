"""Fixtures of the conformance suite: real torch as the reference, run as subprocesses.

The real wheels live in venvs outside the repo (hack/torch-venvs.sh, which `make test` runs
first): exactly the versions pinned in hack/torch-versions.txt (2.11.0, the reader's oracle,
and the newest pinned, which plays "the newest release"; TUNEFLEET_TORCH_VERSIONS overrides the
file as it does for the script). The project's .venv never imports torch; every
question to a torch goes through tests/conformance/probe.py run by that torch's interpreter,
or by this interpreter with the stand-in torch on PYTHONPATH (the same probes, so the stand-in
is checked where it claims to behave as torch).

Without the pinned venvs the suite is skipped, unless TUNEFLEET_CONFORMANCE=required (make test sets
it), where their absence fails it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.torches import BASELINE, Torch, listed, pinned, version_key


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.conformance)


@pytest.fixture(scope="session")
def venvs() -> dict[str, str]:
    found = listed()
    missing = [v for v in pinned() if v not in found]
    if BASELINE not in pinned() or len(pinned()) < 2:
        pytest.fail(
            f"the torch matrix {list(pinned())} must pin {BASELINE} and a newer release "
            "(hack/torch-versions.txt)",
            pytrace=False,
        )
    if missing:
        why = (
            f"the real-torch venvs of {missing} are not built (pinned {list(pinned())}, found "
            f"{sorted(found) or 'none'}): run hack/torch-venvs.sh (make test does)"
        )
        if os.environ.get("TUNEFLEET_CONFORMANCE") == "required":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return found


@pytest.fixture(scope="session")
def torch211(venvs: dict[str, str]) -> Torch:
    return Torch(BASELINE, venvs[BASELINE])


@pytest.fixture(scope="session")
def newest(venvs: dict[str, str]) -> Torch:
    """The newest pinned torch (hack/torch-versions.txt), never whatever PyPI has now."""
    version = max(pinned(), key=version_key)
    return Torch(version, venvs[version])


@pytest.fixture(scope="session")
def real(torch211: Torch, newest: Torch) -> dict[str, Torch]:
    """Both real torches, by version."""
    return {torch211.version: torch211, newest.version: newest}
