"""Serving that costs a model pod nothing: artifacts delivered as immutable ConfigMaps, mounted
with no init container and no credentials; read-only credentials where the store is still
used; a fetch whose time limit holds against a frozen store."""

from __future__ import annotations

import base64
import gzip
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.profiles import CFG, MODELS, jobs_for, profile
from testbed.builders.records import completed, published_pod
from testbed.builders.wrappers import make_artifact, make_config_map, make_pod, make_profile
from tests.support.artifacts import tuner_output
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet.artifacts import fetch as fetch_mod
from tunefleet.builders.artifact import CONFIG_MAP_BYTES, Payload, build_artifact_config_map
from tunefleet.config import Config
from tunefleet.contracts.admission_record import Admission, Code
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.serving import delivery
from tunefleet.webhook.admission import admit
from tuner_job.files import sha256_hex

SHA = "ab" * 32
MANIFEST = b'{"schema": "tunefleet.io/manifest/v1"}'
SERVING = Config(image="tunefleet:1", delivery_credentials_secret="reader")


ART = make_artifact("NVIDIA-H200", SHA, profile="x", ns="ns")
PROFILE = (
    make_profile()
    .gpu("nvidia", "NVIDIA-H200")
    .storage("s3://bkt/p", credentialsSecret={"name": "publisher"})
    .serving()
    .phase("Ready")
    .artifacts(ART)
)
DELIVERED = PROFILE.artifacts(ART.delivered("ConfigMap", "tunefleet-artifact-x", "cm-1"))
MODEL_POD = make_pod().profile("x").container("server", gpus=2)


def test_a_delivered_artifact_is_mounted_with_no_init_container_and_no_credentials() -> None:
    d = admit(MODEL_POD.obj(), "x", DELIVERED.obj(), SERVING, {"tunefleet-artifact-x": "cm-1"})
    assert d.injected
    spec = d.pod["spec"]
    assert not spec.get("initContainers")
    (vol,) = [v for v in spec["volumes"] if v["name"] == "tunefleet-results"]
    (source,) = vol["projected"]["sources"]
    assert source["configMap"]["name"] == "tunefleet-artifact-x" and source["configMap"]["optional"]
    assert [i["path"] for i in source["configMap"]["items"]] == [
        "tunableop_results0.csv",
        "tunableop_results1.csv",
    ]
    (server,) = spec["containers"]
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["PYTORCH_TUNABLEOP_FILENAME"] == "/tunefleet/results/tunableop_results%d.csv"
    assert not any(e["name"].startswith("AWS_") for e in server["env"])
    assert Admission.read(d.pod).config_map == "tunefleet-artifact-x"  # type: ignore[union-attr]


def test_a_gzipped_artifact_is_unpacked_locally_without_network_or_credentials() -> None:
    packed = PROFILE.artifacts(ART.delivered("ConfigMap gzip", "tunefleet-artifact-x", "cm-1"))
    d = admit(MODEL_POD.obj(), "x", packed.obj(), SERVING, {"tunefleet-artifact-x": "cm-1"})
    (init,) = d.pod["spec"]["initContainers"]
    cmd = init["command"]
    assert cmd[cmd.index("--uri") + 1] == f"file:///tunefleet/packed/ml/x/NVIDIA-H200/{SHA}"
    assert "--endpoint-url" not in cmd and not init.get("env")
    assert {m["name"] for m in init["volumeMounts"]} == {"tunefleet-results", "tunefleet-packed"}


@pytest.mark.parametrize(
    ("seen", "words"),
    [({"tunefleet-artifact-x": ""}, "is gone"), ({"tunefleet-artifact-x": "cm-2"}, "was replaced")],
)
@pytest.mark.parametrize("closed", [False, True])
def test_a_gone_or_replaced_config_map_is_never_mounted_the_store_serves_the_same_artifact(
    seen: dict[str, str], words: str, closed: bool
) -> None:
    serving = {"failClosed": True} if closed else {}
    d = admit(MODEL_POD.obj(), "x", DELIVERED.serving(**serving).obj(), SERVING, seen)
    assert d.injected and not d.deny and d.code == Code.STORE_FALLBACK
    assert any(words in n and "from the store" in n for n in d.notes), d.notes
    spec = d.pod["spec"]
    assert not any(
        s.get("configMap", {}).get("name") == "tunefleet-artifact-x"
        for v in spec["volumes"]
        for s in (v.get("projected") or {}).get("sources") or [v]
    ), spec["volumes"]
    (fetch,) = spec["initContainers"]
    cmd = fetch["command"]
    assert cmd[cmd.index("--uri") + 1] == f"s3://bkt/p/ns/x/NVIDIA-H200/{SHA}"
    assert cmd[cmd.index("--sha256") + 1] == SHA
    marked = Admission.read(d.pod)
    assert marked is not None and marked.sha256 == SHA and not marked.config_map
    assert marked.code == Code.STORE_FALLBACK
    # Not known right now (the watch has not listed yet): mounted by name as it is.
    known = admit(MODEL_POD.obj(), "x", DELIVERED.obj(), SERVING, None)
    assert (
        known.injected and known.code == Code.NONE and not known.pod["spec"].get("initContainers")
    )


def test_the_store_path_uses_read_only_credentials_never_the_publish_secret() -> None:
    prof = PROFILE.obj()
    d = admit(MODEL_POD.obj(), "x", prof, SERVING)
    (fetch,) = d.pod["spec"]["initContainers"]
    assert not any(e.get("valueFrom") for e in fetch.get("env") or [])  # nothing: cloud identity
    with_reader = admit(
        MODEL_POD.obj(), "x", PROFILE.serving(credentialsSecret={"name": "reader"}).obj(), SERVING
    )
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in with_reader.pod["spec"]["initContainers"][0]["env"]
        if "valueFrom" in e
    }
    assert refs == {"reader"}
    default = admit(
        MODEL_POD.obj(), "x", prof, Config(image="t", default_serving_credentials_secret="ro")
    )
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in default.pod["spec"]["initContainers"][0]["env"]
        if "valueFrom" in e
    }
    assert refs == {"ro"}
    # A profile that asks for the store path gets it even when delivered.
    store = admit(
        MODEL_POD.obj(),
        "x",
        DELIVERED.serving(delivery="Store").obj(),
        SERVING,
        {"tunefleet-artifact-x": "cm-1"},
    )
    assert store.pod["spec"]["initContainers"][0]["name"] == "tunefleet-fetch"


def test_the_config_map_holds_every_real_size_or_says_it_cannot() -> None:
    row = "GemmTunableOp_BFloat16_TN,tn_{}_4096_4096_ld_4096_4096_4096,Gemm_Hipblaslt_1234,0.0123\n"
    big = ("Validator,PT_VERSION,2.11.0\n" + "".join(row.format(i) for i in range(13_243))).encode()
    assert len(big) > 1_000_000  # the largest real file seen: 13,243 GEMMs, 1.24 MB
    cm = build_artifact_config_map(
        namespace="ml",
        profile="p",
        uid="u",
        payload=Payload(
            gpu_model="M", sha256=SHA, manifest_sha256="m" * 64, results=big, manifest=MANIFEST
        ),
    )
    assert cm is not None and cm["immutable"] is True and "results.csv" not in cm["data"]
    assert gzip.decompress(base64.b64decode(cm["binaryData"]["results.csv.gz"])) == big
    small = build_artifact_config_map(
        namespace="ml",
        profile="p",
        uid="u",
        payload=Payload(
            gpu_model="M",
            sha256=SHA,
            manifest_sha256="m" * 64,
            results=b"Validator,PT_VERSION,2.11.0\n",
            manifest=MANIFEST,
        ),
    )
    assert small is not None and small["data"]["results.csv"].startswith("Validator")
    noise = os.urandom(CONFIG_MAP_BYTES)  # does not compress
    assert (
        build_artifact_config_map(
            namespace="ml",
            profile="p",
            uid="u",
            payload=Payload(
                gpu_model="M", sha256=SHA, manifest_sha256="", results=noise, manifest=MANIFEST
            ),
        )
        is None
    )


def test_the_operator_delivers_a_fresh_artifact_and_status_says_how_pods_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
    job = completed(p)
    api = FakeKube(writers=RECONCILE_WRITERS)
    calls: list[str] = []

    def download(pin: fetch_mod.Pinned, **_: Any) -> fetch_mod.Verified:
        calls.append(pin.uri)
        return fetch_mod.Verified(b"Validator,PT_VERSION,2.11.0\n", MANIFEST, 0, pin.sha256)

    monkeypatch.setattr(delivery, "download_verified", download)
    uri = f"s3://bkt/p/ml/p/{MODELS[0]}/{SHA}"
    status = sync_profile(
        p, [job], [published_pod(job, uri)], SERVING, Memory(), Around(api)
    ).status.to_status()
    (art,) = status["artifacts"]
    assert art["delivery"] == "ConfigMap" and art["configMap"]["name"].startswith(
        "tunefleet-artifact-" + SHA
    )
    assert ("ConfigMap", art["configMap"]["name"]) in api.created and calls == [uri]
    # The next reconcile, with the Job still kept: delivered as status says, not read again
    # (and a ConfigMap replaced meanwhile is not taken up by its new uid).
    again = sync_profile(
        {**p, "status": status}, [job], [published_pod(job, uri)], SERVING, Memory(), Around(api)
    ).status.to_status()
    assert again["artifacts"][0]["configMap"] == art["configMap"] and calls == [uri]
    # Without a read identity for the operator: the store path, and why.
    plain = sync_profile(
        p, [job], [published_pod(job, uri)], CFG, Memory(), Around(api)
    ).status.to_status()
    assert plain["artifacts"][0]["delivery"].startswith("Store: the operator has no read identity")
    # Asked for: the store path, said so (status always says how pods get an artifact).
    asked = {**p, "spec": {**p["spec"], "serving": {"delivery": "Store"}}}
    store = sync_profile(
        asked, [job], [published_pod(job, uri)], SERVING, Memory(), Around(api)
    ).status.to_status()
    assert store["artifacts"][0]["delivery"] == "Store (spec.serving.delivery)"
    assert "configMap" not in store["artifacts"][0] and calls == [uri]


def test_a_failed_delivery_is_said_and_not_tried_again_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
    job = completed(p)
    api = FakeKube(writers=RECONCILE_WRITERS)
    tries: list[int] = []

    def failing(*_: Any, **__: Any) -> Any:
        tries.append(1)
        raise fetch_mod.FetchError("downloading s3://bkt/x failed: InternalError (HTTP 500)")

    monkeypatch.setattr(delivery, "download_verified", failing)
    memory = Memory()
    pods = [published_pod(job, f"s3://bkt/p/ml/p/{MODELS[0]}/{SHA}")]
    first = sync_profile(p, [job], pods, SERVING, memory, Around(api)).status.to_status()
    assert "HTTP 500" in first["artifacts"][0]["delivery"]
    sync_profile({**p, "status": first}, [job], pods, SERVING, memory, Around(api))
    assert len(tries) == 1


def test_fetch_gives_up_at_its_time_limit_against_a_store_that_never_answers(
    tmp_path: Path,
) -> None:
    """A frozen S3 server: it accepts connections and never answers (SIGSTOP does that)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    env = {
        "PYTHONPATH": f"{repo / 'operator'}:{repo}",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "PATH": "/usr/bin:/bin",
    }
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable, "-m", "tunefleet.artifacts.fetch", "--uri", f"s3://bkt/p/ml/x/M/{SHA}",
            "--sha256", SHA, "--dest", str(tmp_path / "d"), "--devices", "1",
            "--endpoint-url", f"http://127.0.0.1:{port}", "--timeout-seconds", "3",
            "--termination-log", str(tmp_path / "log"),
        ],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - started
    stop.set()
    server.close()
    assert done.returncode == 0 and "over the 3s time limit" in done.stderr, done.stderr
    assert took < 3 + 4  # the limit, plus the interpreter's start: never 5 x 30 s of retries


def test_fetch_reads_a_mounted_gzipped_artifact(tmp_path: Path) -> None:
    manifest = tuner_output(tmp_path / "out")
    results = (tmp_path / "out" / "results.csv").read_bytes()
    packed = (
        tmp_path / "packed" / "ml" / "llama" / "AMD_Instinct_MI300X_OAM" / manifest.results_sha256
    )
    packed.mkdir(parents=True)
    (packed / "results.csv.gz").write_bytes(gzip.compress(results))
    (packed / "manifest.json").write_bytes((tmp_path / "out" / "manifest.json").read_bytes())
    got = fetch_mod.fetch(
        fetch_mod.Pinned(f"file://{packed}", manifest.results_sha256),
        tmp_path / "dest",
        fetch_mod.Serving(2),
    )
    assert [p.read_bytes() for p in got.paths] == [results, results]
    assert sha256_hex(results) == manifest.results_sha256


def test_a_job_view_of_an_unrelated_profile_does_not_matter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing is read for profiles that are not delivered (no read identity).
    api = FakeKube(writers=RECONCILE_WRITERS)
    p = profile()
    sync_profile(p, jobs_for(p, MODELS), [], CFG, Memory(), Around(api))
    assert not api.verbs("get")


# --- retiring artifact ConfigMaps -------------------------------------------------------------


UNOWNED_CM = (
    make_config_map("cm")
    .immutable()
    .data(**{"results.csv": "Validator,PT_VERSION,2.11.0\n", "manifest.json": MANIFEST.decode()})
    .labels({"tunefleet.io/role": "artifact"})
    .annotations(
        {
            "tunefleet.io/artifact-sha256": sha256_hex(b"Validator,PT_VERSION,2.11.0\n"),
            "tunefleet.io/manifest-sha256": sha256_hex(MANIFEST),
        }
    )
)
ARTIFACT_CM = UNOWNED_CM.label("tunefleet.io/profile-uid", "uid-1").owner("uid-1")


def test_only_artifact_config_maps_no_status_or_running_pod_names_are_retired() -> None:
    status = {
        "artifacts": [{"configMap": {"name": "served", "uid": "u"}}],
        "history": [{"configMap": {"name": "earlier", "uid": "u"}}],
    }
    cms = [
        ARTIFACT_CM.name(n).uid(f"cm-{n}").obj()
        for n in ("served", "earlier", "mounted", "ended", "unused")
    ] + [
        # Our labels, not ours.
        UNOWNED_CM.name("forged")
        .uid("cm-forged")
        .label("tunefleet.io/profile-uid", "someone-else")
        .owner("someone-else")
        .obj(),
        ARTIFACT_CM.name("tuning-config")
        .uid("cm-tuning-config")
        .label("tunefleet.io/role", "tune")
        .obj(),
        # Our labels and ownerReference, other content: never used, never deleted by us.
        ARTIFACT_CM.name("squatter")
        .uid("cm-squatter")
        .data(**{"results.csv": "Validator,PT_VERSION,2.11.0\nEvil,x,y,0\n"})
        .obj(),
    ]
    pods = [
        make_pod("pod-mounted")
        .phase("Running")
        .admitted(Admission("injected", uri="s3://b/x", sha256=SHA, config_map="mounted"))
        .obj(),
        make_pod("pod-ended")
        .phase("Succeeded")
        .admitted(Admission("injected", uri="s3://b/x", sha256=SHA, config_map="ended"))
        .obj(),
    ]
    assert delivery.retirable(cms, "uid-1", delivery.referenced_names(status), pods) == [
        ("ended", "cm-ended"),
        ("unused", "cm-unused"),
    ]


def test_after_a_restart_a_config_map_no_status_names_goes_once_its_pods_have_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
    api = FakeKube(writers=RECONCILE_WRITERS)
    # As status.history holds it: a record (its uri and SHA-256) with its ConfigMap; of a
    # model since dropped from the spec, kept for the record.
    earlier = make_artifact("MI250X", "e" * 64).fields(
        configMap={"name": "earlier", "uid": "cm-earlier"}
    )
    api.listed["configmaps"] = [
        ARTIFACT_CM.name("earlier").uid("cm-earlier").obj(),
        ARTIFACT_CM.name("old").uid("cm-old").obj(),
    ]
    api.listed["pods"] = [
        make_pod("pod-old")
        .phase("Running")
        .admitted(Admission("injected", uri="s3://b/x", sha256=SHA, config_map="old"))
        .obj()
    ]
    memory = Memory()
    with_history = {**p, "status": {"history": [earlier.obj()]}}
    # A fresh replica checks once (it does not know what was waiting): a pod holds "old".
    sync_profile(with_history, [], [], CFG, memory, Around(api))
    selector = "tunefleet.io/profile-uid=uid-1,tunefleet.io/role=artifact"
    assert api.lists == [("configmaps", selector), ("pods", "tunefleet.io/profile=p")]
    assert api.deleted == [] and memory.of("uid-1").retiring == {"old"}
    sync_profile(with_history, [], [], CFG, memory, Around(api))
    assert len(api.lists) == 2  # not due again yet
    # The pod ended; once the check is due again, "old" goes and "earlier" (history) stays.
    api.listed["pods"] = [
        make_pod("pod-old")
        .phase("Succeeded")
        .admitted(Admission("injected", uri="s3://b/x", sha256=SHA, config_map="old"))
        .obj()
    ]
    memory.of("uid-1").retired_at -= delivery.RETIRE_EVERY_S
    sync_profile(with_history, [], [], CFG, memory, Around(api))
    assert api.deleted == [("ConfigMap", "old")] and memory.of("uid-1").retiring == set()
