"""tuner_job: records, tunes and describes TunableOp GEMMs inside the user's inference image.

Standard library and torch only (torch is imported lazily), so that `python3 -m tuner_job`
runs in any image that can serve with PyTorch, from a copy placed there by an init container.
"""

__version__ = "0.1.0"
