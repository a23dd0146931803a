"""kubectl tunefleet: a kubectl plugin (console script ``kubectl-tunefleet``) that shows what
tunefleet did, why a pod got (or did not get) an artifact, and fetches or compares artifacts.

``main`` is the thin CLI; the rest is pure: ``status``, ``why`` and ``diff`` turn plain dicts
(as ``kubectl get -o json`` shows them) into reports and text, and are unit-tested without a
cluster. ``cluster`` and ``artifacts`` are the only modules that talk to the API server or S3.
"""
