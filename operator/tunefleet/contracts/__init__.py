"""The contracts between tunefleet's processes, each written and read by its one module here:

- artifact_record.py: the artifact record (publish/merge termination message -> status.artifacts[]);
- admission_record.py: what the webhook writes on a pod (its decision code, the pinned artifact) and
  what the reconciler and `kubectl tunefleet why` read of it;
- fetch_outcome.py: the fetch init container's outcome line (its termination message).

The tune step and the sync sidecar meet in files owned by tuner_job/exchange.py (stdlib only,
it runs in the user's image); the tuning configuration is tuner_job/config.py's.
"""
