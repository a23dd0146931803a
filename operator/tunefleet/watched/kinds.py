"""What the operator follows, list then watch (runtime/reflector.py): TuningProfiles, tuning
Jobs, tuning pods, capture and artifact ConfigMaps and admitted model pods, each selected
server-side. One thread per kind and watched namespace (or one per kind, cluster-wide).

Each kind's objects become small views (views.py) in the cache through its event handler
(handlers/, registered with `reflector.on`).

Why not kopf's watches: kopf handles every watch event through its whole machinery (a
per-object worker task holding the raw event, a per-object memory, loggers, handler
invocation): ~300 microseconds of the event loop an event after its own settings are turned
down, against ~40 here (json + view), and it keeps a record of every object it ever saw. With
10,000 profiles, their Jobs and pods (~16 events a profile while they start), that was most
of the operator's CPU, and the webhook shares that event loop (bench/scale.md).

The Node watch of placement/nodemap_keeper.py is not one of these: it follows a set of label keys
that changes with the profiles (a watch started and stopped per key), metadata only, and keeps no
views in this cache; it is a list-then-watch thread of its own, as these are.
"""

from __future__ import annotations

from tunefleet import GROUP, PLURAL, VERSION, naming
from tunefleet.contracts.admission_record import ADMISSION_LABEL
from tunefleet.runtime.reflector import Kind

_MANAGED = ",".join(f"{k}={v}" for k, v in naming.MANAGED_BY.items())
PROFILES = Kind("tuningprofiles", f"/apis/{GROUP}/{VERSION}", PLURAL)
# Only what the cache keeps crosses the wire: tuning Jobs and tuning pods, selected by label.
JOBS = Kind("jobs", "/apis/batch/v1", "jobs", f"{_MANAGED},{naming.PROFILE_UID_LABEL}")
PODS = Kind("pods", "/api/v1", "pods", f"{_MANAGED},{naming.PROFILE_UID_LABEL}")
# Capture stores and retune sets (capture/retune_sets.py): the ConfigMaps the capture cache keeps.
CAPTURE_CONFIGMAPS = Kind(
    "configmaps", "/api/v1", "configmaps",
    f"{_MANAGED},{naming.ROLE_LABEL} in ({naming.ROLE_CAPTURE},{naming.ROLE_RETUNE})",
)  # fmt: skip
# Artifact ConfigMaps (delivery.py): one deleted or replaced is made again within seconds,
# and admission serves from the store meanwhile (delivered.py keeps their identities).
ARTIFACT_CONFIGMAPS = Kind(
    "artifact-configmaps", "/api/v1", "configmaps",
    f"{_MANAGED},{naming.ROLE_LABEL}=artifact", metadata_only=True,
)  # fmt: skip
# Model pods the webhook admitted (served.py): those that run without their artifact for a
# cause of ours are counted in their profile's Degraded condition.
MODEL_PODS = Kind("model-pods", "/api/v1", "pods", f"{naming.PROFILE_LABEL},{ADMISSION_LABEL}")
