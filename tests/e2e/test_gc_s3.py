"""tunefleet-gc against the real S3 server and API server: 10 real TuningProfiles whose status
names what they published, gc while all 10 publish concurrently (publish's own code path, one
process per profile, as tests/e2e/test_library_s3.py does), then the rules' later runs.

The profiles' GPU model is one no node has, so an operator running in the same session (the
`operator` fixture keeps one) only reports them Unschedulable; the test writes their status
itself (the status subresource), as the operator does when a Job's publish step ends, and
judges every run against the references gc itself read from the API server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.wrappers import make_artifact, make_profile
from testbed.library_pod import tool_env
from tests.support.results import rows
from tunefleet import naming
from tunefleet.artifacts import gc
from tunefleet.artifacts.library import (
    Library,
    checkpoint_key,
    library_prefix,
    read_library,
    shard_base,
)
from tunefleet.artifacts.publish import Output, publish
from tunefleet.contracts.admission_record import INJECTED, Admission
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store
from tuner_job.library import CheckpointId, library_key
from tuner_job.manifest import ArtifactId, ManifestExtra
from tuner_job.output import RunFacts, write_output
from tuner_job.results import ResultRow, ResultsFile, format_results, merge_results

pytestmark = pytest.mark.e2e

MODEL = "GC-TEST-GPU"  # no node has it: nothing is scheduled for these profiles
VALIDATORS = {"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-"}
IDENTITY = {"gpuName": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-"}
KEY = library_key(MODEL, VALIDATORS, IDENTITY)
PROFILES = 10
FIRST, SECOND = 3, 4  # artifacts per profile before gc, and while it runs
GRACE = 15.0
# The revision the artifacts were tuned at: an earlier one than the spec's (served while the
# current revision tunes), so the current revision's checkpoints are unpublished scratch.
PREVIOUS = "prev000000"
KEEP = 1
# The fleet's profiles (named p0..p9, stored at the fleet's uri: .storage(uri)), applied with
# the namespace kubectl gives them.
BASE = (
    make_profile()
    .without("metadata", "namespace")
    .image("registry.example.com/serve:1")
    .gpu("amd", MODEL)
    .shapes((64, 64, 64))
    .tuning(backoffLimit=0)
)
GC = Path(sys.executable).parent / "tunefleet-gc"

PUBLISHER = """
import json, sys, time
from pathlib import Path
from tunefleet.artifacts.publish import Output, publish
from tunefleet.storage.store import StoreOptions
uri, ns, profile, model, *dirs = sys.argv[1:]
for d in dirs:
    pub = publish(Output(Path(d), uri, ns, profile, model), options=StoreOptions(timeout_s=60))
    assert pub.library is not None, pub.library_error
    print(json.dumps({"uri": pub.uri, "sha256": pub.sha256}), flush=True)
    time.sleep(0.3)
"""


def results(p: int, n: int) -> ResultsFile:
    """Profile p's n-th artifact: rows shared with every profile (other times), rows of its own."""
    base = rows(p * 10 + n, n=6, shared=0)
    common = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{64 + j}_55_64_ld_64_64_{64 + j}",
            f"Gemm_Hipblaslt_{p}_{n}",
            f"0.{(p * 13 + n * 7 + j) % 900 + 100:03d}",
        )
        for j in range(8)
    ]
    return ResultsFile(dict(VALIDATORS), base.rows + common)


def output(tmp: Path, ns: str, p: int, n: int, revision: str) -> Path:
    out = tmp / f"out-{p}-{n}"
    r = results(p, n)
    write_output(
        out,
        r,
        ArtifactId(namespace=ns, profile=f"p{p}", revision=revision, gpu_model=MODEL),
        RunFacts(
            recorded=r.gemms,
            identity=IDENTITY,
            seconds=1.0,
            extra=ManifestExtra(library_key=KEY, shards=1),
        ),
    )
    return out


class Fleet:
    def __init__(self, cluster: Any, s3: Any, namespace: str, prefix: str, tmp: Path) -> None:
        self.cluster, self.s3, self.ns, self.tmp = cluster, s3, namespace, tmp
        self.uri = f"s3://{s3.bucket}/{prefix}"
        self.location = parse_uri(self.uri)
        self.profile = BASE.storage(self.uri)
        self.revision = naming.revision(self.profile.spec_model())
        self.published: dict[int, list[dict[str, Any]]] = {p: [] for p in range(PROFILES)}

    def store(self) -> S3Store:
        return S3Store(self.location, client=self.s3.client(), timeout_s=600)

    def apply_profiles(self) -> None:
        docs = [self.profile.name(f"p{p}").obj() for p in range(PROFILES)]
        self.cluster.kubectl(
            "apply", "-n", self.ns, "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs)
        )

    def set_status(self, p: int) -> None:
        """What the operator writes once a Job published: the newest as the artifact, the
        first as history."""
        first, newest = self.published[p][0], self.published[p][-1]
        entry = make_artifact(MODEL).revision(PREVIOUS)
        status = {
            "revision": self.revision,
            "artifacts": [entry.fields(**newest).obj()],
            "history": [entry.fields(**first).obj()] if first is not newest else [],
        }
        self.cluster.kubectl(
            "patch", "tuningprofile", f"p{p}", "-n", self.ns, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def start_publisher(self, p: int, dirs: list[Path]) -> subprocess.Popen[str]:
        """Profile p's publish steps, one after another, in a process of their own."""
        argv = [sys.executable, "-c", PUBLISHER, self.uri, self.ns, f"p{p}", MODEL]
        return subprocess.Popen(
            [*argv, *map(str, dirs)],
            env=tool_env(self.s3.env()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def profiles(self) -> list[dict[str, Any]]:
        """The profiles as gc reads them (its own code path, through the API server)."""
        return gc.read_profiles(self.cluster.kubeconfig, None, [self.ns])

    def objects(self) -> set[str]:
        client = self.s3.client()
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=self.s3.bucket, Prefix=self.location.prefix + "/"
        )
        return {o["Key"] for page in pages for o in page.get("Contents", [])}

    def library(self) -> ResultsFile:
        store = self.store()
        view = read_library(
            store, Library(self.location, "namespace", self.ns, MODEL, KEY), VALIDATORS
        )
        assert view.results is not None and not view.skipped, view.skipped[:3]
        return view.results

    def gc(self, grace: float = GRACE) -> tuple[gc.Plan, list[dict[str, Any]]]:
        docs = self.profiles()
        store = self.store()
        plan = gc.collect(store, self.location, docs, gc.Rules(KEEP, grace), [self.ns])
        gc.apply(plan, store, print)
        return plan, docs


def referenced(docs: list[dict[str, Any]], location: Any) -> set[str]:
    out = set()
    for doc in docs:
        status = doc.get("status") or {}
        for e in [*(status.get("artifacts") or []), *(status.get("history") or [])]:
            base = e["uri"].removeprefix(location.uri() + "/")
            out |= {f"{base}/results.csv", f"{base}/manifest.json"}
    return out


def artifact_keys(fleet: Fleet, published: list[dict[str, Any]]) -> set[str]:
    return referenced([{"status": {"artifacts": published}}], fleet.location)


def test_gc_while_ten_profiles_publish_loses_nothing_and_converges(
    cluster: Any, s3: Any, namespace: str, prefix: str, tmp_path: Path
) -> None:
    fleet = Fleet(cluster, s3, namespace, prefix, tmp_path)
    fleet.apply_profiles()
    store = fleet.store()

    # Before gc: 3 artifacts each (in status: the newest, and the first as history), scratch of a
    # superseded revision, checkpoints of the current one (not published: kept), shard outputs.
    for p in range(PROFILES):
        for n in range(FIRST):
            pub = publish(Output(output(tmp_path, namespace, p, n, PREVIOUS), fleet.uri, namespace, f"p{p}", MODEL), store=store)  # fmt: skip
            fleet.published[p].append({"uri": pub.uri, "sha256": pub.sha256})
        fleet.set_status(p)
    superseded = [
        checkpoint_key(fleet.location, CheckpointId(namespace, f"p{p}", MODEL, "0ld0ld0ld0", 0, 1))
        for p in range(PROFILES)
    ]
    current = [
        checkpoint_key(
            fleet.location, CheckpointId(namespace, f"p{p}", MODEL, fleet.revision, 0, 1)
        )
        for p in range(PROFILES)
    ]
    shards = [
        shard_base(fleet.location, ArtifactId(namespace, f"p{p}", "0ld0ld0ld0", MODEL), 0, 2)
        + "/results.csv"
        for p in range(PROFILES)
    ]
    for key in superseded + current + shards:
        store.put(key, b"{}\n", "application/json")
    time.sleep(GRACE + 1)  # all of that is now older than the grace period

    # Run A, while every profile publishes 4 more artifacts (not yet in any status).
    dirs = {
        p: [output(tmp_path, namespace, p, n, PREVIOUS) for n in range(FIRST, FIRST + SECOND)]
        for p in range(PROFILES)
    }
    procs = {p: fleet.start_publisher(p, dirs[p]) for p in range(PROFILES)}
    library_prefix_key = library_prefix(fleet.location, "namespace", namespace, MODEL, KEY)
    entries_before = {k for k in fleet.objects() if k.startswith(library_prefix_key)}
    deadline = time.monotonic() + 60
    while (
        len({k for k in fleet.objects() if k.startswith(library_prefix_key)} - entries_before) < 5
    ):
        assert time.monotonic() < deadline, "the publishers added no library entry in 60 s"
        time.sleep(0.1)
    run_a, docs_a = fleet.gc()
    for p, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        fleet.published[p] += [json.loads(line) for line in out.splitlines()]
        fleet.set_status(p)
    kept = fleet.objects()
    assert referenced(docs_a, fleet.location) <= kept
    for p in range(PROFILES):  # nothing that was being published was lost
        assert artifact_keys(fleet, fleet.published[p][FIRST:]) <= kept
        assert artifact_keys(fleet, fleet.published[p][1 : FIRST - 1]).isdisjoint(kept)
    assert set(current) <= kept and not (set(superseded) | set(shards)) & kept
    assert run_a.writes, "run A compacted nothing"
    expected = merge_results(
        [results(p, n) for p in range(PROFILES) for n in range(FIRST + SECOND)]
    )
    assert format_results(fleet.library()) == format_results(expected)

    # Run B, once run A's compacted entry and the new artifacts are older than the grace period.
    time.sleep(GRACE + 1)
    run_b, docs_b = fleet.gc()
    assert referenced(docs_b, fleet.location) <= fleet.objects()
    assert any(d.kind == gc.ENTRIES for d in run_b.deletes)
    assert format_results(fleet.library()) == format_results(expected)

    # Run C, at once: a second run over what B left deletes nothing and writes nothing.
    run_c, docs_c = fleet.gc()
    assert (run_c.deletes, run_c.writes) == ([], [])
    assert referenced(docs_c, fleet.location) <= fleet.objects()

    # Run D, a grace period later: the library is its compacted entries alone, reading the same.
    time.sleep(GRACE + 1)
    fleet.gc()
    library = {k for k in fleet.objects() if k.startswith(library_prefix_key)}
    view = read_library(
        fleet.store(), Library(fleet.location, "namespace", namespace, MODEL, KEY), VALIDATORS
    )
    assert view.entries == len(library) == 1
    assert format_results(view.results) == format_results(expected)
    run_e, _ = fleet.gc()
    assert (run_e.deletes, run_e.writes) == ([], [])
    final = fleet.profiles()
    assert referenced(final, fleet.location) <= fleet.objects()
    for p in range(PROFILES):  # each profile: what its status names, nothing unreferenced past keep
        assert (
            artifact_keys(fleet, [fleet.published[p][0], fleet.published[p][-1]]) <= fleet.objects()
        )


def test_the_command_reads_real_profiles_and_reports_a_dry_run(
    cluster: Any, s3: Any, namespace: str, prefix: str, tmp_path: Path
) -> None:
    fleet = Fleet(cluster, s3, namespace, prefix, tmp_path)
    fleet.apply_profiles()
    store = fleet.store()
    for p in range(2):
        for n in range(3):
            pub = publish(Output(output(tmp_path, namespace, p, n, PREVIOUS), fleet.uri, namespace, f"p{p}", MODEL), store=store)  # fmt: skip
            fleet.published[p].append({"uri": pub.uri, "sha256": pub.sha256})
        fleet.set_status(p)
    # A model pod still pending, pinned at admission to p0's middle artifact (in no status).
    pinned = fleet.published[0][1]
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pinned", "labels": {"tunefleet.io/profile": "p0"}},
        "spec": {
            "nodeSelector": {"tunefleet.io/e2e-nowhere": "true"},  # stays Pending
            "containers": [{"name": "server", "image": "registry.example.com/serve:1"}],
        },
    }  # fmt: skip
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    marked: dict[str, Any] = {"metadata": {}}
    Admission(INJECTED, uri=pinned["uri"], sha256=pinned["sha256"]).write(marked)
    annotations = [f"{k}={v}" for k, v in marked["metadata"]["annotations"].items()]
    cluster.kubectl("annotate", "--overwrite", "pod", "-n", namespace, "pinned", *annotations)
    listing = fleet.objects()
    env = {**tool_env(s3.env()), "KUBECONFIG": cluster.kubeconfig}
    done = subprocess.run(
        [str(GC), "--uri", fleet.uri, "--namespace", namespace, "--keep", "0", "--grace", "0s"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    print(done.stdout + done.stderr)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[0] == f"tunefleet-gc: {fleet.uri}: dry run, nothing is deleted (--apply deletes)"
    would = [line for line in lines if line.startswith("would delete artifact ")]
    # Per profile the middle one of three (newest and first are named), but p0's is pinned.
    assert len(would) == 1 and "/p1/" in would[0], would
    assert gc.KEPT_PINNED in done.stdout
    assert any(line.startswith("would write compacted library entry ") for line in lines)
    assert f"read {PROFILES} profiles, {PROFILES} naming this store" in done.stdout
    assert fleet.objects() == listing


def test_a_profile_list_it_may_not_read_is_one_line_and_nothing_is_deleted(
    cluster: Any, s3: Any, namespace: str, prefix: str, tmp_path: Path
) -> None:
    fleet = Fleet(cluster, s3, namespace, prefix, tmp_path)
    store = fleet.store()
    for n in range(3):
        publish(Output(output(tmp_path, namespace, 0, n, PREVIOUS), fleet.uri, namespace, "p0", MODEL), store=store)  # fmt: skip
    listing = fleet.objects()
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token = cluster.kubectl("create", "token", "nobody", "-n", namespace).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    kubeconfig = tmp_path / "nobody.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "nobody",
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "nobody", "user": {"token": token}}],
        "contexts": [{"name": "nobody", "context": {"cluster": "local", "user": "nobody"}}],
    }))  # fmt: skip
    done = subprocess.run(
        [str(GC), "--uri", fleet.uri, "--apply", "--keep", "0", "--kubeconfig", str(kubeconfig)],
        env=tool_env(s3.env()), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("tunefleet-gc: error: listing tuningprofiles.tunefleet.io cluster-wide")
    assert "403" in line and "grant get/list on tuningprofiles.tunefleet.io" in line
    assert fleet.objects() == listing
