"""The routines of `make bench`, in the order a full run takes them, with what each measures:
the one table that bench/__main__.py (the command line, whose --help imports nothing heavy) and
bench/suite.py (which runs them) both read."""

from __future__ import annotations

ROUTINES = {
    "scale": "operator scale: 1,000 / 3,000 / 10,000 profiles created, restarted, deleted",
    "storm": "100 SIGKILLs while 20 two-model profiles are created",
    "churn": "1,000 profiles created and deleted 5 times: the operator's memory",
    "webhook": "webhook latency and its cost as a ratio of pod create latency",
    "library": "GEMM library reuse, sharding and resume (stand-in torch)",
    "artifacts": "publish and fetch of a 1 MB results file",
    "gc": "tunefleet-gc on a store of 10,000 objects",
    "real": "real node: tuning Job and model pod start-up, bursts, the store unreachable",
    "nodemap": "the node map at 10,000 nodes (no cluster)",
    "metrics": "the /metrics scrape at 10,000 profiles in the operator's cache (no cluster)",
    "bids": "fleet bids on a registry, simulated: skew, slow writes, ghosts (no cluster)",
    "capture": "the capture sidecar and loop",
    "bundles": "real node, real torch: a torchCompile bundle's start-up saving (eager, cold, bundle)",
    "vllm": "real node, real vLLM: a vllm bundle's server start-up saving (eager, cold, bundle)",
    "large": "a 1 GiB bundle: gzip against zstd, and tune, publish and fetch on the real node (S3)",
    "oci": "real node: 20-pod bursts served an OCI volume image, OCI fetch, S3 ConfigMap, S3 fetch",
    "fleet": "two clusters on one store in fleet mode: Jobs per identity, adoption, takeover",
    "trust": "100 concurrent pin writers; 50 pods on 3 volume models behind a 2 s/request registry",
    "broker": "real node: a 1 GiB bundle published through the store broker (S3) and the "
    "registry proxy (OCI), and with a Secret",
}
