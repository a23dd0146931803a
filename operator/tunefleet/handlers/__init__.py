"""kopf handlers, thin by design: each names its kind and event and delegates.

Importing this package registers every handler with kopf.
"""

from tunefleet.handlers import capture, delivery, job, pod, startup, tuningprofile

__all__ = ["capture", "delivery", "job", "pod", "startup", "tuningprofile"]
