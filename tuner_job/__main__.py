"""`python3 -m tuner_job`. The guard matters: mgpu_tune_gemm_in_file's spawned workers re-import
this module as __mp_main__, and must not start a tuner of their own."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
