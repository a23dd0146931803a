"""The local cluster as its users meet it: the control plane and S3 server, the real node, the
registry, tunefleet installed as users install it, and the waits. The e2e tests, the demo
(hack/demo.py) and the benchmarks (bench/) share it; it imports nothing from tests/, so none of
them has to import test code (tests/unit/test_layering.py keeps it so)."""
