"""tunefleet-bootstrap: copy the tuner_job package into a shared volume.

The tuning Job's first init container (our image) runs this; the next one (the user's image,
which has torch but none of our dependencies) then runs `python3 DEST/tuner_job` (by path: the
image's PYTHONPATH is left as it is). The copy is made beside the target and renamed into
place, so a restarted init container never leaves a half-copied package behind.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import tuner_job

PROG = "tunefleet-bootstrap"


def bootstrap(dest: Path) -> Path:
    source = Path(tuner_job.__file__).resolve().parent
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "tuner_job"
    staging = Path(tempfile.mkdtemp(prefix=".tuner_job.", dir=dest))
    try:
        copy = staging / "tuner_job"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if target.exists():
            shutil.rmtree(target)
        copy.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Copy tuner_job into DIR/tuner_job.")
    parser.add_argument("--dest", required=True, help="directory to copy tuner_job into")
    args = parser.parse_args(argv)
    try:
        target = bootstrap(Path(args.dest))
    except OSError as exc:
        print(f"{PROG}: error: cannot copy tuner_job to {args.dest}: {exc}", file=sys.stderr)
        return 1
    print(f"{PROG}: copied tuner_job {tuner_job.__version__} to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
