"""Fleet bids on a registry (fleet/bids.py: claims on a store with no conditional write),
simulated: testbed/bids_sim.py's contenders bid through the operator's own code on an
in-memory board whose notes show once written. Each case is 400 trials with the seed of its
unit test (tests/unit/test_fleet_bids.py), so the figures are those runs': the most that held
the claim at one moment, the trials where one held at the end, and the longest any contender
waited on a ghost bid (simulated seconds). No cluster, no store.

    python -m bench bids
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from bench.results import progress  # noqa: E402
from testbed.bids_sim import SETTLE, Trial, trial  # noqa: E402
from tunefleet.fleet import bids  # noqa: E402

TRIALS = 400
GHOST_DAY_S = 86400  # a ghost's expiry: a day after its post (testbed/bids_sim.py)

# name: (seed, skew, slowest write, slowest listing, windows, ghost while watching, ghost
# before anyone looked). Cases that share a seed run one after another on one generator, as
# their unit test does.
CASES: dict[str, tuple[int, float, float, float, tuple[float, ...], bool, bool]] = {
    "five_s_windows": (42, SETTLE / 3, SETTLE * 0.8, 4.0, (SETTLE,), False, False),
    "skew_beyond_the_window": (7, SETTLE * 4, 0.1, 10.0, (SETTLE,), False, False),
    "windows_60s_and_1s": (54, 0.0, 0.0, 4.0, (60.0, 1.0), False, False),
    "ghost_while_watching": (5, SETTLE / 3, SETTLE * 0.8, 4.0, (SETTLE,), True, False),
    "ghost_before_anyone_looked": (11, SETTLE / 3, SETTLE * 0.8, 4.0, (SETTLE,), False, True),
    "ghost_before_anyone_looked_60s_and_1s": (11, 0.0, 0.0, 4.0, (60.0, 1.0), False, True),
}


def figures(runs: list[Trial], case: tuple[Any, ...]) -> dict[str, Any]:
    seed, skew, slow, reads, windows, ghost, ghost_first = case
    return {
        "trials": len(runs),
        "seed": seed,
        "skew_s": round(skew, 3),
        "slowest_write_s": round(slow, 3) if len(windows) == 1 else "0.8 of its window",
        "slowest_listing_s": reads,
        "windows_s": list(windows),
        "ghost": "before anyone looked" if ghost_first else "while watching" if ghost else None,
        "max_holders_at_once": max(r.most for r in runs),
        "trials_where_one_held": sum(r.held for r in runs),
        "longest_ghost_wait_s": max(r.ghost_wait_s for r in runs),
    }


def run(trials: int = TRIALS) -> dict[str, Any]:
    out: dict[str, Any] = {
        "live_seconds": bids.LIVE_SECONDS,
        "ghost_expiry_s": GHOST_DAY_S,
    }
    generators: dict[int, random.Random] = {}
    for name, case in CASES.items():
        seed, skew, slow, reads, windows, ghost, ghost_first = case
        rng = generators.setdefault(seed, random.Random(seed))
        runs = [trial(rng, skew, slow, reads, windows, ghost, ghost_first) for _ in range(trials)]
        out[name] = figures(runs, case)
        progress("bids", f"{name}: {out[name]['max_holders_at_once']} at most held at once")
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
