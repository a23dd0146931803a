"""tuner_job: records, tunes and describes TunableOp GEMMs inside the user's inference image.

Standard library and torch only (torch is imported lazily), so that `python3 -m tuner_job` runs in
any image that can serve with PyTorch, from a copy placed there by an init container. Python
3.10+, since user images may have it.

Two layers, and only the first is shared with the tunefleet image (the operator's publish,
fetch, sync and merge steps import it; a test fails if they import a private name):

The format layer (stdlib only, public, the contracts both images read and write):
  results   the one TunableOp CSV parser and writer (results and untuned files)
  manifest  manifest.json, what an artifact is and how it was tuned
  output    the tuner's output directory: results.csv + manifest.json, canonical bytes
  library   the GEMM library's identity key, entries, checkpoints, sharding
  exchange  the files between the tune step and the sync sidecar
  config    the tuning configuration the operator hands the tune step
  files     atomic writes, SHA-256, termination messages
  caches    the caches a workload fills: kinds, variables, deterministic packing, archive
            checks, the caches-only index
  gain      what an artifact buys: its figures, their statistics, and the promotion gate
  serving   the serving report a model-serving workload writes while measured (KV cache, decode)

Only in the user's image (they may import torch, and start the workload):
  cli       `python -m tuner_job {record,tune,identify,run}`
  machine   the probe child: torch, the GPU, the shapes and the identity (the tuner's own
            process never imports torch)
  record    run the workload or the shape list under TunableOp's record mode
  tune      offline tuning: an orchestrator and one worker process per GPU, under a budget
  torchapi  every torch.cuda.tunable function and PYTORCH_TUNABLEOP_* variable used, and how
            the profile's settings reach TunableOp
  gpu       torch, the GPU and the machine's identity (partitions included)
  measure   after tuning: the GEMMs and the workload timed with and without the artifact
  _proc     process-group handling for the workload and the tuning processes
"""

# tunefleet's release (tunefleet.__version__; tuner_job cannot import it), written into every
# manifest as toolVersion. tests/unit/test_version.py keeps them in step.
__version__ = "0.2.0"

# The modules the tunefleet image may import (see above); tests/unit/test_layering.py checks.
FORMAT_LAYER = (
    "results", "manifest", "output", "library", "exchange", "config", "files", "caches",
    "gain", "serving",
)  # fmt: skip
