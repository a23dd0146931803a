"""`python3 -m tuner_job` (or `python3 <dir>/tuner_job`).

The guard matters: mgpu_tune_gemm_in_file's spawned workers re-import this module as
__mp_main__, and must not start a tuner of their own.
"""

import sys

if __name__ == "__main__":
    if not __package__:
        # Run as a directory (`python3 /tunefleet/tools/tuner_job`): make the package importable.
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tuner_job.cli import main

    sys.exit(main())
