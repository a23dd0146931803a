"""Production misses, from serving pods back to tuning (docs/capture.md).

- hook.py: runs in the user's serving containers (as sitecustomize.py): loads the TunableOp
  results while record-untuned is on, so only true misses are recorded;
- sidecar.py: `tunefleet-capture`, the model pod's capture sidecar: follows the untuned
  files, uploads new misses to the operator;
- endpoint.py: the operator's HTTPS capture endpoint (every replica): authenticates the pod by
  its projected token, attributes the rows from the pod as admitted;
- retune_sets.py: where captures are kept (a ConfigMap per profile, GPU model and identity) and the
  frozen sets of retunes; retune_sets_cache.py: the operator's watch of them;
- loop.py: pure: coverage per GPU model (status.capture), when to retune, and the revision a
  retune tunes under; keys.py: which GEMMs an artifact has.

Nothing here is imported by the sidecar but hook.py, sidecar.py and contracts/capture_upload.py
(standard library only), so the sidecar stays small.
"""
