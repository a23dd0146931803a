"""Model pods as they are deployed: the GPU model read from nodeSelector or required node
affinity; a pod that may land on several models gets its artifact picked where it lands (the
init container reads its node from the Downward API and the node map), never a guess; the
operator keeps the node map from a metadata-only Node watch."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import (
    make_artifact,
    make_config_map,
    make_node,
    make_pod,
    make_profile,
)
from tests.support.artifacts import tuner_output
from tests.support.fake_kube import FakeKube
from tunefleet import kube
from tunefleet.artifacts import fetch as fetch_mod
from tunefleet.builders.placement import CANDIDATES_DIR, NODE_MAP_BYTES, build_node_map
from tunefleet.config import Config
from tunefleet.contracts import nodemap
from tunefleet.contracts.admission_record import Admission, Code
from tunefleet.contracts.fetch_outcome import CONTAINER, LOADED, REFUSED, UNTUNED, FetchOutcome
from tunefleet.placement.nodemap_keeper import NodeIndex, NodeMaps, profile_gpu
from tunefleet.webhook.admission import admit
from tunefleet.webhook.reach import reach

CFG = Config(image="tunefleet:1", default_serving_credentials_secret="reader")
KEY = "nvidia.com/gpu.product"
H100, H200, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-A100"
SHA = {H100: "1" * 64, H200: "2" * 64}


def In(*values: str) -> dict[str, Any]:
    return {"key": KEY, "operator": "In", "values": list(values)}


def term(*exprs: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(exprs)}


# A model pod of profile llama asking for two GPUs; where it may land is each test's.
POD = make_pod().profile("llama").container(gpus=2)
EITHER = POD.affinity(term(In(H100, H200)))
# The ConfigMap (name, uid) each model's artifact is delivered in.
CM = {m: (f"tunefleet-artifact-{m.lower()}", f"uid-{m}") for m in (H100, H200)}
ART = {m: make_artifact(m, SHA[m], profile="llama") for m in (H100, H200)}
DELIVERED = {m: ART[m].delivered("ConfigMap", *CM[m]) for m in (H100, H200)}
# Profile llama, Ready, each model it tunes served; published with the "publisher" Secret.
LLAMA = (
    make_profile("llama")
    .uid("p-1")
    .storage("s3://bkt/p", credentialsSecret={"name": "publisher"})
    .serving()
    .phase("Ready")
)
BOTH = LLAMA.gpu("nvidia", H100, H200).artifacts(ART[H100], ART[H200])
ONLY_H100 = LLAMA.gpu("nvidia", H100).artifacts(ART[H100])
ONLY_H200 = LLAMA.gpu("nvidia", H200).artifacts(ART[H200])


def pick_container(p: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in p["spec"]["initContainers"] if c["name"] == CONTAINER]
    return c


def candidates(c: dict[str, Any]) -> list[dict[str, Any]]:
    cmd = c["command"]
    return [json.loads(cmd[i + 1]) for i, a in enumerate(cmd) if a == "--candidate"]


# --- where a pod can land -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "models", "elsewhere", "said"),
    [
        (POD.obj(), (), True, False),
        (POD.selector({KEY: H200}).obj(), (H200,), False, True),
        (POD.selector({KEY: A100}).obj(), (), True, True),
        (POD.affinity(term(In(H200))).obj(), (H200,), False, True),
        (EITHER.obj(), (H100, H200), False, True),
        # ORed terms: the union.
        (POD.affinity(term(In(H100)), term(In(H200))).obj(), (H100, H200), False, True),
        # ANDed expressions: the intersection.
        (POD.affinity(term(In(H100, H200), In(H200, A100))).obj(), (H200,), False, True),
        (POD.affinity(term(In(H200, A100))).obj(), (H200,), True, True),
        (POD.affinity(term(In(A100))).obj(), (), True, True),
        (
            POD.affinity(term({"key": KEY, "operator": "NotIn", "values": [H100]})).obj(),
            (H200,),
            True,
            True,
        ),
        (POD.affinity(term({"key": KEY, "operator": "Exists"})).obj(), (H100, H200), True, True),
        (POD.affinity(term({"key": KEY, "operator": "DoesNotExist"})).obj(), (), True, True),
        # A term without the key, beside one with it: the pod may land anywhere that term allows.
        (
            POD.affinity(
                term(In(H200)), term({"key": "zone", "operator": "In", "values": ["a"]})
            ).obj(),
            (H100, H200),
            True,
            True,
        ),
        # Only other keys: says nothing of the GPU model.
        (
            POD.affinity(term({"key": "zone", "operator": "In", "values": ["a"]})).obj(),
            (),
            True,
            False,
        ),
        # An empty term matches no node.
        (POD.affinity(term(In(H200)), {}).obj(), (H200,), False, True),
    ],
)
def test_the_models_a_pod_can_land_on(
    p: dict[str, Any], models: tuple[str, ...], elsewhere: bool, said: bool
) -> None:
    r = reach(p, KEY, [H100, H200])
    assert (r.models, r.elsewhere, r.said) == (models, elsewhere, said)


# --- admission ------------------------------------------------------------------------------


def test_affinity_on_one_model_is_served_like_a_node_selector_and_adds_nothing() -> None:
    p = POD.affinity(term(In(H200))).obj()
    d = admit(p, "llama", BOTH.obj(), CFG)
    assert d.injected, d.reason
    assert "nodeSelector" not in d.pod["spec"]
    assert d.pod["spec"]["affinity"] == p["spec"]["affinity"]
    cmd = pick_container(d.pod)["command"]
    assert cmd[cmd.index("--sha256") + 1] == SHA[H200]
    assert Admission.read(d.pod).gpu_model == H200  # type: ignore[union-attr]


def test_a_one_model_profile_reads_the_users_affinity_instead_of_adding_a_selector() -> None:
    d = admit(POD.affinity(term(In(H200))).obj(), "llama", ONLY_H200.obj(), CFG)
    assert d.injected and "nodeSelector" not in d.pod["spec"]
    # Saying nothing about the GPU model: pinned, as before.
    d = admit(POD.obj(), "llama", ONLY_H200.obj(), CFG)
    assert d.pod["spec"]["nodeSelector"] == {KEY: H200}


def test_a_pod_that_may_land_on_several_models_gets_them_all_picked_at_its_node() -> None:
    d = admit(EITHER.obj(), "llama", BOTH.obj(), CFG)
    assert d.injected and d.code == Code.NONE
    spec = d.pod["spec"]
    assert "nodeSelector" not in spec  # where it lands is the scheduler's business
    c = pick_container(d.pod)
    assert [x["gpuModel"] for x in candidates(c)] == [H100, H200]
    assert {x["sha256"] for x in candidates(c)} == set(SHA.values())
    node_env = next(e for e in c["env"] if e["name"] == nodemap.NODE_ENV)
    assert node_env["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    (vol,) = [v for v in spec["volumes"] if v["name"] == "tunefleet-candidates"]
    (nodes,) = vol["projected"]["sources"]
    assert nodes["configMap"]["name"] == nodemap.config_map_name(KEY)
    assert nodes["configMap"]["optional"] is True
    assert [i["key"] for i in nodes["configMap"]["items"]] == [H100, H200]
    # Fetched from the store: the read-only serving Secret, never the publish one.
    env = json.dumps(c.get("env"))
    assert "reader" in env and "publisher" not in env
    a = Admission.read(d.pod)
    assert a is not None and a.candidates == SHA and a.gpu_model == "" and a.sha256 == ""
    # The app containers read what the init container picked.
    server = spec["containers"][0]
    assert any(m["mountPath"] == "/tunefleet/results" for m in server["volumeMounts"])


def test_open_affinity_on_a_one_model_profile_is_picked_at_the_node_not_narrowed() -> None:
    exists = term({"key": KEY, "operator": "Exists"})
    d = admit(POD.affinity(exists).obj(), "llama", ONLY_H200.obj(), CFG)
    assert d.injected and "nodeSelector" not in d.pod["spec"]
    assert [x["gpuModel"] for x in candidates(pick_container(d.pod))] == [H200]


def test_delivered_candidates_are_mounted_and_need_no_credentials() -> None:
    prof = BOTH.artifacts(DELIVERED[H100], DELIVERED[H200]).obj()
    prof["status"]["artifacts"][1]["delivery"] = "ConfigMap gzip"
    d = admit(EITHER.obj(), "llama", prof, CFG)
    c = pick_container(d.pod)
    assert not any("reader" in json.dumps(e) for e in c.get("env") or [])
    uris = [x["uri"] for x in candidates(c)]
    assert uris == [f"file://{CANDIDATES_DIR}/ml/llama/{m}/{SHA[m]}" for m in (H100, H200)]
    (vol,) = [v for v in d.pod["spec"]["volumes"] if v["name"] == "tunefleet-candidates"]
    h100, h200 = vol["projected"]["sources"][1:]
    assert [i["key"] for i in h100["configMap"]["items"]] == ["results.csv", "manifest.json"]
    assert [i["key"] for i in h200["configMap"]["items"]] == ["results.csv.gz", "manifest.json"]
    assert all(s["configMap"]["optional"] for s in vol["projected"]["sources"])
    # A candidate ConfigMap replaced since it was made is fetched from the store there (the
    # same artifact, verified), and only there; never mounted.
    d = admit(
        EITHER.obj(), "llama", prof, CFG,
        {"tunefleet-artifact-nvidia-h100-80gb-hbm3": "another", "tunefleet-artifact-nvidia-h200": "uid-NVIDIA-H200"},
    )  # fmt: skip
    got = candidates(pick_container(d.pod))
    assert got[0]["uri"] == prof["status"]["artifacts"][0]["uri"] and "untuned" not in got[0]
    assert got[0]["sha256"] == SHA[H100] and got[1]["sha256"] == SHA[H200]
    assert got[1]["uri"] == f"file://{CANDIDATES_DIR}/ml/llama/{H200}/{SHA[H200]}"
    assert d.code == Code.STORE_FALLBACK and any("was replaced" in n for n in d.notes)
    (vol,) = [v for v in d.pod["spec"]["volumes"] if v["name"] == "tunefleet-candidates"]
    mounted = [s["configMap"]["name"] for s in vol["projected"]["sources"][1:]]
    assert mounted == ["tunefleet-artifact-nvidia-h200"]


def test_a_model_without_an_artifact_is_offered_as_untuned_there() -> None:
    d = admit(EITHER.obj(), "llama", BOTH.artifacts(ART[H200]).obj(), CFG)
    h100, h200 = candidates(pick_container(d.pod))
    assert "no artifact for NVIDIA-H100-80GB-HBM3" in h100["untuned"]
    assert h100["failClosed"] is False and h200["sha256"] == SHA[H200]
    assert Admission.read(d.pod).candidates == {H100: "", H200: SHA[H200]}  # type: ignore[union-attr]
    closed = BOTH.artifacts(ART[H200]).serving(failClosed=True).obj()
    h100, _ = candidates(pick_container(admit(EITHER.obj(), "llama", closed, CFG).pod))
    assert h100["failClosed"] is True


def test_no_model_the_pod_may_land_on_has_an_artifact_untuned_at_admission() -> None:
    d = admit(EITHER.obj(), "llama", BOTH.artifacts().obj(), CFG)
    assert not d.injected and d.code == Code.NO_ARTIFACT
    assert H100 in d.reason and H200 in d.reason
    d = admit(EITHER.obj(), "llama", BOTH.artifacts().serving(failClosed=True).obj(), CFG)
    assert d.deny and H200 in d.deny


def test_affinity_on_models_the_profile_does_not_tune_says_so() -> None:
    d = admit(POD.affinity(term(In(A100))).obj(), "llama", BOTH.obj(), CFG)
    assert d.code == Code.MODEL_NOT_TUNED and A100 in d.reason and "affinity" in d.reason
    assert Admission.read(d.pod).gpu_model == A100  # type: ignore[union-attr]
    notin = term({"key": KEY, "operator": "NotIn", "values": [H100, H200]})
    d = admit(POD.affinity(notin).obj(), "llama", BOTH.obj(), CFG)
    assert d.code == Code.MODEL_NOT_TUNED and "none of them" in d.reason


def test_no_selector_and_several_models_is_untuned_as_before_and_names_affinity() -> None:
    d = admit(POD.obj(), "llama", BOTH.obj(), CFG)
    assert d.code == Code.NO_MODEL_SELECTOR and "required node affinity" in d.reason


def test_readmission_of_a_pod_picked_at_the_node_changes_nothing() -> None:
    first = admit(EITHER.obj(), "llama", BOTH.obj(), CFG)
    again = admit(copy.deepcopy(first.pod), "llama", BOTH.obj(), CFG)
    assert again.pod == first.pod and not again.injected


def test_images_are_pinned_only_to_a_digest_every_candidate_was_tuned_in() -> None:
    prof = BOTH.serving(pinImage=True).obj()
    for i, a in enumerate(prof["status"]["artifacts"]):
        a["image"] = {"reference": "serve:1", "id": f"reg/serve@sha256:{str(i) * 64}"}
    d = admit(EITHER.obj(), "llama", prof, CFG)
    assert d.pod["spec"]["containers"][0]["image"] == "serve:1"
    assert any("different images" in w for w in d.warnings)
    prof["status"]["artifacts"][1]["image"] = dict(prof["status"]["artifacts"][0]["image"])
    d = admit(EITHER.obj(), "llama", prof, CFG)
    assert d.pod["spec"]["containers"][0]["image"] == f"reg/serve@sha256:{'0' * 64}"


# --- the init container picks by its node ----------------------------------------------------


def _lay_out(tmp: Path, models: list[str]) -> dict[str, str]:
    """Each model's artifact where the candidates' volume would mount it; returns shas."""
    shas = {}
    for m in models:
        manifest = tuner_output(tmp / "out" / m, gpu_model=m)
        sha = manifest.results_sha256
        dest = tmp / "candidates" / "ml" / "llama" / m / sha
        dest.mkdir(parents=True)
        for name in ("results.csv", "manifest.json"):
            (dest / name).write_bytes((tmp / "out" / m / name).read_bytes())
        shas[m] = sha
    return shas


def _run_pick(
    tmp: Path, d: Any, node: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, FetchOutcome | None]:
    cmd = [
        a.replace(CANDIDATES_DIR, str(tmp / "candidates")) for a in pick_container(d.pod)["command"]
    ]
    cmd[cmd.index("--dest") + 1] = str(tmp / "results")
    monkeypatch.setenv(nodemap.NODE_ENV, node)
    log = tmp / "termination-log"
    rc = fetch_mod.main([*cmd[1:], "--termination-log", str(log)])
    return rc, FetchOutcome.parse(log.read_text())


def test_the_init_container_loads_the_artifact_of_the_node_it_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shas = _lay_out(tmp_path, [H100, H200])
    nodes = tmp_path / "candidates" / "nodes"
    nodes.mkdir(parents=True)
    (nodes / H100).write_text(nodemap.encode(["gpu-a", "gpu-b"]))
    (nodes / H200).write_text(nodemap.encode(["gpu-c"]))
    laid = [
        make_artifact(m, shas[m], profile="llama").delivered("ConfigMap", *CM[m])
        for m in (H100, H200)
    ]
    d = admit(EITHER.obj(), "llama", BOTH.artifacts(*laid).obj(), CFG)
    rc, out = _run_pick(tmp_path, d, "gpu-c", monkeypatch)
    assert rc == 0 and out is not None and out.verdict == LOADED
    assert (out.gpu_model, out.node, out.sha256) == (H200, "gpu-c", shas[H200])
    assert len(list((tmp_path / "results").glob("tunableop_results*.csv"))) == 2


def test_a_node_the_map_does_not_know_gets_no_artifact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shas = _lay_out(tmp_path, [H100, H200])
    nodes = tmp_path / "candidates" / "nodes"
    nodes.mkdir(parents=True)
    (nodes / H100).write_text(nodemap.encode(["gpu-a"]))
    (nodes / H200).write_text(nodemap.encode(["gpu-a", "gpu-c"]))
    laid = [
        make_artifact(m, shas[m], profile="llama").delivered("ConfigMap", *CM[m])
        for m in (H100, H200)
    ]
    d = admit(EITHER.obj(), "llama", BOTH.artifacts(*laid).obj(), CFG)
    rc, out = _run_pick(tmp_path, d, "gpu-new", monkeypatch)
    assert rc == 0 and out is not None and out.verdict == UNTUNED
    assert "gpu-new is not listed" in out.reason
    rc, out = _run_pick(tmp_path, d, "gpu-a", monkeypatch)  # listed twice: relabelled
    assert out is not None and out.verdict == UNTUNED and "several GPU models" in out.reason
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").iterdir())
    closed = BOTH.artifacts(*laid).serving(failClosed=True).obj()
    d = admit(EITHER.obj(), "llama", closed, CFG)
    rc, out = _run_pick(tmp_path, d, "gpu-new", monkeypatch)
    assert rc == 1 and out is not None and out.verdict == REFUSED


def test_no_node_map_mounted_and_a_model_without_artifact_are_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shas = _lay_out(tmp_path, [H200])
    h200 = make_artifact(H200, shas[H200], profile="llama").delivered("ConfigMap", *CM[H200])
    prof = BOTH.artifacts(h200).obj()
    d = admit(EITHER.obj(), "llama", prof, CFG)
    rc, out = _run_pick(tmp_path, d, "gpu-a", monkeypatch)
    assert out is not None and out.verdict == UNTUNED and "was not there" in out.reason
    nodes = tmp_path / "candidates" / "nodes"
    nodes.mkdir(parents=True)
    (nodes / H100).write_text(nodemap.encode(["gpu-a"]))
    rc, out = _run_pick(tmp_path, d, "gpu-a", monkeypatch)
    assert rc == 0 and out is not None and out.verdict == UNTUNED
    assert out.gpu_model == H100 and "no artifact for" in out.reason


def test_the_outcome_line_names_the_model_and_node_and_older_lines_still_parse() -> None:
    line = FetchOutcome(
        LOADED, files=2, gemms=3, sha256="ab" * 32, dest="/r/x%d.csv", tuned=2, default=1,
        gpu_model=H200, node="gpu-c",
    ).line()  # fmt: skip
    got = FetchOutcome.parse(line)
    assert got is not None and (got.gpu_model, got.node, got.gemms) == (H200, "gpu-c", 3)
    old = FetchOutcome.parse(FetchOutcome(UNTUNED, "store down").line())
    assert old is not None and old.reason == "store down" and old.gpu_model == ""
    said = FetchOutcome.parse(FetchOutcome(UNTUNED, "x (y)", gpu_model=H100, node="n").line())
    assert said is not None and (said.reason, said.gpu_model, said.node) == ("x (y)", H100, "n")


# --- the node map ---------------------------------------------------------------------------


def test_the_node_map_lists_nodes_by_model_and_is_owned_by_its_profiles() -> None:
    cm = build_node_map(
        namespace="ml",
        label_key=KEY,
        nodes={H200: ["n2", "n1"], H100: []},
        owners=[("b", "uid-b"), ("a", "uid-a")],
    )
    assert cm["metadata"]["name"] == nodemap.config_map_name(KEY)
    assert cm["data"] == {H100: "", H200: "n1\nn2\n"}
    refs = cm["metadata"]["ownerReferences"]
    assert [r["uid"] for r in refs] == ["uid-a", "uid-b"]
    assert not any(r["controller"] or r["blockOwnerDeletion"] for r in refs)


def test_the_node_map_of_10000_nodes_fits_and_what_does_not_fit_is_left_out_and_counted() -> None:
    names = [
        f"gke-gpu-pool-{i:05d}-a1b2c3d4-{i:04x}.us-central1-a.c.project" for i in range(10_000)
    ]
    cm = build_node_map(namespace="ml", label_key=KEY, nodes={H100: names}, owners=[])
    assert len(cm["data"][H100]) <= NODE_MAP_BYTES
    assert nodemap.LEFT_OUT_ANNOTATION not in cm["metadata"]["annotations"]
    huge = [n + "x" * 150 for n in names]
    cm = build_node_map(namespace="ml", label_key=KEY, nodes={H100: huge}, owners=[])
    kept = nodemap.decode(cm["data"][H100])
    assert sum(len(k) + 1 for k in kept) <= NODE_MAP_BYTES
    left = int(cm["metadata"]["annotations"][nodemap.LEFT_OUT_ANNOTATION])
    assert left == 10_000 - len(kept) > 0


# A node of each GPU model (its name each test's), as the metadata-only watch lists it.
ON = {m: make_node("n").label(KEY, m).resource_version("1") for m in (H100, H200, "NVIDIA-L4")}


def test_the_index_changes_only_on_what_moves_models() -> None:
    index = NodeIndex()
    assert index.load(KEY, [ON[H100].name("a").obj(), ON[H200].name("b").obj()]) == {H100, H200}
    touched = ON[H100].name("a").resource_version("2").obj()  # a status update
    assert index.apply(KEY, "MODIFIED", touched) == set()
    assert index.apply(KEY, "MODIFIED", ON[H200].name("a").obj()) == {H100, H200}
    assert index.apply(KEY, "DELETED", ON[H200].name("b").obj()) == {H200}
    assert index.nodes(KEY, frozenset({H100, H200})) == {H100: [], H200: ["a"]}


class FakeMaps:
    """The API calls the node maps make, answered by FakeKube from a dict of ConfigMaps."""

    def __init__(self) -> None:
        self.cms: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0
        rv = [0]

        def read(kind: str, ns: str, name: str) -> dict[str, Any] | None:
            return copy.deepcopy(self.cms.get((ns, name)))

        def create(obj: dict[str, Any]) -> dict[str, Any] | None:
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if key in self.cms:
                return None
            rv[0] += 1
            made = copy.deepcopy(obj)
            made["metadata"].update(resourceVersion=str(rv[0]), uid=f"cm-{rv[0]}")
            self.cms[key], self.writes = made, self.writes + 1
            return made

        def patch(ns: str, name: str, version: str, body: dict[str, Any]) -> dict[str, Any] | None:
            there = self.cms[(ns, name)]
            assert there["metadata"]["resourceVersion"] == version
            data = {**there.get("data", {}), **body["data"]}
            there["data"] = {k: v for k, v in data.items() if v is not None}
            anns = {**there["metadata"]["annotations"], **body["metadata"]["annotations"]}
            there["metadata"]["annotations"] = {k: v for k, v in anns.items() if v is not None}
            there["metadata"]["ownerReferences"] = body["metadata"]["ownerReferences"]
            rv[0] += 1
            there["metadata"]["resourceVersion"] = str(rv[0])
            self.writes += 1
            return there

        self.client = FakeKube(
            intercept={
                "read": read,
                "create_config_map": create,
                "patch_config_map": patch,
                "delete_owned": lambda kind, ns, name, uid: self.cms.pop((ns, name)),
            }
        )


def keeper(
    profiles: dict[tuple[str, str], dict[str, Any]], active: threading.Event, api: FakeMaps
) -> NodeMaps:
    maps = NodeMaps(api.client, lambda: list(profiles), profiles.get, active, min_interval=2.0)
    maps._follow_keys = lambda: None  # type: ignore[method-assign]  # no watch threads here
    return maps


def test_the_leader_writes_a_map_per_namespace_and_key_only_when_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeMaps()
    a = BOTH.obj()
    b = ONLY_H200.name("b").uid("p-2").obj()
    other = LLAMA.gpu("amd", "AMD_Instinct_MI300X_OAM").artifacts().name("c").uid("p-3").obj()
    profiles = {("ml", "llama"): a, ("ml", "b"): b, ("ml", "c"): other}
    active = threading.Event()
    maps = keeper(profiles, active, api)
    maps.index.load(
        KEY,
        [ON[H100].name("n1").obj(), ON[H200].name("n2").obj(), ON["NVIDIA-L4"].name("n3").obj()],
    )
    maps.index.load("amd.com/gpu.product-name", [])
    maps.step(now=0.0)
    assert api.writes == 0  # a follower writes nothing
    active.set()
    maps.lead()
    maps.step(now=1.0)
    cm = api.cms[("ml", nodemap.config_map_name(KEY))]
    assert cm["data"] == {H100: "n1\n", H200: "n2\n"}  # the L4 node is no profile's
    assert {r["name"] for r in cm["metadata"]["ownerReferences"]} == {"llama", "b"}
    assert ("ml", nodemap.config_map_name("amd.com/gpu.product-name")) in api.cms
    writes = api.writes
    # A status update of a node moves nothing: no write, no read.
    maps.nodes_changed(
        KEY, maps.index.apply(KEY, "MODIFIED", ON[H100].name("n1").resource_version("9").obj())
    )
    maps.step(now=5.0)
    assert api.writes == writes
    # A burst of new nodes: one write, not before the minimum interval.
    for i in range(5):
        maps.nodes_changed(KEY, maps.index.apply(KEY, "ADDED", ON[H200].name(f"new-{i}").obj()))
        maps.step(now=5.1 + i * 0.1)
    assert api.writes == writes + 1
    maps.step(now=7.5)
    assert api.writes == writes + 2
    assert nodemap.decode(cm["data"][H200]) == {"n2", *(f"new-{i}" for i in range(5))}
    # A profile that stops using the key takes its map away (if it is ours).
    del profiles[("ml", "c")]
    maps.profile_changed("ml")
    maps.step(now=20.0)
    assert ("ml", nodemap.config_map_name("amd.com/gpu.product-name")) not in api.cms


def test_new_owners_alone_wait_longer_than_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    # A burst of profiles into a namespace that has its map changes only who owns it: one
    # write per OWNERS_INTERVAL_S, not one per MIN_INTERVAL_S; nodes still go at the minimum.
    api = FakeMaps()
    profiles = {("ml", "llama"): BOTH.obj()}
    active = threading.Event()
    active.set()
    maps = NodeMaps(api.client, lambda: list(profiles), profiles.get, active, min_interval=2.0,
                    owners_interval=30.0)  # fmt: skip
    maps._follow_keys = lambda: None  # type: ignore[method-assign]
    maps.index.load(KEY, [ON[H100].name("n1").obj(), ON[H200].name("n2").obj()])
    maps.step(now=0.0)
    assert api.writes == 1  # a new map: at once
    cm = api.cms[("ml", nodemap.config_map_name(KEY))]
    for i in range(20):
        p = ONLY_H200.name(f"p{i}").uid(f"u{i}").obj()
        profiles[("ml", f"p{i}")] = p
        maps.profile_changed("ml")
        maps.step(now=1.0 + i)
    assert api.writes == 1  # 20 s of new owners: not yet
    maps.nodes_changed(KEY, maps.index.apply(KEY, "ADDED", ON[H200].name("n3").obj()))
    maps.step(now=21.0)
    assert api.writes == 2  # a node: at the minimum interval, with every owner so far
    assert len(cm["metadata"]["ownerReferences"]) == 21
    profiles[("ml", "late")] = ONLY_H200.name("late").uid("late").obj()
    maps.profile_changed("ml")
    maps.step(now=30.0)
    assert api.writes == 2
    maps.step(now=51.5)
    assert api.writes == 3 and len(cm["metadata"]["ownerReferences"]) == 22
    # A change of models is more than owners: at the minimum interval again.
    profiles[("ml", "late")]["spec"]["gpu"]["models"] = [H100]
    profiles[("ml", "llama")]["spec"]["gpu"]["models"] = [H100]
    for k in list(profiles):
        if k[1].startswith("p"):
            del profiles[k]
    maps.profile_changed("ml")
    maps.step(now=54.0)
    assert api.writes == 4 and H200 not in cm["data"]


def test_a_node_map_that_is_not_ours_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeMaps()
    name = nodemap.config_map_name(KEY)
    forged = (
        make_config_map(name)
        .meta(resourceVersion="1", uid="x")
        .data(**{H100: "attacker-node\n"})
        .obj()
    )
    api.cms[("ml", name)] = copy.deepcopy(forged)
    active = threading.Event()
    active.set()
    maps = keeper({("ml", "llama"): BOTH.obj()}, active, api)
    maps.index.load(KEY, [ON[H100].name("n1").obj()])
    maps.lead()
    maps.step(now=1.0)
    maps.step(now=9.0)
    assert api.cms[("ml", name)] == forged and api.writes == 0


def test_a_key_not_listed_yet_writes_no_empty_map(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeMaps()
    active = threading.Event()
    active.set()
    maps = keeper({("ml", "llama"): ONLY_H100.obj()}, active, api)
    maps.lead()
    maps.step(now=1.0)
    assert api.writes == 0
    maps.index.load(KEY, [ON[H100].name("n1").obj()])
    maps.nodes_changed(KEY, {H100})
    maps.step(now=2.0)
    assert api.writes == 1


def test_profiles_read_leniently_for_the_map() -> None:
    assert profile_gpu(ONLY_H100.obj()) == (KEY, [H100])
    broken = ONLY_H100.set("spec", "gpu", value={"vendor": "intel"}).obj()
    assert profile_gpu(broken) is None
    going = ONLY_H100.deleting("now").obj()
    assert profile_gpu(going) is None


def test_why_says_which_model_was_picked_at_the_node() -> None:
    from tunefleet.plugin.why_cmd import explain, format_why

    d = admit(EITHER.obj(), "llama", BOTH.obj(), CFG)
    injected = copy.deepcopy(d.pod)
    line = FetchOutcome(
        LOADED, files=2, gemms=3, sha256=SHA[H200], dest="/tunefleet/results/x%d.csv",
        tuned=3, default=0, gpu_model=H200, node="gpu-c",
    ).line()  # fmt: skip
    injected["status"] = {
        "phase": "Running",
        "initContainerStatuses": [
            {"name": CONTAINER, "state": {"terminated": {"exitCode": 0, "message": line}}}
        ],
    }
    report = explain(injected, BOTH.obj(), [])
    assert report["tuned"] is True and report["artifact"]["gpuModel"] == H200
    assert report["artifact"]["candidates"] == SHA
    text = format_why(report)
    assert "picked at the node among" in text and "picked NVIDIA-H200 on node gpu-c" in text
    untuned = FetchOutcome(UNTUNED, "node gpu-z is not listed ... in tunefleet's node map").line()
    injected["status"]["initContainerStatuses"][0]["state"]["terminated"]["message"] = untuned
    report = explain(injected, BOTH.obj(), [])
    assert report["verdict"] == "untuned-at-start" and "node-map" in report["fix"]


def test_a_namespace_being_deleted_is_not_retried_every_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeMaps()
    tries: list[str] = []

    def terminating(cm: dict[str, Any]) -> dict[str, Any]:
        tries.append(cm["metadata"]["namespace"])
        raise kube.Gone("namespace ml is being terminated")

    api.client.intercept["create_config_map"] = terminating
    active = threading.Event()
    active.set()
    maps = keeper({("ml", "llama"): ONLY_H100.obj()}, active, api)
    maps.index.load(KEY, [ON[H100].name("n1").obj()])
    maps.lead()
    for t in range(1, 60, 5):
        maps.step(now=float(t))
    assert tries == ["ml"]  # one try; a profile change there wants the map again
    maps.profile_changed("ml")
    maps.step(now=100.0)
    assert tries == ["ml", "ml"]


def test_a_burst_of_new_profiles_reads_each_once_not_its_namespace_each_time() -> None:
    # Each new profile in a burst is one change; reading its whole namespace again at each
    # step unpacked every profile there over and over (9% of the operator's CPU at 10,000).
    api = FakeMaps()
    profiles: dict[tuple[str, str], dict[str, Any]] = {("ml", "llama"): BOTH.obj()}
    read: list[tuple[str, str]] = []

    def profile(key: tuple[str, str]) -> dict[str, Any] | None:
        read.append(key)
        return profiles.get(key)

    active = threading.Event()
    active.set()
    maps = NodeMaps(api.client, lambda: list(profiles), profile, active)
    maps._follow_keys = lambda: None  # type: ignore[method-assign]
    maps.index.load(KEY, [ON[H100].name("n1").obj(), ON[H200].name("n2").obj()])
    maps.step(now=0.0)  # the first step reads every profile (startup)
    read.clear()
    for i in range(20):
        profiles[("ml", f"p{i}")] = ONLY_H200.name(f"p{i}").uid(f"u{i}").obj()
        maps.profile_changed("ml", f"p{i}")
        maps.step(now=1.0 + i)
    assert sorted(read) == sorted(("ml", f"p{i}") for i in range(20))
    # What the map wants still counts every profile, the first one too.
    owners = maps.wanted()[("ml", KEY)].owners
    assert len(owners) == 21
    # One that leaves: read once, and gone from the owners.
    del profiles[("ml", "p3")]
    maps.profile_changed("ml", "p3")
    maps.step(now=40.0)
    assert ("p3", "u3") not in maps.wanted()[("ml", KEY)].owners
    # Its last profile gone, the namespace no longer wants the map.
    for key in list(profiles):
        del profiles[key]
        maps.profile_changed(*key)
    maps.step(now=80.0)
    assert ("ml", KEY) not in maps.wanted()
