"""Delivery that heals: an artifact ConfigMap deleted or replaced under its name is made again
(never trusted by its labels: judged by what it holds), the profile says so while it is not,
and model pods that run untuned for a cause of ours are counted in its Degraded condition."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
from dataclasses import replace
from typing import Any

import pytest

from testbed.builders.profiles import MODELS, profile
from testbed.builders.records import completed, published_pod
from testbed.builders.wrappers import make_pod
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet import naming
from tunefleet.api.conditions import EventReason, Phase, Reason, Type, find
from tunefleet.api.profile_status import TuningProfileStatus
from tunefleet.artifacts import fetch as fetch_mod
from tunefleet.builders.artifact import Payload, build_artifact_config_map
from tunefleet.config import Config
from tunefleet.contracts.admission_record import INJECTED, UNTUNED, Admission, Code
from tunefleet.contracts.fetch_outcome import CONTAINER, FetchOutcome
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.reconciler.status import with_degraded
from tunefleet.serving import delivery
from tunefleet.serving.delivered import DeliveredConfigMaps
from tunefleet.serving.served import (
    CACHES_NOT_SERVED,
    FETCH_DIED,
    FETCH_FAILED,
    VOLUME_NOT_PULLED,
    ServedPods,
    Untuned,
    cause_of,
)

RESULTS = b"Validator,PT_VERSION,2.11.0\nGemmTunableOp_Half_TN,tn_8_8_8,Default,0.1\n"
SHA = hashlib.sha256(RESULTS).hexdigest()
MANIFEST = b'{"schema": "tunefleet.io/manifest/v1"}'
SERVING = Config(image="tunefleet:1", delivery_credentials_secret="reader")


PAYLOAD = Payload(gpu_model="M", sha256=SHA, manifest_sha256="", results=RESULTS, manifest=MANIFEST)
ARTIFACT_CM = build_artifact_config_map(namespace="ml", profile="p", uid="puid", payload=PAYLOAD)
assert ARTIFACT_CM is not None
MODEL_POD = make_pod().uid("pod-1").profile("p").phase("Running")


# --- what a ConfigMap holds, never what it says ------------------------------------------------


def test_a_config_map_is_the_artifact_only_if_it_holds_exactly_its_bytes() -> None:
    assert delivery.content_problem(copy.deepcopy(ARTIFACT_CM), SHA, "", "puid") == ""
    forged = build_artifact_config_map(
        namespace="ml",
        profile="p",
        uid="puid",
        payload=replace(
            PAYLOAD, results=b"Validator,PT_VERSION,2.11.0\nGemmTunableOp_Half_TN,x,Evil,0\n"
        ),
    )
    assert forged is not None
    assert "SHA-256" in delivery.content_problem(forged, SHA, "", "puid")
    # Same labels and annotations, owned by another profile: not this profile's.
    other = build_artifact_config_map(namespace="ml", profile="p", uid="other", payload=PAYLOAD)
    assert other is not None
    assert "not controlled" in delivery.content_problem(other, SHA, "", "puid")
    mutable = {**ARTIFACT_CM, "immutable": False}
    assert "not immutable" in delivery.content_problem(mutable, SHA, "", "puid")
    manifest = hashlib.sha256(MANIFEST).hexdigest()
    assert delivery.content_problem(copy.deepcopy(ARTIFACT_CM), SHA, manifest, "puid") == ""
    assert "manifest" in delivery.content_problem(copy.deepcopy(ARTIFACT_CM), SHA, "0" * 64, "puid")
    packed = copy.deepcopy(ARTIFACT_CM)
    packed["data"].pop("results.csv")
    packed["binaryData"] = {"results.csv.gz": base64.b64encode(gzip.compress(RESULTS)).decode()}
    assert delivery.content_problem(packed, SHA, "", "puid") == ""
    packed["binaryData"] = {"results.csv.gz": "bm90IGd6aXA="}
    assert "unpack" in delivery.content_problem(packed, SHA, "", "puid")


def test_the_next_name_is_derived_from_the_foreign_object_and_stays_a_valid_name() -> None:
    base = ARTIFACT_CM["metadata"]["name"]
    one, two = delivery.next_name(base, "uid-a"), delivery.next_name(base, "uid-b")
    assert one != two and one == delivery.next_name(base, "uid-a") and len(one) <= 253
    assert one.startswith(base + "-")


# --- the reconcile makes it again ---------------------------------------------------------------


class World:
    """A profile whose artifact was delivered, over FakeKube; `there` is what the API server
    holds by ConfigMap name, `watched` what the watch has seen."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
        self.job = completed(self.p)
        self.api = FakeKube(writers=RECONCILE_WRITERS)
        self.uri = f"s3://bkt/p/ml/p/{MODELS[0]}/{SHA}"
        self.downloads = 0
        self.store_down = False
        self.there: dict[str, dict[str, Any]] = {}
        self.watched: dict[str, str] = {}
        self.memory = Memory()
        monkeypatch.setattr(delivery, "download_verified", self.download)
        self.api.intercept["read"] = lambda kind, ns, name: self.there.get(name)
        self.made = 0

        def create(obj: dict[str, Any]) -> dict[str, Any] | None:
            name = obj["metadata"]["name"]
            if obj["kind"] != "ConfigMap" or not name.startswith("tunefleet-artifact-"):
                return FakeKube.DEFAULT  # type: ignore[no-any-return]
            if name in self.there:
                return None  # 409, and the one there carries our ownerReference
            self.made += 1
            out = dict(obj, metadata=dict(obj["metadata"], uid=f"uid-{self.made}"))
            self.there[name] = out
            self.watched[name] = out["metadata"]["uid"]
            return out

        self.api.intercept["create_owned"] = create

    def download(self, pin: fetch_mod.Pinned, **_: Any) -> fetch_mod.Verified:
        self.downloads += 1
        if self.store_down:
            raise fetch_mod.FetchError("downloading failed: connection refused")
        return fetch_mod.Verified(RESULTS, MANIFEST, 0, pin.sha256)

    def sync(self, status: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
        p = {**self.p, "status": status} if status else self.p
        around = Around(self.api, config_map_uid=lambda ns, name: self.watched.get(name, ""), **kw)
        pods = [published_pod(self.job, self.uri)]
        return sync_profile(p, [self.job], pods, SERVING, self.memory, around).status.to_status()


def config_map_of(status: dict[str, Any]) -> dict[str, str]:
    got: dict[str, str] = status["artifacts"][0]["configMap"]
    return got


def test_a_deleted_artifact_config_map_is_made_again_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch)
    first = w.sync(None)
    cm = config_map_of(first)
    assert find(first, Type.DEGRADED)["status"] == "False" and first["phase"] == "Ready"
    # As long as the watch agrees with status, nothing is read or made.
    again = w.sync(first)
    assert config_map_of(again) == cm and w.downloads == 1
    # kubectl delete cm
    del w.there[cm["name"]], w.watched[cm["name"]]
    healed = w.sync(again)
    remade = config_map_of(healed)
    assert remade["name"] == cm["name"] and remade["uid"] != cm["uid"] and w.downloads == 2
    assert find(healed, Type.DEGRADED)["status"] == "False" and healed["phase"] == "Ready"
    said = [m for r, m in w.api.events if r == EventReason.CONFIG_MAP_REMADE]
    assert len(said) == 1 and "was deleted" in said[0] and cm["name"] in said[0]


def test_a_lagging_watch_is_checked_with_the_api_server_before_anything_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch)
    first = w.sync(None)
    w.watched.clear()  # the watch has not seen it yet; the API server has it, same uid
    again = w.sync(first)
    assert config_map_of(again) == config_map_of(first) and w.downloads == 1
    assert not [r for r, _ in w.api.events if r == EventReason.CONFIG_MAP_REMADE]


def test_a_config_map_whose_labels_were_removed_is_labelled_again_not_left_unseen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch selects artifact ConfigMaps by label: with its role label removed, the very
    object made (same uid) vanished from it, admission took it for gone, and the reconcile,
    reading the same uid from the API server, did nothing: no heal, no Degraded."""
    w = World(monkeypatch)
    first = w.sync(None)
    cm = config_map_of(first)
    w.there[cm["name"]]["metadata"]["labels"] = {"app": "mine"}  # kubectl label ... role-
    del w.watched[cm["name"]]
    patched: list[tuple[str, str, dict[str, Any]]] = []

    def patch_owned(kind: str, ns: str, name: str, owner: str, patch: dict[str, Any]) -> bool:
        if kind != "ConfigMap":
            return FakeKube.DEFAULT  # type: ignore[no-any-return]
        patched.append((name, owner, patch))
        w.there[name]["metadata"]["labels"].update(patch["metadata"]["labels"])
        w.watched[name] = w.there[name]["metadata"]["uid"]
        return True

    w.api.intercept["patch_owned"] = patch_owned
    healed = w.sync(first)
    assert config_map_of(healed) == cm and w.downloads == 1  # the same object, not remade
    uid = w.p["metadata"]["uid"]
    assert patched == [
        (cm["name"], uid, {"metadata": {"labels": naming.artifact_config_map_labels(uid)}})
    ]
    said = [m for r, m in w.api.events if r == EventReason.CONFIG_MAP_REMADE]
    assert len(said) == 1 and "had lost its labels" in said[0] and cm["name"] in said[0]
    # Seen again: nothing more to do.
    w.sync(healed)
    assert len(patched) == 1


def test_a_replaced_config_map_is_never_taken_the_artifact_goes_under_another_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch)
    first = w.sync(None)
    cm = config_map_of(first)
    # Deleted, and another put in its place with the same labels and ownerReference.
    forged = build_artifact_config_map(
        namespace="ml",
        profile="p",
        uid=w.p["metadata"]["uid"],
        payload=replace(PAYLOAD, results=b"Validator,PT_VERSION,2.11.0\n"),
    )
    assert forged is not None
    forged["metadata"]["name"] = cm["name"]
    forged["metadata"]["uid"] = "forged-uid"
    w.there[cm["name"]] = forged
    w.watched[cm["name"]] = "forged-uid"
    healed = w.sync(first)
    remade = config_map_of(healed)
    assert remade["name"] == delivery.next_name(cm["name"], "forged-uid")
    assert w.there[remade["name"]]["metadata"]["uid"] == remade["uid"]
    untrusted = [m for r, m in w.api.events if r == EventReason.UNTRUSTED_OBJECT]
    assert len(untrusted) == 1 and "forged-uid" in untrusted[0] and "never mounted" in untrusted[0]
    assert find(healed, Type.DEGRADED)["status"] == "False"
    # Found again on later passes: said once.
    w.sync(healed)
    assert len([r for r, _ in w.api.events if r == EventReason.UNTRUSTED_OBJECT]) == 1


def test_while_it_cannot_be_made_again_the_profile_is_degraded_then_recovers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch)
    first = w.sync(None)
    cm = config_map_of(first)
    del w.there[cm["name"]], w.watched[cm["name"]]
    w.store_down = True
    broken = w.sync(first)
    degraded = find(broken, Type.DEGRADED)
    assert degraded["status"] == "True" and degraded["reason"] == Reason.DELIVERY_FAILED
    assert "was deleted" in degraded["message"] and broken["phase"] == "Degraded"
    assert "configMap" not in broken["artifacts"][0]
    assert "connection refused" in broken["artifacts"][0]["delivery"]
    # Tried again soon (REDELIVER_AFTER_S), not after the 300 s of a first delivery.
    w.store_down = False
    w.memory.of(w.p["metadata"]["uid"]).deliveries.clear()  # as if REDELIVER_AFTER_S passed
    healed = w.sync(broken)
    assert find(healed, Type.DEGRADED)["status"] == "False" and healed["phase"] == "Ready"
    assert config_map_of(healed)["name"] == cm["name"]


def test_pods_that_run_untuned_for_a_cause_of_ours_make_the_profile_degraded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch)
    first = w.sync(None)
    pods = [
        Untuned("m-1", FETCH_FAILED, "downloading s3://bkt/x failed: connection refused"),
        Untuned("m-2", FETCH_FAILED, "downloading s3://bkt/x failed: connection refused"),
    ]
    got = w.sync(first, untuned_pods=pods)
    degraded = find(got, Type.DEGRADED)
    assert degraded["status"] == "True" and degraded["reason"] == Reason.PODS_UNTUNED
    assert "2 model pod(s)" in degraded["message"] and "m-1, m-2" in degraded["message"]
    assert got["phase"] == "Degraded"
    events = [m for r, m in w.api.events if r == Reason.PODS_UNTUNED]
    assert len(events) == 1 and "fetch_failed" in events[0]
    w.sync(got, untuned_pods=pods)  # the same count: not said again
    assert len([r for r, _ in w.api.events if r == Reason.PODS_UNTUNED]) == 1
    done = w.sync(got, untuned_pods=[])
    assert find(done, Type.DEGRADED)["status"] == "False" and done["phase"] == "Ready"
    # Back to Ready from Degraded is not a new "Artifacts published".
    assert len([r for r, _ in w.api.events if r == EventReason.READY]) == 1


def test_degraded_keeps_its_transition_time_and_leaves_other_phases_alone() -> None:
    base = TuningProfileStatus(1, Phase.TUNING, conditions=[], artifacts=[], history=[])
    pods = [Untuned("m", FETCH_FAILED, "x")]
    one = with_degraded(base, {}, pods, [], 1, "t1").to_status()
    assert one["phase"] == "Tuning" and find(one, Type.DEGRADED)["lastTransitionTime"] == "t1"
    two = with_degraded(base, one, [*pods, Untuned("n", FETCH_FAILED, "x")], [], 1, "t2")
    assert find(two.to_status(), Type.DEGRADED)["lastTransitionTime"] == "t1"


# --- which pods count ----------------------------------------------------------------------------


def test_only_causes_of_ours_are_counted() -> None:
    gone = Admission(UNTUNED, Code.CONFIG_MAP_REPLACED, "the ConfigMap x is gone")
    assert cause_of(MODEL_POD.admitted(gone).obj()) == Untuned(
        "m", "config_map_replaced", "the ConfigMap x is gone"
    )
    # The profile's or the pod's own choices are not ours to fix.
    for code in (
        Code.DEFAULT_ONLY,
        Code.MODEL_NOT_TUNED,
        Code.NO_ARTIFACT,
        Code.PARTITION_MISMATCH,
    ):
        assert cause_of(MODEL_POD.admitted(Admission(UNTUNED, code, "why")).obj()) is None
    injected = Admission(INJECTED, sha256=SHA, uri="s3://bkt/x")
    refused = FetchOutcome("untuned", reason="results.csv has SHA-256 00, expected ab")
    assert cause_of(
        MODEL_POD.admitted(injected).terminated(CONTAINER, 0, refused.line(), init=True).obj()
    ) == Untuned("m", FETCH_FAILED, refused.reason)
    loaded = FetchOutcome("loaded", files=1, gemms=1, sha256=SHA, dest="/r", tuned=1, default=0)
    assert (
        cause_of(
            MODEL_POD.admitted(injected).terminated(CONTAINER, 0, loaded.line(), init=True).obj()
        )
        is None
    )
    assert (
        cause_of(
            MODEL_POD.phase("Succeeded")
            .admitted(injected)
            .terminated(CONTAINER, 0, refused.line(), init=True)
            .obj()
        )
        is None
    )
    # Picked at its node, where admission had already said untuned: not a fetch failure.
    at_node = Admission(INJECTED, candidates={"A": SHA, "B": ""})
    picked = FetchOutcome("untuned", reason="Default only", gpu_model="B", node="n1")
    assert (
        cause_of(
            MODEL_POD.admitted(at_node).terminated(CONTAINER, 0, picked.line(), init=True).obj()
        )
        is None
    )


def test_a_pod_that_cannot_pull_its_volume_image_is_counted_with_the_kubelets_reason() -> None:
    ref = "10.250.0.1:15000/team/tf@sha256:" + "d" * 64
    admitted = Admission(INJECTED, sha256=SHA, uri="oci://x", image_volume=ref)
    pod = MODEL_POD.admitted(admitted).obj()
    msg = f'Back-off pulling image "{ref}": ErrImagePull: pull access denied'
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": msg}}
    pod["status"]["containerStatuses"] = [{"name": "server", "state": waiting}]
    got = cause_of(pod)
    assert got is not None and got.cause == VOLUME_NOT_PULLED
    assert got.reason.startswith(f"its volume image {ref} is not pulled: ImagePullBackOff")
    # The pod's own image failing to pull is the pod's business, not ours.
    own = {"waiting": {"reason": "ImagePullBackOff", "message": 'pulling image "serve:1"'}}
    pod["status"]["containerStatuses"] = [{"name": "server", "state": own}]
    assert cause_of(pod) is None


def test_a_pod_served_its_results_but_not_its_caches_is_counted() -> None:
    """It loaded TunableOp's results, but its stack compiles cold: not what the profile
    promised. Before, it counted as served."""
    injected = Admission(INJECTED, sha256=SHA, uri="s3://bkt/x")
    half = FetchOutcome(
        "loaded", files=1, gemms=1, sha256=SHA, dest="/r", tuned=1, default=0,
        caches_failed="archive torchcompile has SHA-256 00, expected ab",
    )  # fmt: skip
    assert cause_of(
        MODEL_POD.admitted(injected).terminated(CONTAINER, 0, half.line(), init=True).obj()
    ) == Untuned(
        "m",
        CACHES_NOT_SERVED,
        "caches not served: archive torchcompile has SHA-256 00, expected ab",
    )
    whole = FetchOutcome(
        "loaded", files=1, gemms=1, sha256=SHA, dest="/r", tuned=1, default=0,
        caches=("torchcompile",), caches_dest="/c",
    )  # fmt: skip
    assert (
        cause_of(
            MODEL_POD.admitted(injected).terminated(CONTAINER, 0, whole.line(), init=True).obj()
        )
        is None
    )


# An injected model pod whose fetch init container has tunefleet's memory limit.
INJECTED_POD = MODEL_POD.admitted(Admission(INJECTED, sha256=SHA, uri="s3://bkt/x")).container(
    CONTAINER, "tunefleet:1", limits={"memory": "256Mi"}, init=True
)
OOM = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
EMPTY_DIR = 'Usage of EmptyDir volume "tunefleet-caches" exceeds the limit "1Gi". '


def fetch_status(pod: Any, phase: str, restarts: int = 0, **states: Any) -> dict[str, Any]:
    """The pod with its phase and one status of its fetch init container (state, lastState)."""
    got: dict[str, Any] = pod.phase(phase).obj()
    status = {"name": CONTAINER, "restartCount": restarts, "state": {}, **states}
    got["status"]["initContainerStatuses"] = [status]
    return got


def test_a_fetch_that_was_oom_killed_is_counted_with_its_limit_and_restarts() -> None:
    """A fetch the kernel killed says nothing (no termination message): the pod never starts
    (restartPolicy Always: the kubelet retries it), or is Failed (Never). Before, neither was
    counted, and the profile stayed Ready."""
    reason = "the tunefleet-fetch init container was OOMKilled (memory limit 256Mi); restarts: "
    # restartPolicy Never: the pod is Failed, and that is exactly what must be told.
    assert cause_of(fetch_status(INJECTED_POD, "Failed", state=OOM)) == Untuned(
        "m", FETCH_DIED, reason + "0"
    )
    # Always: the kubelet retries it; the termination is in lastState.
    backoff = {"waiting": {"reason": "CrashLoopBackOff"}}
    pending = fetch_status(INJECTED_POD, "Pending", 3, state=backoff, lastState=OOM)
    assert cause_of(pending) == Untuned("m", FETCH_DIED, reason + "3")
    # Retried with room and loaded: served, whatever an earlier run did.
    loaded = FetchOutcome("loaded", files=1, gemms=1, sha256=SHA, dest="/r", tuned=1, default=0)
    done = {"terminated": {"exitCode": 0, "message": loaded.line()}}
    assert cause_of(fetch_status(INJECTED_POD, "Running", 1, state=done, lastState=OOM)) is None
    # No limit in the spec: said without one.
    bare = MODEL_POD.admitted(Admission(INJECTED, sha256=SHA))
    got = cause_of(fetch_status(bare, "Pending", state=OOM))
    assert got is not None and got.reason.startswith("the tunefleet-fetch init container was ")
    assert "memory limit" not in got.reason


def test_a_fetch_killed_or_crashed_without_its_outcome_line_is_counted() -> None:
    killed = {"terminated": {"exitCode": 137, "reason": "Error"}}
    got = cause_of(fetch_status(INJECTED_POD, "Pending", 2, state=killed))
    assert got == Untuned(
        "m",
        FETCH_DIED,
        "the tunefleet-fetch init container was killed (exit 137, SIGKILL) before it said what "
        "it did; restarts: 2",
    )
    # FallbackToLogsOnError: a crash leaves its log's tail; its last line is quoted.
    log = "Traceback (most recent call last):\n  ...\nMemoryError: cannot allocate\n"
    crashed = {"terminated": {"exitCode": 1, "reason": "Error", "message": log}}
    got = cause_of(fetch_status(INJECTED_POD, "Failed", state=crashed))
    assert got is not None and got.cause == FETCH_DIED
    assert got.reason == (
        "the tunefleet-fetch init container exited 1 without its outcome line: MemoryError: "
        "cannot allocate; restarts: 0"
    )
    # Fail closed says why and exits non-zero: a refusal, the pod's own policy, as before.
    refused = FetchOutcome("refused", reason="results.csv has SHA-256 00, expected ab")
    closed = {"terminated": {"exitCode": 1, "message": refused.line()}}
    assert cause_of(fetch_status(INJECTED_POD, "Pending", state=closed)) is None
    # Still running, or an exit 0 without a word: nothing to say yet (why points at its log).
    assert cause_of(fetch_status(INJECTED_POD, "Pending", state={"running": {}})) is None
    silent = {"terminated": {"exitCode": 0, "message": ""}}
    assert cause_of(fetch_status(INJECTED_POD, "Running", state=silent)) is None


def test_a_pod_evicted_over_tunefleets_volume_is_counted_with_the_kubelets_message() -> None:
    loaded = FetchOutcome("loaded", files=1, gemms=1, sha256=SHA, dest="/r", tuned=1, default=0)
    done = {"terminated": {"exitCode": 0, "message": loaded.line()}}
    pod = fetch_status(INJECTED_POD, "Failed", state=done)
    pod["status"].update(reason="Evicted", message=EMPTY_DIR)
    assert cause_of(pod) == Untuned(
        "m",
        FETCH_DIED,
        'the pod was evicted by the kubelet: Usage of EmptyDir volume "tunefleet-caches" '
        'exceeds the limit "1Gi".',
    )
    # The kubelet naming the fetch container (node memory pressure) counts too.
    pressure = (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
        "Container tunefleet-fetch was using 300Mi, request is 64Mi, has larger consumption."
    )
    pod["status"]["message"] = pressure
    got = cause_of(pod)
    assert got is not None and got.cause == FETCH_DIED and pressure in got.reason
    # Evicted over the pod's own volume or container: its business, not ours.
    pod["status"]["message"] = 'Usage of EmptyDir volume "tunefleet-caches-mine" exceeds "1Gi".'
    assert cause_of(pod) is None
    pod["status"]["message"] = "Container server was using 30Gi, request is 1Gi."
    assert cause_of(pod) is None
    # Evicted for another cause while fetch ran (killed with the pod): not ours either.
    pod = fetch_status(INJECTED_POD, "Failed", state=OOM)
    pod["status"].update(reason="Evicted", message="Container server was using 30Gi.")
    assert cause_of(pod) is None


def test_a_pod_failed_for_a_cause_of_its_own_is_still_not_counted() -> None:
    loaded = FetchOutcome("loaded", files=1, gemms=1, sha256=SHA, dest="/r", tuned=1, default=0)
    done = {"terminated": {"exitCode": 0, "message": loaded.line()}}
    failed = fetch_status(INJECTED_POD, "Failed", state=done)
    failed["status"]["containerStatuses"] = [
        {"name": "server", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    ]
    assert cause_of(failed) is None
    # Fetch failed open, then the pod ended: ended, as before.
    untuned = FetchOutcome("untuned", reason="connection refused")
    opened = {"terminated": {"exitCode": 0, "message": untuned.line()}}
    assert cause_of(fetch_status(INJECTED_POD, "Failed", state=opened)) is None
    assert cause_of(fetch_status(INJECTED_POD, "Running", state=opened)) is not None
    # Its node shut down while fetch ran: the kubelet's cause, not ours.
    shutdown = fetch_status(INJECTED_POD, "Failed", state={"terminated": {"exitCode": 137}})
    shutdown["status"].update(reason="NodeShutdown", message="Pod was terminated in response.")
    assert cause_of(shutdown) is None
    # Being deleted, or never admitted: not counted, whatever fetch did.
    deleting = fetch_status(INJECTED_POD.deleting(), "Failed", state=OOM)
    assert cause_of(deleting) is None
    unadmitted = fetch_status(MODEL_POD.container(CONTAINER, init=True), "Failed", state=OOM)
    assert cause_of(unadmitted) is None


def test_a_dead_fetch_makes_the_profile_degraded_with_its_own_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch)
    first = w.sync(None)
    died = cause_of(fetch_status(INJECTED_POD, "Failed", state=OOM))
    assert died is not None
    pods = [Untuned("m-1", FETCH_FAILED, "connection refused"), replace(died, pod="m-2")]
    got = w.sync(first, untuned_pods=pods)
    degraded = find(got, Type.DEGRADED)
    assert degraded["status"] == "True" and got["phase"] == "Degraded"
    assert (
        "1 fetch_died (the tunefleet-fetch init container was OOMKilled (memory limit 256Mi); "
        "restarts: 0; pods: m-2)" in degraded["message"]
    )
    events = [m for r, m in w.api.events if r == Reason.PODS_UNTUNED]
    assert len(events) == 2 and any(
        "(fetch_died): the tunefleet-fetch init container was OOMKilled" in m
        and "kubectl tunefleet why m-2" in m
        for m in events
    )
    # The table keeps a Failed pod whose fetch died, and lets it go once deleted.
    table = ServedPods()
    assert table.follow("MODIFIED", fetch_status(INJECTED_POD, "Failed", state=OOM)) == ("ml", "p")
    assert [u.cause for u in table.of("ml", "p")] == [FETCH_DIED]
    assert table.follow("DELETED", table.stub("", "pod-1")) == ("ml", "p")


def test_the_table_follows_pods_in_and_out_and_says_which_profile_changed() -> None:
    table = ServedPods()
    injected = Admission(INJECTED, sha256=SHA)
    refused = FetchOutcome("untuned", reason="connection refused")
    pod = MODEL_POD.admitted(injected).obj()
    assert table.follow("ADDED", pod) is None and table.of("ml", "p") == []
    failed = MODEL_POD.admitted(injected).terminated(CONTAINER, 0, refused.line(), init=True).obj()
    assert table.follow("MODIFIED", failed) == ("ml", "p")
    assert table.follow("MODIFIED", failed) is None  # nothing new
    assert [u.pod for u in table.of("ml", "p")] == ["m"] and table.known("", "ml") == {"pod-1"}
    assert table.follow("DELETED", table.stub("", "pod-1")) == ("ml", "p")
    assert table.of("ml", "p") == [] and table.sizes() == {"untunedPods": 0}


def test_the_delivered_table_follows_names_and_uids() -> None:
    table = DeliveredConfigMaps()
    cm = copy.deepcopy(ARTIFACT_CM)
    cm["metadata"]["uid"] = "cm-1"
    assert table.follow("ADDED", cm) == ("ml", "p")
    assert table.uid_of("ml", cm["metadata"]["name"]) == "cm-1"
    # A stale DELETED of an older object of the same name does not drop the new one.
    old = {"metadata": {**cm["metadata"], "uid": "cm-0"}}
    table.follow("DELETED", old)
    assert table.uid_of("ml", cm["metadata"]["name"]) == "cm-1"
    assert table.follow("DELETED", table.stub("", "cm-1")) == ("ml", "p")
    assert table.uid_of("ml", cm["metadata"]["name"]) == ""
