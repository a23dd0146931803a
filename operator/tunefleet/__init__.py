"""tunefleet: offline PyTorch TunableOp tuning as a Kubernetes fleet service."""

# The release: the same in pyproject.toml ([project] version), charts/tunefleet/Chart.yaml
# (version and appVersion, the image tag) and tuner_job/__init__.py; tests/unit/test_version.py
# fails when they drift. CHANGELOG.md says what each release changed.
__version__ = "0.2.0"

GROUP = "tunefleet.io"
VERSION = "v1alpha1"
PLURAL = "tuningprofiles"
KIND = "TuningProfile"
