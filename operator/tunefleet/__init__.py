"""tunefleet: offline PyTorch TunableOp tuning as a Kubernetes fleet service."""

__version__ = "0.1.0"

GROUP = "tunefleet.io"
VERSION = "v1alpha1"
PLURAL = "tuningprofiles"
KIND = "TuningProfile"
