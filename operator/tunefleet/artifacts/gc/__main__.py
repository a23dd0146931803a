"""`python -m tunefleet.artifacts.gc`: the same command as the tunefleet-gc script."""

from __future__ import annotations

import sys

from .command import main

if __name__ == "__main__":
    sys.exit(main())
