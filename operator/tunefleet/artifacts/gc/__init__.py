"""tunefleet-gc: delete what the artifact store no longer needs and compact each GEMM library.

Keys are content addressed and never overwritten, so without this everything accumulates:
superseded artifacts, checkpoints and shard outputs after the merge, and library entries that
repeat the rows they reused. What is kept and what goes (docs/gc.md says the same):

* **Artifacts** (``<prefix>/<ns>/<profile>/<model>/<sha256>/``): every one named by a profile's
  ``status.artifacts`` or ``status.history``, and the newest N (``--keep``) complete ones of each
  (namespace, profile, GPU model), whether or not the profile still exists. The rest goes.
* **Checkpoints and shard outputs** (``.../_checkpoints/<revision>/``, ``.../_shards/<revision>/``)
  of a revision that is published (its artifact is in the profile's status), superseded (no
  longer the profile's current revision), of a GPU model the spec dropped, or of a profile that
  is gone. Scratch of a current, unpublished revision is what a retried pod resumes from and
  what the merge Job reads: kept.
* **Library entries** (``<prefix>/[<ns>/]_library/<model>/<key>/<sha256>.json``): every good
  entry is merged by merge_results' rule (a timed solution beats a placeholder, the faster
  wins) into compacted entries, one row per GEMM, written first (create-only, under their own
  hash). An entry is deleted only when every GEMM of it is in an entry that stays and is older
  than the grace period, with a row the merge prefers or ties: a reader that listed the library
  before that entry existed has been reading for longer than the grace, so no reader in flight
  loses a row, and what readers merge is the same before and after.
* **Other clusters' artifacts** (fleet mode, docs/fleet.md): the store may be shared by clusters
  that adopt each other's artifacts. Every artifact an unexpired refs doc names
  (``<prefix>/_fleet/refs/<cluster>/<ns>/<profile>.json``, each cluster's operator writes and
  renews one per profile) or a published entry names (``_fleet/<model>/<identity>/artifact.json``)
  is kept. The fleet's objects past their use go: claims expired over an hour ago, expired
  refs docs, and entries whose artifact is gone (whole-store runs only). Fleet objects that do
  not parse keep nothing and are left alone; past 100,000 objects under ``_fleet/`` no
  artifact is deleted at all.
* Nothing younger than the grace period (``--grace``) is deleted, whatever the rules say:
  artifacts being published right now (not yet in any status), scratch being written, entries
  just added. Objects of no layout tunefleet writes are left alone.

It reads the TuningProfiles through the API server (kubeconfig, or the pod's ServiceAccount)
and lists the store before deciding anything: a store it cannot reach, a profile list it cannot
read or a bad URI end it with one line and exit 1 (2 for bad arguments), nothing deleted. A dry
run (the default) writes and deletes nothing and reports what would go and why; ``--apply``
writes the compacted entries, then deletes.

The parts, one job each: inventory (what the store holds, by layout), fleet_state (what the
profiles and the pods running say, read from the API server), fleet_objects (what the other
clusters on the store say, read from its _fleet/ folder), rules (what is kept and what goes, and
`collect`, which decides), compaction (a library's entries verified, merged and superseded),
apply_plan (the writes, then the deletions), report (the text), cli (the command); plan holds
what a run decides, common what they all share.
"""

from __future__ import annotations

# The submodules whose names the tests move (compaction.CHUNK_BYTES, cli.read_profiles and
# read_pinned, rules.clock): a name is moved where it is read.
from . import command, compaction, rules
from .apply_plan import apply
from .command import main, parse_duration
from .common import duration_text
from .compaction import COMPACTED_REVISION, KEPT_FOREIGN
from .fleet_state import read_profiles
from .inventory import ARTIFACT, CHECKPOINTS, ENTRIES, SHARDS
from .plan import Plan, Rules, kept_young
from .report import age_text, report_lines
from .rules import (
    KEPT_CURRENT,
    KEPT_FLEET,
    KEPT_FLEET_ENTRY,
    KEPT_FLEET_REFS,
    KEPT_FLEET_UNLISTED,
    KEPT_PINNED,
    KEPT_REFERENCED,
    KEPT_UNKNOWN,
    collect,
    kept_newest,
)

__all__ = [
    "ARTIFACT",
    "CHECKPOINTS",
    "COMPACTED_REVISION",
    "ENTRIES",
    "KEPT_CURRENT",
    "KEPT_FLEET",
    "KEPT_FLEET_ENTRY",
    "KEPT_FLEET_REFS",
    "KEPT_FLEET_UNLISTED",
    "KEPT_FOREIGN",
    "KEPT_PINNED",
    "KEPT_REFERENCED",
    "KEPT_UNKNOWN",
    "SHARDS",
    "Plan",
    "Rules",
    "age_text",
    "apply",
    "collect",
    "command",
    "compaction",
    "duration_text",
    "kept_newest",
    "kept_young",
    "main",
    "parse_duration",
    "read_profiles",
    "report_lines",
    "rules",
]
