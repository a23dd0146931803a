"""The one home of the builders of Kubernetes objects and test objects: the unit and e2e tests
build from here, and so does the rest of testbed/ (the real node's, torch.compile's and vLLM's
profiles start from make_profile), which the benchmarks import (tests/unit/test_layering.py
keeps it so: no builder in a test module or beside the tests' fakes and runners).

- `wrappers.py`: one wrapper per kind, kueue's style (`make_profile`, the one base
  TuningProfile; `make_job`, `make_pod`, `make_node`, `make_object`, ...);
- `profiles.py`: TuningProfiles and their Jobs as the operator's views see them (unit tests);
- `records.py`: a tuning pod's published record as the operator reads it (unit tests);
- `fleet.py`: TuningProfiles and model pods for the kwok fleet (e2e tests);
- `largest.py`: the largest spec the CRD accepts;
- `tuner.py`: a tuning config as the tune step reads it."""
