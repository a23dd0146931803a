"""The one error type the CLI reports as a single line (never a traceback)."""

from __future__ import annotations


class PluginError(Exception):
    """An expected failure; the message says what happened and what to do, on one line."""

    def __init__(self, message: str) -> None:
        # A multi-line cause (a kubeconfig parse error, an S3 message) must still print as one.
        super().__init__(" ".join(message.split()))
