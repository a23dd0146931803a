"""bench/results.json and bench/results.md: the figures, who made them, and their schema.

Every figure group (a top-level key of results.json; for ``scale`` and ``scale_rest`` each
size) carries the ``provenance`` of the run that produced it: the commit (``git rev-parse
--short HEAD``, ``-dirty`` when the tree had changes) and the UTC date, stamped by the bench
code when the routine returns. Partial reruns (``python -m bench --only gc``, ``python -m bench
scale --profiles 1000``) replace their groups only, so one file holds figures of several
commits, each saying which. results.md is generated from results.json by ``write`` (never
edited by hand), and ``GROUPS`` is the schema of every key the bench code writes:
tests/unit/test_bench.py fails on a key it does not list (a hand-written note, a stale group).

Standard library only, so that ``python -m bench --help`` and the unit tests import it fast.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results.md"
JSON_OUT = ROOT / "bench" / "results.json"  # the figures, for partial reruns to merge into
PROVENANCE = "provenance"


def progress(routine: str, message: str) -> None:
    """A progress line on stderr: which routine, what it is doing, how far it is."""
    print(f"bench {routine}: {message}", file=sys.stderr, flush=True)


def commit() -> str:
    """The checkout's short commit, with -dirty when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{head}-dirty" if dirty else head  # fmt: skip


def provenance() -> dict[str, str]:
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return {"commit": commit(), "date": now.strftime("%Y-%m-%dT%H:%M:%SZ")}


def stamped(figures: dict[str, Any], made_by: dict[str, str] | None = None) -> dict[str, Any]:
    """A routine's figures with the provenance of this run."""
    return {**figures, PROVENANCE: made_by or provenance()}


# --- the schema: every key the bench code writes ------------------------------------------
# A dict lists the keys allowed (None: a value, any shape); "*" allows any key (sizes, counts);
# a list of one schema is a list of such dicts.

# One /metrics scrape's figures (bench/scrape.py): over HTTP, the median of several.
SCRAPE = ("median_ms", "max_ms", "bytes", "samples", "per_profile_samples")
SIZE: dict[str, Any] = {
    "profiles": None,
    "namespaces": None,
    "created_by": None,
    "paced_at_per_s": None,
    "apiserver_alone_creates_per_s": None,
    "apiserver_alone_sample": None,
    "rss_empty_cold_mib": None,
    "allocator": None,
    "rss_empty_mib": None,
    "create_s": None,
    "create_per_s": None,
    "jobs_present_when_create_returned": None,
    "last_job_after_create_s": None,
    "last_status_after_create_s": None,
    "operator_cpu_s_during_create": None,
    "operator_cpu_s_apply": None,
    "rss_peak_apply_mib": None,
    "last_write_after_create_s": None,
    "idle_cpu_percent_of_a_core": None,
    "rss_settled_mib": None,
    "metrics_scrape": dict.fromkeys(SCRAPE),
    "restart_to_webhook_listening_s": None,
    "restart_to_reconciling_s": None,
    "restart_busy_s": None,
    "operator_cpu_s_restart": None,
    "rss_peak_restart_mib": None,
    "rss_after_restart_mib": None,
    "delete_to_all_jobs_gone_s": None,
    "rss_peak_delete_mib": None,
    "rss_after_delete_mib": None,
    "rss_after_delete_over_empty": None,
    "rss_after_delete_over_cold": None,
    "rss_max_mib": None,
    "namespaces_removed": None,
    "operator_cpu_ms_per_profile_apply": None,
    "goals": {"*": None},  # bench_scale's GOALS (kubectl) or BURST_GOALS (rest)
    "provenance": None,
}
SIZED = ("scale", "scale_rest")  # groups holding one figure group per size

# One webhook run's figures (bench_webhook): the same keys sequential and concurrent.
WEBHOOK_RUN: dict[str, Any] = {
    "pods": None,
    "concurrency": None,
    "injected": None,
    "handler_p50_ms": None,
    "handler_p99_ms": None,
    "apiserver_p50_ms_estimate": None,
    "apiserver_p50_bucket": None,
    "apiserver_p99_ms_estimate": None,
    "apiserver_p99_bucket": None,
    "client_create_p50_ms": None,
    "client_create_p99_ms": None,
}

# One codec's figures on the 1 GiB corpus (bench_large.codecs).
LARGE_CODEC = ("pack_s", "unpack_s", "tar_x_s", "size", "unpack_over_tar_x")

# One simulated case of the fleet's bids (bench_bids.CASES): its settings and outcome.
BID_CASE = dict.fromkeys(
    (
        "trials",
        "seed",
        "skew_s",
        "slowest_write_s",
        "slowest_listing_s",
        "windows_s",
        "ghost",
        "max_holders_at_once",
        "trials_where_one_held",
        "longest_ghost_wait_s",
    )
)
BID_CASES = (
    "five_s_windows",
    "skew_beyond_the_window",
    "windows_60s_and_1s",
    "ghost_while_watching",
    "ghost_before_anyone_looked",
    "ghost_before_anyone_looked_60s_and_1s",
)

# One arm of the broker routine (bench/bench_broker.py): medians of its rounds.
BROKER_ARM = {
    "rounds": None,
    "upload_s": None,
    "apply_to_ready_s": None,
    "mib_per_s": None,
    "pods_reading_a_secret": None,
}

GROUPS: dict[str, Any] = {
    "kill_storm": {
        "kills": None,
        "profiles": None,
        "models_each": None,
        "settled_after_last_restart_s": None,
        "jobs": None,
        "goal": None,
        "provenance": None,
    },
    "webhook": {
        "sequential": WEBHOOK_RUN,
        "concurrent": WEBHOOK_RUN,
        "provenance": None,
    },
    "webhook_cost_ratio": {
        "pods_per_run": None,
        "runs": [
            {
                "labelled_p50_ms": None,
                "labelled_p99_ms": None,
                "unlabelled_p50_ms": None,
                "unlabelled_p99_ms": None,
                "p50_ratio": None,
                "p99_ratio": None,
            }
        ],
        "p50_ratio_median": None,
        "p99_ratio_median": None,
        "goal": None,
        "provenance": None,
    },
    "library": {
        "machine": None,
        "note": None,
        "reuse": {
            "profiles": None,
            "gemms_per_profile": None,
            "shared_gemms": None,
            "gemms_tuned_with_reuse": None,
            "gemms_tuned_each_alone": None,
            "ratio": None,
            "goal": None,
            "tuned_per_profile": None,
            "reused_per_profile": None,
        },
        "sharding": {
            "gemms": None,
            "per_gemm_sleep_s (stand-in)": None,
            "runs": [
                {
                    "parallelism": None,
                    "gemms_tuned_per_shard": None,
                    "tuning_process_s_per_shard (stand-in)": None,
                    "pods_wall_s (stand-in)": None,
                    "merge_s": None,
                    "job_wall_s (stand-in)": None,
                    "artifact_sha256": None,
                }
            ],
            "same_artifact_at_every_parallelism": None,
            "wall_ratio_vs_parallelism_1 (stand-in)": {"*": None},
        },
        "resume": {
            "gemms": None,
            "checkpoint_every_gemms": None,
            "checkpoint_every_seconds": None,
            "min_upload_interval_s": None,
            "gemms_tuned_before_the_kill": None,
            "gemms_resumed_by_the_retry": None,
            "gemms_tuned_twice": None,
            "bound": None,
            "retry_artifact_gemms": None,
        },
        "provenance": None,
    },
    "artifacts": {
        "results_bytes": None,
        "runs": None,
        "publish_median_ms": None,
        "fetch_median_ms": None,
        "cli_publish_median_ms": None,
        "cli_fetch_8_devices_median_ms": None,
        "note": None,
        "provenance": None,
    },
    "real_node": {
        "tuning_job_apply_to_ready_s": None,
        "tuning_job_apply_to_ready_s_median": None,
        "model_pod_create_to_running_s_median": {"none": None, "configmap": None, "store": None},
        "model_pod_create_to_running_s_all": {"none": None, "configmap": None, "store": None},
        "ratio_to_no_profile": {"configmap": None, "store": None},
        "burst": {
            "configmap": {
                "pods": None,
                "all_done_s": None,
                "started_tuned": None,
                "s3_connections_from_pods": None,
            },
            "store": {
                "pods": None,
                "all_done_s": None,
                "started_tuned": None,
                "s3_connections_from_pods": None,
            },
        },
        "store_unreachable_from_pods": {
            "create_to_running_s_median": {"none": None, "configmap": None},
            "configmap_ratio_to_no_profile": None,
            "burst_configmap": {"pods": None, "all_done_s": None, "started_tuned": None},
            "burst_store": {"pods": None, "all_done_s": None, "started_tuned": None},
        },
        "note": None,
        "provenance": None,
    },
    "fleet_two_clusters": {
        "clusters": None,
        "rounds": None,
        "tuning_jobs_per_identity": None,
        "adopted_with_source": None,
        "tuner_ready_s_median": None,
        "adopter_ready_s_median": None,
        "adopter_after_tuner_s_median": None,
        "takeover": {"claim_seconds": None, "kill_to_own_job_s": None, "kill_to_ready_s": None},
        "meets_goal": None,
        "registry": {
            "tuning_jobs_per_identity": None,
            "adopted_with_source": None,
            "tuner_ready_s_median": None,
            "adopter_ready_s_median": None,
            "adopter_after_tuner_s_median": None,
            "settle_seconds": None,
            "takeover": {
                "claim_seconds": None,
                "kill_to_own_job_s": None,
                "kill_to_ready_s": None,
            },
            "meets_goal": None,
        },
        "goal": None,
        "note": None,
        "provenance": None,
    },
    "metrics_scrape_10000_profiles": {
        "profiles": None,
        "gpu_models_per_profile": None,
        "scrapes": None,
        "fill_s": None,
        "per_profile_off": dict.fromkeys(SCRAPE),
        "per_profile_on": dict.fromkeys(SCRAPE),
        "meets_goal": None,
        "goal": None,
        "note": None,
        "provenance": None,
    },
    "node_map_10000_nodes": {
        "nodes": None,
        "index_bytes": None,
        "index_bytes_per_node": None,
        "list_to_index_s": None,
        "config_map_bytes": None,
        "config_map_build_s": None,
        "status_updates_per_s": None,
        "writes_for_10000_status_updates": None,
        "writes_for_200_node_scale_up_over_10s": None,
        "provenance": None,
    },
    "bundles_torch_compile": {
        "pods_per_arm": None,
        "image": None,
        "tuning_job_to_ready_s": None,
        "bundle": None,
        "medians": None,
        "ratio_bundle_over_cold_start_cost": None,
        "ratio_from_container_start": None,
        "ratio_without_isa_probe": None,
        "goal": None,
        "bundle_hits_every_pod": None,
        "compiled_outputs_identical": None,
        "runs": None,
        "provenance": None,
    },
    "bundles_large": {
        "codecs": {
            "corpus": None,
            "gzip": dict.fromkeys(LARGE_CODEC),
            "zstd": dict.fromkeys(LARGE_CODEC),
        },
        "s3": {
            "bundle": None,
            "apply_to_ready_s": None,
            "tune_side": None,
            "pods": None,
            "fetch_s": None,
            "tar_x_s": None,
            "fetch_over_tar_x": None,
            "peak_bytes_max": None,
            "rss_bytes_max": None,
            "all_same_bytes": None,
        },
        "image_volume": {
            "bundle": None,
            "apply_to_ready_s": None,
            "pods": None,
            "pods_without_profile_s": None,
            "registry_bytes": None,
            "registry_bytes_over_bundle": None,
            "first_pod_start_s": None,
            "later_pods_start_s": None,
            "without_profile_start_s": None,
            "later_over_without_profile": None,
            "copy_pods": None,
            "copy_s": None,
            "link_s": None,
            "copy_pods_start_s": None,
            "all_same_bytes": None,
            "all_linked": None,
        },
        "provenance": None,
    },
    "bundles_vllm": {
        "pods_per_arm": None,
        "image": None,
        "model": None,
        "tuning_job_to_ready_s": None,
        "bundle": None,
        "medians": None,
        "ratio_on_ready": None,
        "ratio_on_first_completion": None,
        "ratio_on_engine_init": None,
        "arm_orders": None,
        "phases_add_up": None,
        "goal": None,
        "bundle_paths": None,
        "bundle_reported": None,
        "reported_as_vllm_said": None,
        "tokens_identical": None,
        "runs": None,
        "provenance": None,
    },
    "oci_delivery": {
        "pods_per_burst": None,
        "rounds": None,
        "medians": None,
        "ratio_image_volume_over_none": None,
        "ratio_burst_image_volume_over_none": None,
        "goal": None,
        "runs": None,
        "provenance": None,
    },
    "capture": {
        "sidecar": {
            "runs": [
                {
                    "misses_per_s": None,
                    "upload_interval_s": None,
                    "misses_written": None,
                    "misses_received": None,
                    "uploads": None,
                    "rss_peak_mib": None,
                    "cpu_percent_of_a_core": None,
                    "miss_to_upload_p50_s": None,
                    "miss_to_upload_p99_s": None,
                }
            ],
            "note": None,
        },
        "provenance": None,
        "loop": {"*": None},
    },
    "gc_10000_objects": {
        "store": None,
        "objects_listed": None,
        "profiles": None,
        "fill_s": None,
        "dry_run_s": None,
        "dry_run_would_delete": None,
        "apply_s": None,
        "deleted": None,
        "deleted_by_kind": {
            "artifact": None,
            "checkpoints": None,
            "shards": None,
            "library entries": None,
        },
        "compacted_entries_written": None,
        "objects_left": None,
        "second_run_s": None,
        "second_run_deleted": None,
        "second_run_written": None,
        "checks": None,
        "settings": None,
        "provenance": None,
    },
    "churn_create_delete": {
        "profiles_per_cycle": None,
        "cycles": None,
        "rss_after_each_cycle_mib": None,
        "last_over_first": None,
        "goal": None,
        "provenance": None,
    },
    "fleet_bids_simulated": {
        "live_seconds": None,
        "ghost_expiry_s": None,
        **dict.fromkeys(BID_CASES, BID_CASE),
        "provenance": None,
    },
    "pins_concurrent": {
        "writers": None,
        "pins_kept": None,
        "seconds": None,
        "stale_writes_redone": None,
        "most_rounds_one_writer": None,
        "two_at_once_rounds": None,
        "two_at_once_pins_lost": None,
        "note": None,
        "provenance": None,
    },
    "admission_slow_registry": {
        "profiles": None,
        "pods": None,
        "registry_delay_s": None,
        "operator_replicas": None,
        "admitted_with_a_decision": None,
        "burst_s": None,
        "mounted_at_once": None,
        "registry_requests_per_digest": {"*": None},
        "webhook_timeout_s": None,
        "later_pods_mounted": None,
        "note": None,
        "provenance": None,
    },
    "registry_proxy_large": {
        "bundle_mib": None,
        "publish_memory_limit": None,
        "secret": {**BROKER_ARM, "publish_s": None},
        "proxy": {**BROKER_ARM, "publish_s": None},
        "proxy_over_secret_publish": None,
        "rows": [
            {
                "arm": None,
                "bytes": None,
                "upload_s": None,
                "publish_s": None,
                "apply_to_ready_s": None,
                "pod_reads_a_secret": None,
            }
        ],
        "seconds": None,
        "provenance": None,
    },
    "store_broker_large": {
        "bundle_mib": None,
        "publish_memory_limit": None,
        "secret": BROKER_ARM,
        "broker": BROKER_ARM,
        "broker_over_secret_upload": None,
        "rows": [
            {
                "arm": None,
                "bytes": None,
                "upload_s": None,
                "apply_to_ready_s": None,
                "pod_reads_a_secret": None,
            }
        ],
        "seconds": None,
        "provenance": None,
    },
    "scale_rest": {"*": SIZE},
    "scale": {"*": SIZE},
}


def unknown_keys(results: dict[str, Any]) -> list[str]:
    """The paths of keys in results that the bench code does not write."""
    out: list[str] = []

    def walk(value: Any, schema: Any, path: str) -> None:
        if schema is None:
            return
        if isinstance(schema, list):
            for i, item in enumerate(value if isinstance(value, list) else []):
                walk(item, schema[0], f"{path}[{i}]")
            return
        if not isinstance(value, dict):
            out.append(f"{path}: a {type(value).__name__} where the bench writes a dict")
            return
        for key, sub in value.items():
            if key in schema:
                walk(sub, schema[key], f"{path}.{key}" if path else key)
            elif "*" in schema:
                walk(sub, schema["*"], f"{path}.{key}" if path else key)
            else:
                out.append(f"{path}.{key}" if path else key)

    walk(results, GROUPS, "")
    return out


def groups(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, figures) of every figure group: top-level keys, and each size of a scale run."""
    out = []
    for name, value in results.items():
        if name in SIZED:
            out.extend((f"{name} {size}", figures) for size, figures in value.items())
        else:
            out.append((name, value))
    return out


def missing_provenance(results: dict[str, Any]) -> list[str]:
    return [name for name, figures in groups(results) if PROVENANCE not in figures]


def load() -> dict[str, Any]:
    results: dict[str, Any] = json.loads(JSON_OUT.read_text()) if JSON_OUT.exists() else {}
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# tunefleet benchmarks",
        "",
        "Generated by the bench code (`make bench`, `python -m bench`) from `bench/results.json`;",
        "do not edit. Each group names the commit (`-dirty`: with uncommitted changes) and the",
        "UTC date of the run that produced it: partial reruns replace their groups only. Local",
        "control plane (kube-apiserver, kwok, SeaweedFS) on loopback, on this project's shared",
        "2-core development machine: medians; read ratios, not absolutes.",
        "",
        "| group | commit | date |",
        "| --- | --- | --- |",
    ]
    for name, figures in groups(results):
        made = figures.get(PROVENANCE) or {}
        lines.append(f"| `{name}` | {made.get('commit', '?')} | {made.get('date', '?')} |")
    for name, value in results.items():
        lines += ["", f"## {name}", ""]
        entries = list(value.items()) if name in SIZED else [("", value)]
        for size, figures in entries:
            made = figures.get(PROVENANCE) or {}
            title = f"{size}: " if size else ""
            lines += [
                f"{title}commit {made.get('commit', '?')}, {made.get('date', '?')}",
                "",
                "```json",
                json.dumps({k: v for k, v in figures.items() if k != PROVENANCE}, indent=2),
                "```",
                "",
            ]
        while lines[-1] == "":
            lines.pop()
    return "\n".join(lines) + "\n"


def write(results: dict[str, Any]) -> None:
    """results.json as given (every group stamped) and results.md generated from it."""
    wrong = unknown_keys(results)
    if wrong:
        raise ValueError(f"keys the bench code does not write: {wrong} (bench/results.py)")
    unstamped = missing_provenance(results)
    if unstamped:
        raise ValueError(f"figure groups without provenance: {unstamped}")
    JSON_OUT.write_text(json.dumps(results, indent=2) + "\n")
    OUT.write_text(markdown(results))
    progress("write", f"{JSON_OUT.relative_to(ROOT)} and {OUT.relative_to(ROOT)} written")
