"""hack/wheels.sh, the one way the project's venvs and images get wheels: pip's resolver every
run (only missing files download), the images' interpreter's whole tag list under --image (the
fresh-machine failure was one hand-picked platform tag refusing a manylinux_2_27 wheel), and a
pin that does not resolve fails at once, naming it. The index is a local directory of wheels
made here (pip --no-index --find-links), so nothing is downloaded."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "wheels.sh"


def make_wheel(index: Path, name: str, version: str, tag: str, requires: str = "") -> Path:
    """A minimal wheel (METADATA, WHEEL, RECORD): all pip's resolver reads."""
    index.mkdir(parents=True, exist_ok=True)
    path = index / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires.split(",") if r)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def resolve(cache: Path, index: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "TUNEFLEET_"))}
    full.update(TUNEFLEET_CACHE=str(cache), **env)
    return subprocess.run(
        [str(SCRIPT), *args, "--no-index", "--find-links", str(index)],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A torch-like set: a platform wheel tagged for an older glibc than the image's (the
    fresh-machine failure: nvidia-cudnn-cu13 is manylinux_2_27), one that needs a newer glibc
    than the image's (2.39 > bookworm's 2.36), and a pure dependency."""
    idx = tmp_path / "index"
    make_wheel(idx, "fakecudnn", "9.19.0", "py3-none-manylinux_2_27_x86_64")
    make_wheel(idx, "fakedep", "1.0", "py3-none-any")
    make_wheel(
        idx, "faketorch", "2.11.0", "cp311-cp311-manylinux_2_28_x86_64", "fakecudnn==9.19.0,fakedep"
    )
    make_wheel(idx, "fakenewglibc", "1.0", "cp311-cp311-manylinux_2_39_x86_64")
    return idx


def wheels_in(directory: Path) -> list[str]:
    return sorted(p.name.split("-")[0] for p in directory.glob("*.whl"))


def test_image_resolution_takes_every_manylinux_tag_the_images_glibc_accepts(
    tmp_path: Path, index: Path
) -> None:
    done = resolve(tmp_path, index, "--image", "torch-x", "faketorch==2.11.0")
    assert done.returncode == 0, done.stderr
    dest = tmp_path / "wheels" / "torch-x"
    assert done.stdout.splitlines()[-1] == str(dest)
    assert wheels_in(dest) == ["fakecudnn", "fakedep", "faketorch"]
    assert "downloaded 3 file(s)" in done.stderr


def test_a_wheel_for_a_newer_glibc_than_the_images_does_not_resolve_for_it(
    tmp_path: Path, index: Path
) -> None:
    done = resolve(
        tmp_path, index, "--image", "x", "fakenewglibc==1.0", WHEELS_PIN_SOURCE="hack/some-pins.txt"
    )
    assert done.returncode == 1
    assert "could not resolve fakenewglibc==1.0 " in done.stderr
    assert "for the image interpreter" in done.stderr
    assert "no wheel of fakenewglibc==1.0 fits" in done.stderr
    assert "check the pin in hack/some-pins.txt" in done.stderr


def test_every_run_resolves_and_downloads_only_what_is_missing(tmp_path: Path, index: Path) -> None:
    first = resolve(tmp_path, index, "--image", "torch-x", "faketorch==2.11.0")
    assert first.returncode == 0, first.stderr
    dest = tmp_path / "wheels" / "torch-x"
    # Warm: resolves again, downloads nothing, says nothing.
    again = resolve(tmp_path, index, "--image", "torch-x", "faketorch==2.11.0")
    assert (again.returncode, again.stderr) == (0, "")
    # One wheel deleted from the directory: the next run brings it back, and only it.
    next(dest.glob("fakecudnn-*.whl")).unlink()
    healed = resolve(tmp_path, index, "--image", "torch-x", "faketorch==2.11.0")
    assert healed.returncode == 0, healed.stderr
    assert "downloaded 1 file(s), 3 wheel(s)" in healed.stderr
    assert wheels_in(dest) == ["fakecudnn", "fakedep", "faketorch"]


def test_a_pin_the_index_lacks_fails_at_once_with_what_to_do(tmp_path: Path, index: Path) -> None:
    done = resolve(
        tmp_path,
        index,
        "torch-x",
        "faketorch==2.11.99",
        WHEELS_PIN_SOURCE="hack/torch-versions.txt",
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "could not resolve faketorch==2.11.99 " in done.stderr
    assert "for the host interpreter" in done.stderr
    assert "no wheel of faketorch==2.11.99 fits" in done.stderr
    assert "(from versions: 2.11.0)" in done.stderr  # pip's own words, passed on
    assert "check the pin in hack/torch-versions.txt" in done.stderr


def test_host_resolution_uses_the_hosts_own_tags(tmp_path: Path, index: Path) -> None:
    """The venvs' path: the host interpreter's own tags (this CPython, this glibc)."""
    done = resolve(tmp_path, index, "torch-x", "fakedep==1.0")
    assert done.returncode == 0, done.stderr
    assert wheels_in(tmp_path / "wheels" / "torch-x") == ["fakedep"]


@pytest.mark.parametrize("name", ["", "../up", "a b"])
def test_a_bad_directory_name_is_refused(tmp_path: Path, index: Path, name: str) -> None:
    done = resolve(tmp_path, index, name, "fakedep==1.0")
    assert done.returncode == 2
    assert not (tmp_path / "wheels").exists() or not any((tmp_path / "wheels").iterdir())
