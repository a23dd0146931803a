"""The largest TuningProfile spec the CRD accepts: every list full, every string at its bound.

Unit tests check that it, and everything derived from it, fits what Kubernetes and exec(2)
take; e2e tests apply it (and one character more) to the real API server.
"""

from __future__ import annotations

from typing import Any

from tunefleet.api.models import MAX_ARGV_CHARS, MAX_ENV_VALUE_CHARS, STORAGE_URI_MAX


def _dns(n: int, fill: str) -> str:
    """A DNS subdomain of exactly n characters: 63-character labels joined by dots."""
    labels, left = [], n
    while left > 0:
        size = min(63, left)
        labels.append(fill * size)
        left -= size + 1
    name = ".".join(labels)
    return name[:n].rstrip(".") if len(name) > n else name


# The longest storage URI the CRD takes: a 63-character bucket, then 255-character segments.
_PREFIX = STORAGE_URI_MAX - len("s3://") - 63
LONGEST_URI = (
    "s3://"
    + "b" * 63
    + "".join("/" + "p" * min(255, _PREFIX - i - 1) for i in range(0, _PREFIX, 256))
)


def largest_spec(argv_extra: int = 0, env_extra: int = 0) -> dict[str, Any]:
    """The biggest valid spec; *_extra push a total one or more characters over its bound."""
    image = "registry.example.com/" + "a" * (512 - len("registry.example.com/") - 2) + ":1"
    argv_item = MAX_ARGV_CHARS // 64  # 32 command items + 32 args of 4096 characters
    command = ["x" * argv_item for _ in range(32)]
    args = ["y" * argv_item for _ in range(32)]
    if argv_extra:
        args[-1] = args[-1][:-1]  # keep each item within its 4096 bound...
        args.append("z" * (argv_extra + 1))  # ...and go over the total
    env_value = MAX_ENV_VALUE_CHARS // 128
    env = [{"name": f"E{i:03d}" + "N" * 252, "value": "v" * env_value} for i in range(128)]
    if env_extra:
        env[-1]["value"] += "v" * env_extra
    shape = {
        "mnk": [1048576, 1048576, 1048576],
        "batch": 65536,
        "dtype": "bfloat16",
        "transA": True,
        "transB": True,
        "bias": False,
        "tf32": False,
    }
    return {
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "imagePullSecrets": [{"name": _dns(253, chr(ord("a") + i))} for i in range(16)],
        "gpu": {
            "vendor": "nvidia",
            "models": [f"M{i:02d}" + "x" * 60 for i in range(16)],
            "labelKey": _dns(252, "k") + "/" + "n" * 63,
            "resourceName": _dns(189, "r") + "/" + "g" * 63,
            "count": 16,
        },
        "workload": {
            "command": command,
            "args": args,
            "env": env,
            "shapes": [dict(shape) for _ in range(4096)],
        },
        "tuning": {
            "maxDurationMs": 60000,
            "maxIterations": 100000,
            "warmupDurationMs": 60000,
            "warmupIterations": 100000,
            "rotatingBufferMB": 65536,
            "numericalCheck": True,
            "budgetSeconds": 172800,
            "activeDeadlineSeconds": 259200,
            "backoffLimit": 6,
            "queueName": _dns(63, "q"),
        },
        "storage": {
            "uri": LONGEST_URI,
            "endpoint": "https://" + "e" * 200 + "/" + "q" * (1024 - 8 - 200 - 1),
            "region": "r" * 64,
            "credentialsSecret": {"name": _dns(253, "s")},
        },
        "serving": {"failClosed": True},
    }
