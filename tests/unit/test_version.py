"""One release number everywhere: pyproject.toml's version, the chart's version and appVersion
(the image tag hack/images.sh builds and the chart deploys), tunefleet.__version__ (the
operator's start-up line, `kubectl tunefleet version`, the default image) and
tuner_job.__version__ (manifests' toolVersion). Bumping one and not the others fails here, as
does a release missing from CHANGELOG.md or hack/releases.txt out of order."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import tuner_job
from tunefleet import __main__ as entry
from tunefleet import __version__
from tunefleet.config import Config

ROOT = Path(__file__).resolve().parents[2]
CHART = yaml.safe_load((ROOT / "charts" / "tunefleet" / "Chart.yaml").read_text())
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?$")
RELEASES = ROOT / "hack" / "releases.txt"


def semver(text: str) -> tuple[int, int, int]:
    m = SEMVER.match(text)
    assert m, f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH)"
    return int(m[1]), int(m[2]), int(m[3])


def releases() -> list[tuple[str, str]]:
    out = []
    for line in RELEASES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            version, commit = line.split()
            out.append((version, commit))
    return out


def test_pyproject_chart_and_packages_say_the_same_version() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    semver(pyproject)
    found = {
        "pyproject.toml [project] version": pyproject,
        "charts/tunefleet/Chart.yaml version": str(CHART["version"]),
        "charts/tunefleet/Chart.yaml appVersion": str(CHART["appVersion"]),
        "tunefleet.__version__ (operator/tunefleet/__init__.py)": __version__,
        "tuner_job.__version__ (tuner_job/__init__.py)": tuner_job.__version__,
    }
    drift = {k: v for k, v in found.items() if v != pyproject}
    assert not drift, (
        f"the release is {pyproject} in pyproject.toml, but {drift}: bump them together "
        "(and add the release to CHANGELOG.md)"
    )


def test_the_image_is_tagged_with_the_release() -> None:
    assert Config().image == f"ghcr.io/tunefleet/tunefleet:{__version__}"
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    listed = subprocess.run(
        [str(ROOT / "hack" / "images.sh"), "--list"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    images = dict(line.split()[:2] for line in listed.splitlines())
    assert images["tunefleet"] == f"ghcr.io/tunefleet/tunefleet:{CHART['appVersion']}"


def test_no_file_names_another_tunefleet_image_tag() -> None:
    """Docs, chart, scripts and code name the image by <appVersion> or the current release,
    never a release it used to be."""
    pattern = re.compile(r"ghcr\.io/tunefleet/tunefleet:(\d+\.\d+\.\d+)")
    suffixes = ("", ".md", ".py", ".sh", ".yaml", ".tpl", ".txt", ".json")
    stale = []
    for folder in ("README.md", "Dockerfile", "docs", "charts", "hack", "operator", "examples"):
        for path in [ROOT / folder] if (ROOT / folder).is_file() else (ROOT / folder).rglob("*"):
            if not path.is_file() or path.suffix not in suffixes:
                continue
            for m in pattern.finditer(path.read_text(errors="replace")):
                if m[1] != __version__:
                    stale.append(f"{path.relative_to(ROOT)}: {m[0]}")
    assert not stale, f"image tags that are not the release {__version__}: {stale}"


def test_the_changelog_has_this_release_and_every_tagged_one() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", text, re.M)
    assert headings and headings[0] == __version__, (
        f"CHANGELOG.md's newest release is {headings[:1]}, the code's is {__version__}: add a "
        f"'## [{__version__}]' section"
    )
    assert [semver(v) for v in headings] == sorted((semver(v) for v in headings), reverse=True)
    missing = [v for v, _ in releases() if v not in headings]
    assert not missing, f"released but not in CHANGELOG.md: {missing}"


def test_releases_are_ordered_and_older_than_this_version() -> None:
    listed = releases()
    assert listed, f"{RELEASES} lists no release"
    versions = [semver(v) for v, _ in listed]
    assert versions == sorted(set(versions)), f"{RELEASES}: oldest first, each once"
    for version, commit in listed:
        assert re.fullmatch(r"[0-9a-f]{40}", commit), f"{version}: a full commit id, not {commit!r}"
    # The working tree is a release at or after the last one tagged (equal once it is tagged).
    assert versions[-1] <= semver(__version__)
    # Where the tags travelled with the repository, they name the recorded commits.
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return
    for version, commit in listed:
        tag = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "-q", "--verify", f"refs/tags/v{version}^{{commit}}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if tag.returncode == 0:
            assert tag.stdout.strip() == commit, f"tag v{version} is not {RELEASES}'s {commit}"


def test_the_operators_first_log_line_names_its_release() -> None:
    line = entry.startup_line({"LD_PRELOAD": f"/usr/lib/x86_64-linux-gnu/{entry.JEMALLOC}"})
    assert line == f"tunefleet operator {__version__} starting; allocator: jemalloc"
    assert entry.startup_line({}).endswith("allocator: glibc")
    done = subprocess.run(
        [sys.executable, "-m", "tunefleet", "--version"],
        capture_output=True, text=True, timeout=60,
        env={"TUNEFLEET_ALLOCATOR": "glibc", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"tunefleet-operator {__version__}"
