"""The local cluster as its users meet it: the control plane and S3 server, the real node, the
registry, tunefleet installed as users install it, and the waits; and build/, the one home of the
builders of Kubernetes objects and test objects. The e2e and unit tests, the demo (hack/demo.py)
and the benchmarks (bench/) share it; it imports no test code, so none of them has to
(tests/unit/test_layering.py keeps it so)."""
