"""hack/disk-check.sh, the first thing `make test` and `make demo` run: with too little free
disk it fails at once, naming the GB each part needs, where it goes and the free space found;
with enough it passes in one line; a part already there (cached) needs nothing. `df` is a fake
on PATH that reports whatever free space the test sets, per filesystem."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "disk-check.sh"
GB_KIB = 1_000_000_000 // 1024  # df -Pk counts 1024-byte blocks

# df -Pk PATH, faked: the filesystem whose path holds "bigcache" is /cache with FAKE_CACHE_KIB
# free (when set), every other one is / with FAKE_FREE_KIB free.
FAKE_DF = """#!/bin/sh
for last; do :; done
mnt=/ avail="$FAKE_FREE_KIB"
case "$last" in
  *bigcache*) [ -n "$FAKE_CACHE_KIB" ] && mnt=/cache avail="$FAKE_CACHE_KIB" ;;
esac
echo "Filesystem     1024-blocks      Used Available Capacity Mounted on"
echo "/dev/fake        999999999         0 $avail        1% $mnt"
"""


def check(
    tmp_path: Path,
    target: str,
    free_gb: float,
    cache_free_gb: float | None = None,
    cache: Path | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    df = fake_bin / "df"
    df.write_text(FAKE_DF)
    df.chmod(0o755)
    full = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFLEET_")}
    full.update(
        PATH=f"{fake_bin}:{os.environ['PATH']}",
        HOME=str(tmp_path / "home"),
        TUNEFLEET_CACHE=str(cache or tmp_path / "cache"),
        TUNEFLEET_STATE=str(tmp_path / "state"),
        FAKE_FREE_KIB=str(int(free_gb * GB_KIB)),
        FAKE_CACHE_KIB="" if cache_free_gb is None else str(int(cache_free_gb * GB_KIB)),
        **env,
    )
    return subprocess.run(
        [str(SCRIPT), target], env=full, capture_output=True, text=True, timeout=30, check=False
    )


def warm(cache: Path, state: Path) -> None:
    """What a finished `make test` leaves: every archive, venv stamp, wheel and node marker."""
    archives = cache / "images"
    archives.mkdir(parents=True)
    for name in [
        "pause",
        "base",
        "tunefleet",
        "standin",
        "standin-nogpu",
        "standin-noshell",
        "standin-nopython",
        "torch-cpu",
        "vllm-cpu",
    ]:
        (archives / f"{name}-0123456789abcdef.tar").write_text("x")
    for v in ["2.11.0", "2.15.0"]:
        (cache / "torch" / v).mkdir(parents=True)
        (cache / "torch" / v / f"stamp-{v}").write_text(f"torch=={v}\n")
        (cache / "wheels" / f"torch-{v}").mkdir(parents=True)
        (cache / "wheels" / f"torch-{v}" / "torch-x.whl").write_text("x")
    (state / "node" / "images").mkdir(parents=True)
    for name in ["torch-cpu", "vllm-cpu"]:
        (state / "node" / "images" / name).write_text("key\n")


def test_too_little_disk_fails_at_once_naming_each_part_its_place_and_the_free_space(
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    done = check(tmp_path, "test", free_gb=1, TUNEFLEET_TORCH_VERSIONS="2.11.0 2.15.0")
    assert time.monotonic() - t0 < 10
    assert done.returncode == 1, done.stderr
    err = done.stderr
    # The whole fresh make test: 13 + 21 + 10 + 5.4 + 4 GB.
    assert "needs about 53.4 GB, found 1.0 GB free" in err
    cache, state = tmp_path / "cache", tmp_path / "state"
    for part, gb, where in [
        ("images: torch-cpu", "5.0", f"{cache}/images"),
        ("torch venv 2.15.0", "5.0", f"{cache}/torch/2.15.0"),
        ("wheels torch 2.11.0", "2.7", f"{cache}/wheels/torch-2.11.0"),
        ("node: vllm-cpu image", "6.5", f"{state}/node"),
        ("e2e scratch", "4.0", f"{state}"),
    ]:
        assert re.search(rf"^ +{re.escape(part)} +{gb} GB  {re.escape(where)}$", err, re.M), part
    assert "TUNEFLEET_DISK_CHECK=0 skips" in err


def test_plenty_of_disk_passes_in_one_line(tmp_path: Path) -> None:
    done = check(tmp_path, "test", free_gb=1000)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "disk-check: make test needs about 53.4 GB of 1000.0 GB free on /: enough"
    ]


def test_demo_needs_far_less_than_test(tmp_path: Path) -> None:
    assert check(tmp_path, "test", free_gb=5).returncode == 1
    done = check(tmp_path, "demo", free_gb=5)
    assert done.returncode == 0, done.stderr
    assert "make demo needs about 3.0 GB of 5.0 GB free" in done.stdout
    done = check(tmp_path, "demo", free_gb=2)
    assert done.returncode == 1
    assert "needs about 3.0 GB, found 2.0 GB free" in done.stderr


def test_what_is_already_there_needs_nothing(tmp_path: Path) -> None:
    warm(tmp_path / "cache", tmp_path / "state")
    # Warm: only what the cluster and the tests' pods write (9.5 + 4 GB) is still to come.
    done = check(tmp_path, "test", free_gb=15)
    assert done.returncode == 0, done.stderr
    assert "needs about 13.5 GB of 15.0 GB free on /" in done.stdout
    done = check(tmp_path, "test", free_gb=10)
    assert done.returncode == 1
    assert "torch venv" not in done.stderr and "images:" not in done.stderr
    assert "node: cluster, pods" in done.stderr


def test_each_filesystem_is_checked_for_its_own_parts(tmp_path: Path) -> None:
    cache = tmp_path / "bigcache"
    cache.mkdir()
    # The caches' disk is large; the state's (/) is short of its 21 + 4 GB.
    done = check(tmp_path, "test", free_gb=20, cache_free_gb=500, cache=cache)
    assert done.returncode == 1, done.stdout
    assert "on /: needs about 25.0 GB, found 20.0 GB free" in done.stderr
    assert "on /cache" not in done.stderr and "torch venv" not in done.stderr
    done = check(tmp_path, "test", free_gb=30, cache_free_gb=500, cache=cache)
    assert done.returncode == 0, done.stderr
    assert "28.4 GB of 500.0 GB free on /cache; 25.0 GB of 30.0 GB free on /: enough" in done.stdout


def test_turned_off_it_says_so_and_passes(tmp_path: Path) -> None:
    done = check(tmp_path, "test", free_gb=0, TUNEFLEET_DISK_CHECK="0")
    assert done.returncode == 0
    assert "skipped (TUNEFLEET_DISK_CHECK=0)" in done.stderr


def test_an_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    assert check(tmp_path, "bench", free_gb=1000).returncode == 2
