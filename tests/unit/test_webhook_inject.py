"""The pod injection: env, init container, volumes, model choice, fail open/closed, idempotence."""

from __future__ import annotations

import copy
from typing import Any

from testbed.builders.wrappers import make_artifact, make_pod, make_profile
from tests.support.fake_kube import FakeKube
from tunefleet.builders.webhook import build_webhook_configuration
from tunefleet.config import Config
from tunefleet.contracts.fetch_outcome import CONTAINER as FETCH_CONTAINER
from tunefleet.webhook.admission import admit as inject

CFG = Config(image="tunefleet:1")
SHA = "ab" * 32


H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"
ART_H100 = make_artifact(H100, SHA, profile="x", ns="ns")
ART_H200 = make_artifact(H200, SHA, profile="x", ns="ns")
STORED = (
    make_profile()
    .storage("s3://bkt/p", endpoint="http://127.0.0.1:8333", credentialsSecret={"name": "s3"})
    .serving(failClosed=False)
    .phase("Ready")
)
READY = STORED.gpu("nvidia", H200).artifacts(ART_H200)
READY_BOTH = STORED.gpu("nvidia", H100, H200).artifacts(ART_H100, ART_H200)
NO_CONTAINERS = make_pod().generate_name("m-").profile("x").selector({})
POD = NO_CONTAINERS.container("server", gpus=2, env=[]).container("sidecar")


def test_injects_fetch_env_and_mounts() -> None:
    d = inject(
        POD.selector({"nvidia.com/gpu.product": "NVIDIA-H200"}).obj(),
        "x",
        READY_BOTH.obj(),
        CFG,
    )
    assert d.injected and d.deny is None
    spec = d.pod["spec"]
    init = spec["initContainers"][0]
    assert init["name"] == FETCH_CONTAINER and init["image"] == "tunefleet:1"
    cmd = init["command"]
    assert cmd[cmd.index("--sha256") + 1] == SHA
    assert cmd[cmd.index("--devices") + 1] == "2"
    assert "NVIDIA-H200" in cmd[cmd.index("--uri") + 1]
    assert cmd[cmd.index("--endpoint-url") + 1] == "http://127.0.0.1:8333"
    assert init["securityContext"]["runAsNonRoot"] is True
    for c in spec["containers"]:
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["PYTORCH_TUNABLEOP_ENABLED"] == "1"
        assert env["PYTORCH_TUNABLEOP_TUNING"] == "0"
        assert env["PYTORCH_TUNABLEOP_RECORD_UNTUNED"] == "0"
        assert env["PYTORCH_TUNABLEOP_FILENAME"].endswith("tunableop_results%d.csv")
        assert any(m["readOnly"] for m in c["volumeMounts"])
    assert d.pod["metadata"]["annotations"]["tunefleet.io/artifact-sha256"] == SHA


def test_is_idempotent() -> None:
    first = inject(POD.obj(), "x", READY.obj(), CFG)
    second = inject(copy.deepcopy(first.pod), "x", READY.obj(), CFG)
    assert second.pod == first.pod and not second.injected


def test_user_values_win() -> None:
    d = inject(
        NO_CONTAINERS.container(
            "server", gpus=2, env=[{"name": "PYTORCH_TUNABLEOP_TUNING", "value": "1"}]
        )
        .container("sidecar")
        .obj(),
        "x",
        READY.obj(),
        CFG,
    )
    env = d.pod["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "PYTORCH_TUNABLEOP_TUNING"] == ["1"]


def test_single_model_is_pinned_and_gpu_count_defaults_to_one() -> None:
    d = inject(
        NO_CONTAINERS.container("server", env=[], resources={}).container("sidecar").obj(),
        "x",
        READY.obj(),
        CFG,
    )
    assert d.pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    cmd = d.pod["spec"]["initContainers"][0]["command"]
    assert cmd[cmd.index("--devices") + 1] == "1"


def test_fail_open_cases_annotate_and_leave_pod_otherwise_alone() -> None:
    cases = [
        (POD.obj(), READY_BOTH.obj(), "no nodeSelector"),
        (
            POD.selector({"nvidia.com/gpu.product": "NVIDIA-A100"}).obj(),
            READY.obj(),
            "does not tune",
        ),
        (POD.obj(), READY.artifacts().obj(), "no artifact"),
        (POD.obj(), None, "does not exist"),
    ]
    for p, prof, words in cases:
        d = inject(p, "x", prof, CFG)
        assert d.deny is None and not d.injected
        assert words in d.reason
        assert d.pod["metadata"]["annotations"]["tunefleet.io/status"].startswith("untuned:")
        assert d.pod["spec"] == p["spec"]


def test_fail_closed_denies_with_what_to_add() -> None:
    d = inject(POD.obj(), "x", READY_BOTH.serving(failClosed=True).obj(), CFG)
    assert d.deny and "nodeSelector" in d.deny and "NVIDIA-H200" in d.deny
    d = inject(POD.obj(), "x", READY.serving(failClosed=True).artifacts().obj(), CFG)
    assert d.deny and "Ready" in d.deny


def test_image_mismatch_warns() -> None:
    p = POD.obj()
    p["spec"]["containers"][1]["image"] = "serve:2"
    d = inject(p, "x", READY.obj(), CFG)
    assert d.injected and len(d.warnings) == 1 and "serve:2" in d.warnings[0]
    assert "tunefleet.io/image-warning" in d.pod["metadata"]["annotations"]


def envs(d: Any) -> dict[str, set[str]]:
    return {c["name"]: {e["name"] for e in c.get("env") or []} for c in d.pod["spec"]["containers"]}


def test_sidecars_of_other_images_get_nothing_and_raise_no_warning() -> None:
    p = POD.obj()
    p["spec"]["containers"][1]["image"] = "docker.io/envoyproxy/envoy:v1.30"
    d = inject(p, "x", READY.obj(), CFG)
    assert d.injected and d.warnings == []
    assert "PYTORCH_TUNABLEOP_ENABLED" in envs(d)["server"]
    assert envs(d)["sidecar"] == set()
    assert not d.pod["spec"]["containers"][1].get("volumeMounts")


def test_containers_annotation_chooses_who_loads_results() -> None:
    p = POD.obj()
    p["spec"]["containers"][0]["image"] = "serve-prod:7"
    p["metadata"]["annotations"] = {"tunefleet.io/containers": "server"}
    d = inject(p, "x", READY.obj(), CFG)
    assert envs(d)["sidecar"] == set() and "PYTORCH_TUNABLEOP_ENABLED" in envs(d)["server"]
    assert len(d.warnings) == 1 and "serve-prod:7" in d.warnings[0]
    p["metadata"]["annotations"] = {"tunefleet.io/containers": "server,nope"}
    d = inject(p, "x", READY.obj(), CFG)
    assert any("nope" in w for w in d.warnings)


def test_every_admitted_pod_is_labelled_with_the_outcome() -> None:
    d = inject(POD.obj(), "x", READY.obj(), CFG)
    assert d.pod["metadata"]["labels"]["tunefleet.io/admission"] == "injected"
    d = inject(POD.obj(), "x", READY.artifacts().obj(), CFG)
    assert d.pod["metadata"]["labels"]["tunefleet.io/admission"] == "untuned"
    d = inject(POD.obj(), "x", None, CFG)
    assert d.pod["metadata"]["labels"]["tunefleet.io/admission"] == "untuned"


def test_webhook_configuration_only_sees_labelled_pods() -> None:
    cfg = build_webhook_configuration("tf", {"url": "https://127.0.0.1:9443/pod-inject"})
    (hook,) = cfg["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["objectSelector"]["matchExpressions"][0]["key"] == "tunefleet.io/profile"
    assert hook["timeoutSeconds"] <= 10
    assert "namespaceSelector" not in hook  # every namespace: a cluster-wide release


def test_a_release_that_watches_namespaces_is_called_for_those_only() -> None:
    cfg = build_webhook_configuration("tf", {"url": "https://x"}, namespaces=("b", "a", "a"))
    (expr,) = cfg["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert expr == {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}


def test_a_pod_in_a_namespace_this_release_does_not_watch_is_left_alone() -> None:
    """Another release's namespace: no label, no patch, whatever reached us."""
    import asyncio
    from dataclasses import replace

    import kopf

    from tunefleet import metrics
    from tunefleet.handlers import on_pod as pod_handlers
    from tunefleet.handlers.startup import Operator

    api = FakeKube()  # records every call: none is wanted for another release's pod
    operator = Operator(api, replace(CFG, namespaces=("mine",)))
    counted = metrics.ADMISSIONS.labels("unchanged", "not_watched")
    before = counted._value.get()
    body = kopf.Body(POD.namespace("theirs").obj())
    patch = kopf.Patch()
    memo = kopf.Memo(operator=operator)  # as kopf hands it (a copy of __main__'s)
    asyncio.run(pod_handlers.pod_mutate(body=body, patch=patch, warnings=[], memo=memo))
    assert not patch and counted._value.get() == before + 1
    assert api.calls == []


DIGEST = "sha256:" + "d" * 64
TUNED_ART = ART_H200.fields(
    outcomes={"tuned": 3, "default": 1},
    manifestSha256="cd" * 32,
    image={
        "reference": "registry.example.com/serve:1",
        "id": f"registry.example.com/serve@{DIGEST}",
    },
    identity={"torch": "2.11.0+cu130", "cuda": "13.0"},
)
TUNED = READY.image("registry.example.com/serve:1").artifacts(TUNED_ART)
TUNED_POD = NO_CONTAINERS.container("server", "registry.example.com/serve:1")
DEFAULT_ONLY = TUNED.artifacts(TUNED_ART.fields(outcomes={"tuned": 0, "default": 4}))


def test_fetch_is_pinned_to_the_manifest_too() -> None:
    d = inject(
        TUNED_POD.obj(),
        "x",
        TUNED.obj(),
        CFG,
    )
    cmd = d.pod["spec"]["initContainers"][0]["command"]
    assert cmd[cmd.index("--manifest-sha256") + 1] == "cd" * 32


def test_a_default_only_artifact_is_not_switched_on_unless_asked() -> None:
    prof = DEFAULT_ONLY.obj()
    d = inject(TUNED_POD.obj(), "x", prof, CFG)
    assert not d.injected and d.reason
    assert "no GEMM where a kernel beat Default" in d.reason
    assert "torch 2.11.0+cu130 on CUDA offers only Default" in d.reason
    assert "serveDefaultOnly" in d.reason
    assert d.pod["metadata"]["annotations"]["tunefleet.io/status"].startswith("untuned: ")
    prof = DEFAULT_ONLY.serving(failClosed=False, serveDefaultOnly=True).obj()
    assert inject(TUNED_POD.obj(), "x", prof, CFG).injected


def test_images_compare_by_digest_where_the_pod_names_one() -> None:
    same = inject(
        NO_CONTAINERS.container("server", f"registry.example.com/serve@{DIGEST}").obj(),
        "x",
        TUNED.obj(),
        CFG,
    )
    assert same.injected and same.warnings == []
    other = inject(
        NO_CONTAINERS.container("server", "registry.example.com/serve@sha256:" + "e" * 64).obj(),
        "x",
        TUNED.obj(),
        CFG,
    )
    assert other.injected and len(other.warnings) == 1
    assert "other digest" in other.warnings[0] and DIGEST in other.warnings[0]
    by_ref = inject(
        NO_CONTAINERS.container("server", "registry.example.com/serve:2").obj(),
        "x",
        TUNED.obj(),
        CFG,
    )
    assert "registry.example.com/serve:2" in by_ref.warnings[0]
    assert "registry.example.com/serve:1 (imageID" in by_ref.warnings[0]


def test_fail_closed_refuses_another_image_showing_both() -> None:
    d = inject(
        NO_CONTAINERS.container("server", "registry.example.com/serve:2").obj(),
        "x",
        TUNED.serving(failClosed=True).obj(),
        CFG,
    )
    assert d.deny and "registry.example.com/serve:2" in d.deny
    assert f"registry.example.com/serve@{DIGEST}" in d.deny and "pinImage" in d.deny


def test_pin_image_rewrites_to_the_tuned_digest() -> None:
    d = inject(
        TUNED_POD.obj(),
        "x",
        TUNED.serving(failClosed=False, pinImage=True).obj(),
        CFG,
    )
    assert d.injected and d.warnings == []
    assert d.pod["spec"]["containers"][0]["image"] == f"registry.example.com/serve@{DIGEST}"
    # A sidecar of another repository is left alone.
    p = NO_CONTAINERS.container("server", "registry.example.com/serve:2").obj()
    p["spec"]["containers"].append({"name": "proxy", "image": "docker.io/envoyproxy/envoy:v1"})
    d = inject(p, "x", TUNED.serving(failClosed=False, pinImage=True).obj(), CFG)
    assert [c["image"] for c in d.pod["spec"]["containers"]] == [
        f"registry.example.com/serve@{DIGEST}",
        "docker.io/envoyproxy/envoy:v1",
    ]


def test_pin_image_without_a_registry_digest_says_so() -> None:
    prof = (
        TUNED.serving(failClosed=False, pinImage=True)
        .artifacts(
            TUNED_ART.fields(
                image={"reference": "registry.example.com/serve:1", "id": "sha256:" + "f" * 64}
            )
        )
        .obj()
    )
    d = inject(TUNED_POD.obj(), "x", prof, CFG)
    assert d.injected and "cannot be pinned" in d.warnings[0]
    prof["spec"]["serving"]["failClosed"] = True
    d = inject(TUNED_POD.obj(), "x", prof, CFG)
    assert d.deny and "no registry digest" in d.deny


class _Profiles:
    """The cache as admission reads it: this profile under every name, or a failure."""

    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer

    def profile(self, key: tuple[str, str]) -> dict[str, Any]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _operator(client: FakeKube, profiles: _Profiles) -> Any:
    """An operator handed its parts: the fake client, CFG, and the cache stand-in."""
    from tunefleet.handlers.startup import Operator

    return Operator(client, CFG, cache=profiles)  # type: ignore[arg-type]


def _call(operator: Any, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """One webhook entry's call: the patch it answers, and the pod as the next entry sees it."""
    import asyncio

    import kopf

    from tunefleet.handlers import on_pod as pod_handlers

    patch = kopf.Patch()
    body_ = kopf.Body(copy.deepcopy(body))
    memo = kopf.Memo(operator=operator)  # as kopf hands it (a copy of __main__'s)
    asyncio.run(pod_handlers.pod_mutate(body=body_, patch=patch, warnings=[], memo=memo))
    after = copy.deepcopy(body)
    for key in ("metadata", "spec"):
        for field_, value in (patch.get(key) or {}).items():
            after.setdefault(key, {})[field_] = value
    return patch, after


def test_the_entries_after_the_first_see_the_pod_decided_and_change_nothing() -> None:
    """The chart registers one webhook entry per replica, called in turn: the first injects,
    the next ones make no lookup, patch nothing and count `already_admitted`."""
    from tunefleet import metrics

    body = POD.namespace("ml").obj()
    name = body["metadata"]["labels"]["tunefleet.io/profile"]
    served = metrics.PODS_SERVED.labels("ml", name, "Store")  # fetched by the init container
    before_served = served._value.get()
    first, after = _call(_operator(FakeKube(), _Profiles(READY.obj())), body)
    assert first["spec"]["initContainers"]
    assert served._value.get() == before_served + 1

    # The next entry's replica: its cache and the API server fail the test if asked.
    api = FakeKube()
    lookup = _Profiles(AssertionError("an injected pod needs no lookup"))
    counted = metrics.ADMISSIONS.labels("unchanged", "already_admitted")
    before = counted._value.get()
    second, again = _call(_operator(api, lookup), after)
    assert not second and again == after and counted._value.get() == before + 1
    assert served._value.get() == before_served + 1  # one pod, served once
    assert api.calls == []


def test_an_untuned_decision_repeated_by_a_later_entry_is_announced_once() -> None:
    from tunefleet.api.conditions import EventReason

    api = FakeKube()  # the Events announced are posted through the operator's client
    operator = _operator(api, _Profiles(READY.artifacts().obj()))
    body = POD.namespace("ml").obj()
    _, after = _call(operator, body)
    assert after["metadata"]["annotations"]["tunefleet.io/status"].startswith("untuned")
    second, again = _call(operator, after)
    assert not second and again == after
    announced = [e for e in api.events if e[0] == EventReason.POD_UNTUNED]
    assert len(announced) == 1, api.events


def test_admission_recognises_the_config_map_made_by_its_uid_not_its_labels() -> None:
    """The watch selects by label: a ConfigMap whose labels were removed is absent there. The
    API server is asked then (only then), and the object made, same uid, is mounted; one
    really gone or replaced is not."""
    import asyncio

    from tunefleet.handlers import on_pod as pod_handlers
    from tunefleet.handlers.startup import Operator

    entry = {"status": {"artifacts": [{"configMap": {"name": "cm-a", "uid": "made"}},
                                      {"configMap": {"name": "cm-b", "uid": "made-b"}}]}}  # fmt: skip
    watched = {"cm-a": "", "cm-b": "made-b"}
    there = {"cm-a": {"metadata": {"uid": "made"}}}
    reads: list[str] = []

    class Delivered:  # what the watch of artifact ConfigMaps holds (serving/delivered.py)
        def uid_of(self, namespace: str, name: str) -> str:
            return watched[name]

    def read(kind: str, ns: str, name: str) -> Any:
        reads.append(name)
        return there.get(name)

    client = FakeKube(intercept={"read": read})
    operator = Operator(client, CFG, delivered=Delivered())  # type: ignore[arg-type]
    got = asyncio.run(pod_handlers._config_map_uids(operator, "ml", entry))
    assert got == {"cm-a": "made", "cm-b": "made-b"} and reads == ["cm-a"]
    del there["cm-a"]  # really gone
    assert asyncio.run(pod_handlers._config_map_uids(operator, "ml", entry))["cm-a"] == ""
    there["cm-a"] = {"metadata": {"uid": "forged"}}  # replaced under its name
    assert asyncio.run(pod_handlers._config_map_uids(operator, "ml", entry))["cm-a"] == "forged"

    def hung(kind: str, ns: str, name: str) -> Any:
        raise TimeoutError("the API server did not answer")

    client.intercept["read"] = hung  # the watch's word stands
    assert asyncio.run(pod_handlers._config_map_uids(operator, "ml", entry))["cm-a"] == ""


# --- bundles: caches beside (or instead of) TunableOp results --------------------------------

CACHE = {"kind": "torchCompile", "name": "torchcompile", "sha256": "cd" * 32, "size": 10,
         "files": 3, "bytes": 4096}  # fmt: skip
CACHED_ART = ART_H200.fields(caches=[CACHE], configMap={"name": "cm", "uid": "u"})
CACHED = READY.spec(artifacts={"tunableop": True, "caches": [{"kind": "torchCompile"}]}).artifacts(
    CACHED_ART
)


def test_caches_are_unpacked_by_fetch_into_a_writable_volume_with_their_variables() -> None:
    d = inject(POD.obj(), "x", CACHED.obj(), CFG)
    spec = d.pod["spec"]
    init = spec["initContainers"][0]
    # A ConfigMap in status does not make caches mountable: fetch unpacks them.
    assert init["name"] == FETCH_CONTAINER and "--uri" in init["command"]
    cmd = init["command"]
    assert cmd[cmd.index("--caches-dest") + 1] == "/tunefleet/caches"
    assert {"name": "tunefleet-caches", "mountPath": "/tunefleet/caches"} in init["volumeMounts"]
    vol = next(v for v in spec["volumes"] if v["name"] == "tunefleet-caches")
    assert int(vol["emptyDir"]["sizeLimit"]) >= 2 * 4096
    for c in spec["containers"]:
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/tunefleet/caches/torchcompile/inductor"
        assert env["TRITON_CACHE_DIR"] == "/tunefleet/caches/torchcompile/triton"
        assert env["PYTORCH_TUNABLEOP_ENABLED"] == "1"
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tunefleet/caches")
        assert not mount.get("readOnly")


def test_caches_alone_switch_no_tunableop_on() -> None:
    d = inject(
        POD.obj(),
        "x",
        CACHED.spec(artifacts={"tunableop": False, "caches": [{"kind": "torchCompile"}]})
        .artifacts(CACHED_ART.fields(kind="caches"))
        .obj(),
        CFG,
    )
    for c in d.pod["spec"]["containers"]:
        names = {e["name"] for e in c["env"]}
        assert "TORCHINDUCTOR_CACHE_DIR" in names
        assert not any(n.startswith("PYTORCH_TUNABLEOP") for n in names)
        assert all(m["mountPath"] != "/tunefleet/results" for m in c["volumeMounts"])


def test_a_users_cache_variable_wins_and_no_variable_comes_from_status() -> None:
    env = [{"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/mine"}]
    p = CACHED.obj()
    # A forged status entry cannot name a variable: only the spec's caches set any.
    p["status"]["artifacts"][0]["caches"].append({**CACHE, "name": "ld", "kind": "cache"})
    d = inject(
        NO_CONTAINERS.container("server", gpus=2, env=env).container("sidecar").obj(), "x", p, CFG
    )
    server = d.pod["spec"]["containers"][0]
    values = {e["name"]: e["value"] for e in server["env"]}
    assert values["TORCHINDUCTOR_CACHE_DIR"] == "/mine"
    assert [e["name"] for e in server["env"]].count("TORCHINDUCTOR_CACHE_DIR") == 1
    assert "LD_PRELOAD" not in values


def test_a_default_only_artifact_still_serves_its_caches_with_tunableop_off() -> None:
    d = inject(
        POD.obj(),
        "x",
        CACHED.artifacts(CACHED_ART.fields(outcomes={"tuned": 0, "default": 12}, gemms=12)).obj(),
        CFG,
    )
    assert d.injected
    for c in d.pod["spec"]["containers"]:
        names = {e["name"] for e in c["env"]}
        assert "TORCHINDUCTOR_CACHE_DIR" in names
        assert not any(n.startswith("PYTORCH_TUNABLEOP") for n in names)
    # Without caches, the same artifact is not served at all (nothing to gain).
    p = CACHED.artifacts(CACHED_ART.fields(outcomes={"tuned": 0, "default": 12}, gemms=12)).obj()
    p["status"]["artifacts"][0]["caches"] = []
    assert not inject(POD.obj(), "x", p, CFG).injected


# --- never a hung pod: the store's credentials are optional for a model pod ---------------------


def test_a_model_pods_fetch_references_its_credentials_as_optional_and_names_them() -> None:
    """A required reference to a Secret the namespace lacks held the pod in
    CreateContainerConfigError for good; optional, it starts and fetch says why (below)."""
    prof = READY.obj()
    cfg = Config(image="tunefleet:1", default_serving_credentials_secret="s3-reader")
    init = inject(POD.obj(), "x", prof, cfg).pod["spec"]["initContainers"][0]
    refs = [e["valueFrom"]["secretKeyRef"] for e in init["env"] if "valueFrom" in e]
    assert refs and all(r["name"] == "s3-reader" and r["optional"] is True for r in refs)
    cmd = init["command"]
    assert cmd[cmd.index("--credentials-secret") + 1] == "s3-reader"
    # No Secret (the pod's cloud identity): nothing referenced, nothing to check.
    bare = inject(POD.obj(), "x", prof, CFG).pod["spec"]["initContainers"][0]
    assert "--credentials-secret" not in bare["command"]


def test_an_oci_stores_secret_volumes_are_optional_for_a_model_pod() -> None:
    prof = READY.obj()
    prof["spec"]["storage"] = {
        "uri": "oci://registry.example:5000/ml/artifacts",
        "signing": {"secret": {"name": "signing"}, "policy": "Required"},
    }
    prof["spec"]["serving"]["credentialsSecret"] = {"name": "registry-reader"}
    prof["status"]["artifacts"][0]["bundle"] = {"digest": "sha256:" + "c" * 64, "signed": True}
    spec = inject(POD.obj(), "x", prof, CFG).pod["spec"]
    secrets = [v["secret"] for v in spec["volumes"] if "secret" in v]
    # The signing Secret is the publisher's: a model pod mounts none (its key is the spec's).
    assert {s["secretName"] for s in secrets} == {"registry-reader"}
    assert all(s["optional"] is True for s in secrets)
