"""kopf handlers, thin by design: each names its kind and event and delegates.

Importing this package registers every handler with kopf.
"""

from tunefleet.handlers import on_capture, on_delivery, on_job, on_pod, on_profile, startup

__all__ = ["on_capture", "on_delivery", "on_job", "on_pod", "on_profile", "startup"]
