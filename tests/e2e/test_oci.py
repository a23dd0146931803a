"""oci:// stores on the local cluster, every part real: the registry is CNCF Distribution
(TLS, htpasswd identities), the key pair is made by cosign itself into a Secret, the tuning
Job and the model pods run on the real node, and cosign verifies what tunefleet signed.

The tuner is the stand-in (its torch computes nothing, and its artifact says so); what is
under test is the path of the artifact: pushed as objects and one bundle, signed, recorded by
digest, verified before it is served, refused when unsigned, signed by another key or changed
in the registry's storage, and removed by gc with its bundle and signature.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster import wait_for_real_node_gpus
from testbed.operator import InCluster
from testbed.poll import eventually
from testbed.real_node import SHAPES, model_pod, real_profile
from testbed.registry import (
    Registry,
    cosign,
    cosign_binary,
    delete_signatures,
    manifest_digest,
    manifest_json,
)
from tests.support.kube import apply, create, ended, get_json, ready, statuses
from tunefleet.artifacts import gc
from tunefleet.storage.oci import OciStore, note_tag
from tunefleet.storage.registry import open_store, parse_uri
from tunefleet.storage.store import StoreOptions

FETCH = "tunefleet-fetch"

pytestmark = pytest.mark.e2e

PASSWORD = "e2e-signing-password"


@pytest.fixture
def registry() -> Registry:
    return Registry.from_state()


def _secrets(cluster: Any, namespace: str, reg: Registry) -> None:
    apply(cluster, namespace, reg.secret("registry-writer", reg.writer))
    apply(cluster, namespace, reg.secret("registry-reader", reg.reader))
    # The key pair, as the docs say to make it: cosign writes the Secret itself.
    env = {"COSIGN_PASSWORD": PASSWORD, "KUBECONFIG": cluster.kubeconfig}
    made = cosign(
        ["generate-key-pair", f"k8s://{namespace}/signing"], {**reg.tool_env(reg.reader), **env}
    )
    assert made.returncode == 0, made.stderr
    # cosign also writes cosign.pub where it runs: in its own temporary directory, never here.
    assert not (Path(__file__).resolve().parents[2] / "cosign.pub").exists()


def _public_key(cluster: Any, namespace: str, path: Any) -> Any:
    raw = cluster.kubectl_json("get", "secret", "-n", namespace, "signing", "-o", "json")
    path.write_bytes(base64.b64decode(raw["data"]["cosign.pub"]))
    return path


def _cosign_sign(
    cluster: Any, namespace: str, registry: Registry, reference: str, legacy: bool
) -> subprocess.CompletedProcess[str]:
    """`cosign sign` with the namespace's key pair, no transparency log: cosign v3's default
    format (a Sigstore bundle, a referrer), or the legacy `.sig` tag."""
    return cosign(
        [
            "sign", "--key", "k8s://" + namespace + "/signing", "--tlog-upload=false",
            *(["--new-bundle-format=false"] if legacy else []),
            "--use-signing-config=false", "-y", reference,
        ],
        {**registry.tool_env(registry.writer), "COSIGN_PASSWORD": PASSWORD,
         "KUBECONFIG": cluster.kubeconfig},
    )  # fmt: skip


def _serve(cluster: Any, namespace: str, name: str, profile: str) -> tuple[str, str]:
    """A model pod's fetch outcome and its server's log."""
    create(cluster, namespace, model_pod(name, profile, gpus=1))
    done = ended(cluster, namespace, name, f"model pod {name} to finish")
    fetch = statuses(done)["tunefleet-fetch"]["state"]["terminated"]["message"]
    log = cluster.kubectl("logs", "-n", namespace, name, "-c", "server").stdout
    return fetch, log


def test_a_bundle_is_pushed_signed_verified_by_cosign_served_and_refused_when_forged(
    cluster: Any,
    in_cluster: InCluster,
    s3: Any,
    namespace: str,
    registry: Registry,
    tmp_path: Any,
) -> None:
    wait_for_real_node_gpus(cluster, 1)
    _secrets(cluster, namespace, registry)
    repository = f"e2e/{namespace}-{uuid.uuid4().hex[:6]}"
    profile = real_profile(
        "oci",
        s3,
        "",
        workload={"shapes": SHAPES, "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}]},
        storage={
            "uri": f"oci://{registry.host}/{repository}",
            "credentialsSecret": {"name": "registry-writer"},
            "signing": {"secret": {"name": "signing"}},
        },
        serving={"credentialsSecret": {"name": "registry-reader"}},
    )
    apply(cluster, namespace, profile)
    st = ready(cluster, namespace, "oci", timeout=300)["status"]
    assert st["phase"] == "Ready", json.dumps(st, indent=2)[:4000]
    (art,) = st["artifacts"]
    assert art["uri"].startswith(f"oci://{registry.host}/{repository}#"), art["uri"]
    bundle = art["bundle"]
    assert bundle["signed"] is True and bundle["digest"].startswith("sha256:"), art
    digest = bundle["digest"]
    reference = f"{registry.host}/{repository}@{digest}"

    # The bundle, read with curl: its layers are the artifact, by digest, with tunefleet's
    # media types and the identity annotations; the manifest object inside pins the rest.
    doc = manifest_json(registry, repository, digest)
    assert doc["artifactType"] == "application/vnd.tunefleet.bundle.v1"
    types = [layer["mediaType"] for layer in doc["layers"]]
    assert types == [
        "application/vnd.tunefleet.manifest.v1+json",
        "application/vnd.tunefleet.tunableop.results.v1+csv",
    ]
    assert doc["layers"][1]["digest"] == "sha256:" + art["sha256"]
    assert doc["layers"][0]["digest"] == "sha256:" + art["manifestSha256"]
    assert doc["annotations"]["io.tunefleet.gpu-model"] == art["gpuModel"]

    # cosign, knowing nothing of tunefleet, accepts the signature with the Secret's key...
    pub = _public_key(cluster, namespace, tmp_path / "cosign.pub")
    check = ["verify", "--key", str(pub), "--insecure-ignore-tlog=true", reference]
    verified = cosign(check, registry.tool_env(registry.reader))
    assert verified.returncode == 0, verified.stderr
    assert digest in verified.stdout

    # No publicKey in the spec: the operator cannot check a signature, so it mounts nothing;
    # and the profile's one public key is the spec's, so a pod has nothing to verify with and
    # is served nothing (it read the Secret's cosign.pub before: a second key source).
    assert art["delivery"].startswith("Store:") and "publicKey" in art["delivery"], art
    fetch, _ = _serve(cluster, namespace, "no-key", "oci")
    assert "starting untuned: bundle not served" in fetch, fetch
    assert "set spec.storage.signing.publicKey" in fetch, fetch
    # The key given (a storage field: no new revision, nothing retuned); pods kept fetching,
    # so what fetch checks is checked below.
    key = {"storage": {"signing": {"publicKey": pub.read_text()}}, "serving": {"delivery": "Store"}}
    cluster.kubectl("patch", "tp", "-n", namespace, "oci", "--type", "merge", "-p",
                    json.dumps({"spec": key}))  # fmt: skip
    eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "oci")["status"]["artifacts"][0],
        lambda a: a.get("delivery") == "Store (spec.serving.delivery)",
        "the operator to act on the patched spec",
        timeout=60,
    )

    # ... and a model pod is served the bundle, by digest, after the same check.
    fetch, log = _serve(cluster, namespace, "served", "oci")
    assert "wrote 1 results file(s)" in fetch, fetch
    assert "PYTORCH_TUNABLEOP_ENABLED=1" in log, log

    # Signed by another key only: cosign refuses it, so does tunefleet, and the pod starts
    # untuned (failClosed is false), saying why.
    delete_signatures(registry, repository, digest)  # tunefleet's, in both formats
    other, env = _other_key_pair(registry, tmp_path)
    signed = cosign(
        [
            "sign", "--key", str(other / "cosign.key"), "--tlog-upload=false",
            "--new-bundle-format=false", "--use-signing-config=false", "-y", reference,
        ],
        env,
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    assert cosign(check, registry.tool_env(registry.reader)).returncode != 0
    fetch, _ = _serve(cluster, namespace, "other-key", "oci")
    assert "bundle not served" in fetch and "signed by another key" in fetch, fetch

    # Unsigned: refused, named.
    delete_signatures(registry, repository, digest)
    fetch, _ = _serve(cluster, namespace, "unsigned", "oci")
    assert "bundle not served" in fetch and "is not signed" in fetch, fetch

    # Signed by the right key with cosign v3's own defaults: a Sigstore bundle (a referrer,
    # found through the referrers API or its sha256-<hex> tag fallback), no legacy .sig at
    # all. Served (no Rekor here: the transparency log is off, the format is cosign's default).
    bundle_only = _cosign_sign(cluster, namespace, registry, reference, legacy=False)
    assert bundle_only.returncode == 0, bundle_only.stderr
    fetch, _ = _serve(cluster, namespace, "v3-bundle", "oci")
    assert "wrote 1 results file(s)" in fetch, fetch
    delete_signatures(registry, repository, digest)

    # Signed again by the right key (cosign, this time), then a layer changed in the registry's
    # own storage: the bytes no longer match the digest the bundle names, and are refused.
    resigned = _cosign_sign(cluster, namespace, registry, reference, legacy=True)
    assert resigned.returncode == 0, resigned.stderr
    fetch, _ = _serve(cluster, namespace, "resigned", "oci")
    assert "wrote 1 results file(s)" in fetch, fetch
    # Blobs are shared by every repository of the registry (the same results tuned again are
    # the same blob): put the bytes back whatever happens.
    blob = registry.blob_path(doc["layers"][1]["digest"])
    original = blob.read_bytes()
    try:
        blob.write_bytes(original + b"\n")
        fetch, _ = _serve(cluster, namespace, "tampered", "oci")
    finally:
        blob.write_bytes(original)
    assert "does not match its digest" in fetch, fetch

    # The profile gone, tunefleet-gc's rules delete its artifact: each object, and with its
    # manifest the bundle, the volume image and their signatures.
    cluster.kubectl("delete", "tp", "-n", namespace, "oci", "--wait=true")
    location = parse_uri(art["uri"].split("#", 1)[0])
    store = open_store(location, StoreOptions(timeout_s=60, oci_config=str(registry.writer)))
    docs = gc.read_profiles(cluster.kubeconfig, None, [namespace])
    plan = gc.collect(store, location, docs, gc.Rules(0, 0.0), [namespace])
    gc.apply(plan, store, lambda line: None)
    # The GEMM library's entry stays (it is the fleet's, compacted by its own rules).
    left = [o.key for o in store.list("", 100) if "/_library/" not in o.key]
    assert left == [], left
    for image in (digest, art["bundle"].get("volume") or digest):
        tag = image.replace(":", "-", 1)  # its signatures: the .sig, the referrers' index
        for ref in (image, tag + ".sig", tag):
            assert manifest_digest(registry, repository, ref) is None, ref


def _other_key_pair(reg: Registry, tmp_path: Any) -> tuple[Any, dict[str, str]]:
    """A second key pair, by cosign, in a directory of its own; and the env to sign with it."""
    other = tmp_path / "other"
    other.mkdir()
    env = {**reg.tool_env(reg.writer), "COSIGN_PASSWORD": "other"}
    made = subprocess.run(
        [cosign_binary(), "generate-key-pair"], cwd=other, env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    return other, env


# A serving stack's first run fills the cache its variable names (the generic `cache` kind):
# an index, and a 2 MiB kernel blob (past ocibundle.LINK_MIN_BYTES: served from an image
# volume as a link into it, not a copy).
BIG = bytes(range(256)) * 8192
STACK_TUNES = (
    "import json, os; d = os.environ['STACK_CACHE']; "
    "open(os.path.join(d, 'kernels.json'), 'w').write(json.dumps({'best': 'tile-128x64'})); "
    "open(os.path.join(d, 'big.bin'), 'wb').write(bytes(range(256)) * 8192)"
)
# The stack reads both, adds a file, and replaces the blob as stacks write their caches (a
# new file renamed over the old one): the pod's directory stays its own.
STACK_SERVES = (
    'standin-server --once && cat "$STACK_CACHE/kernels.json" && echo && '
    'echo "big: $(readlink "$STACK_CACHE/big.bin") $(sha256sum < "$STACK_CACHE/big.bin")" && '
    'touch "$STACK_CACHE/added-at-start" && echo newer > "$STACK_CACHE/big.tmp" && '
    'mv "$STACK_CACHE/big.tmp" "$STACK_CACHE/big.bin" && '
    'grep -q newer "$STACK_CACHE/big.bin" && echo "cache writable"'
)


def _volume_profile(
    name: str, s3: Any, reg: Registry, repository: str, public_key: str, **over: Any
) -> Any:
    spec: dict[str, Any] = {
        "workload": {"shapes": SHAPES, "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}]},
        "storage": {
            "uri": f"oci://{reg.host}/{repository}",
            "credentialsSecret": {"name": "registry-writer"},
            "signing": {"secret": {"name": "signing"}, "publicKey": public_key},
        },
        "serving": {"credentialsSecret": {"name": "registry-reader"}},
    }
    return real_profile(name, s3, "", **{**spec, **over})


def _delivery(cluster: Any, namespace: str, name: str, prefix: str) -> dict[str, Any]:
    got = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, name),
        lambda p: str(
            ((p.get("status") or {}).get("artifacts") or [{}])[0].get("delivery", "")
        ).startswith(prefix),
        f"{name}'s delivery to start with {prefix!r}",
        timeout=120,
        interval=1,
    )
    art: dict[str, Any] = got["status"]["artifacts"][0]
    return art


def _volume_ready(
    cluster: Any,
    namespace: str,
    s3: Any,
    registry: Registry,
    tmp_path: Any,
    name: str,
    **over: Any,
) -> tuple[str, str, dict[str, Any]]:
    """A signed oci:// profile of its own repository, Ready, its artifact delivered as an image
    volume: (the public key, the repository, the artifact as status shows it)."""
    wait_for_real_node_gpus(cluster, 1)
    _secrets(cluster, namespace, registry)
    public_key = _public_key(cluster, namespace, tmp_path / "cosign.pub").read_text()
    repository = f"e2e/{namespace}-{uuid.uuid4().hex[:6]}"
    apply(cluster, namespace, _volume_profile(name, s3, registry, repository, public_key, **over))
    st = ready(cluster, namespace, name, timeout=300)["status"]
    assert st["phase"] == "Ready", json.dumps(st, indent=2)[:4000]
    return public_key, repository, _delivery(cluster, namespace, name, "ImageVolume")


def test_a_verified_volume_image_is_mounted_by_digest_and_a_wrongly_signed_one_never(
    cluster: Any,
    in_cluster: InCluster,
    s3: Any,
    namespace: str,
    registry: Registry,
    tmp_path: Any,
) -> None:
    public_key, repository, art = _volume_ready(cluster, namespace, s3, registry, tmp_path, "vol")
    volume = art["bundle"]["volume"]
    reference = f"{registry.host}/{repository}@{volume}"
    # What pods will mount, cosign accepts too (tunefleet signed the volume image as well).
    pub = tmp_path / "cosign.pub"
    check = ["verify", "--key", str(pub), "--insecure-ignore-tlog=true", reference]
    assert cosign(check, registry.tool_env(registry.reader)).returncode == 0

    create(cluster, namespace, model_pod("mounted", "vol", gpus=2))
    done = ended(cluster, namespace, "mounted", "the image-volume pod to finish")
    spec = done["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "tunefleet-results"]
    assert vol["image"] == {"reference": reference, "pullPolicy": "IfNotPresent"}
    assert {"name": "registry-reader"} in spec["imagePullSecrets"]
    # Nothing runs before the model: what the operator verified is what is mounted.
    assert not [c for c in spec.get("initContainers") or [] if c["name"].startswith("tunefleet")]
    log = cluster.kubectl("logs", "-n", namespace, "mounted", "-c", "server").stdout
    assert done["status"]["phase"] == "Succeeded", log
    assert "results ordinal 0: /tunefleet/results/tunableop_results0.csv" in log, log
    assert "results ordinal 1: /tunefleet/results/tunableop_results1.csv" in log, log
    assert "PYTORCH_TUNABLEOP_TUNING=0" in log, log

    # Results and a cache in one volume image: the results mounted in place, the cache copied
    # by fetch from the mounted volume into the pod's writable directory (no download).
    cached = _volume_profile(
        "vol-cache", s3, registry, repository, public_key,
        workload={
            "command": ["python3", "-c", STACK_TUNES], "shapes": SHAPES,
            "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}],
        },
        artifacts={"caches": [{"kind": "cache", "name": "stack", "env": "STACK_CACHE"}]},
    )  # fmt: skip
    apply(cluster, namespace, cached)
    st = ready(cluster, namespace, "vol-cache", timeout=300)["status"]
    assert st["phase"] == "Ready", json.dumps(st, indent=2)[:4000]
    _delivery(cluster, namespace, "vol-cache", "ImageVolume")
    pod = model_pod("mounted-cache", "vol-cache", gpus=1)
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", STACK_SERVES]
    create(cluster, namespace, pod)
    done = ended(cluster, namespace, "mounted-cache", "the image-volume pod with a cache")
    log = cluster.kubectl("logs", "-n", namespace, "mounted-cache", "-c", "server").stdout
    assert done["status"]["phase"] == "Succeeded", log
    assert [v for v in done["spec"]["volumes"] if "image" in v], done["spec"]["volumes"]
    fetch = statuses(done)["tunefleet-fetch"]["state"]["terminated"]["message"]
    assert "caches stack unpacked to /tunefleet/caches" in fetch, fetch
    assert '{"best": "tile-128x64"}' in log and "cache writable" in log, log
    # The blob is the volume's own bytes, read through a link: nothing of it was copied.
    big = (
        f"/tunefleet/volume/.tunefleet/caches/stack/data/big.bin {hashlib.sha256(BIG).hexdigest()}"
    )
    assert f"big: {big}" in log, log
    fetch_log = cluster.kubectl("logs", "-n", namespace, "mounted-cache", "-c", FETCH).stdout
    copied = re.search(
        r"caches (\d+) bytes in the image volume: (\d+) copied, (\d+) linked", fetch_log
    )
    assert copied and int(copied.group(3)) == len(BIG), fetch_log
    assert "results ordinal 0: /tunefleet/results/tunableop_results0.csv" in log, log

    # Asked for copies (a stack that rewrites a big file in place): the blob is the pod's own.
    pod = model_pod("copied-cache", "vol-cache", gpus=1)
    pod["metadata"]["annotations"] = {"tunefleet.io/caches-copy": "true"}
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", STACK_SERVES]
    create(cluster, namespace, pod)
    done = ended(cluster, namespace, "copied-cache", "the pod that asked for copies")
    log = cluster.kubectl("logs", "-n", namespace, "copied-cache", "-c", "server").stdout
    assert done["status"]["phase"] == "Succeeded", log
    assert f"big:  {hashlib.sha256(BIG).hexdigest()}" in log and "cache writable" in log, log

    # A profile whose publicKey is another key's: the operator cannot verify what the tuning
    # Job signed, so no pod mounts it; its pods fetch instead (and check with the Secret's key).
    other, _ = _other_key_pair(registry, tmp_path)
    wrong = _volume_profile(
        "vol-other-key", s3, registry, repository, (other / "cosign.pub").read_text()
    )
    apply(cluster, namespace, wrong)
    assert ready(cluster, namespace, "vol-other-key", timeout=300)["status"]["phase"] == "Ready"
    refused = _delivery(cluster, namespace, "vol-other-key", "Store:")
    assert "volume image not mounted" in refused["delivery"], refused
    assert "signed by another key" in refused["delivery"], refused
    create(cluster, namespace, model_pod("not-mounted", "vol-other-key", gpus=1))
    done = ended(cluster, namespace, "not-mounted", "the other-key pod to finish")
    assert not [v for v in done["spec"]["volumes"] if "image" in v], done["spec"]["volumes"]


def _admitted(cluster: Any, namespace: str, name: str, profile: str) -> dict[str, Any]:
    """A model pod as the webhook admitted it (spec and annotations), then deleted: the
    admission is the subject, not the run."""
    create(cluster, namespace, model_pod(name, profile, gpus=1))
    pod: dict[str, Any] = get_json(cluster, "pod", "-n", namespace, name)
    cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
    return pod


def _mounted(pod: dict[str, Any]) -> list[str]:
    return [v["image"]["reference"] for v in pod["spec"].get("volumes") or [] if "image" in v]


def test_admission_mounts_no_volume_image_on_the_status_word_and_follows_the_key(
    cluster: Any,
    in_cluster: InCluster,
    s3: Any,
    namespace: str,
    registry: Registry,
    tmp_path: Any,
) -> None:
    """Issue 40: admission mounted any digest of the repository that status called an
    ImageVolume, and the operator's verdict was kept 300 s by the artifact's SHA-256 alone, so
    a changed key or a removed signature reached new pods minutes later. Now admission mounts
    a digest only on a verdict for exactly that digest, the spec's key and policy."""
    public_key, repository, art = _volume_ready(cluster, namespace, s3, registry, tmp_path, "guard")
    volume, bundle = art["bundle"]["volume"], art["bundle"]["digest"]
    good = f"{registry.host}/{repository}@{volume}"
    assert _mounted(_admitted(cluster, namespace, "honest", "guard")) == [good]

    # A forged status: the bundle's digest (signed by the same key, but not this artifact's
    # volume image) written as the volume. No pod mounts it, whatever the operator does next.
    patch = [{"op": "replace", "path": "/status/artifacts/0/bundle/volume", "value": bundle}]
    cluster.kubectl("patch", "tp", "-n", namespace, "guard", "--subresource=status",
                    "--type=json", "-p", json.dumps(patch))  # fmt: skip
    for i in range(3):
        mounted = _mounted(_admitted(cluster, namespace, f"forged-{i}", "guard"))
        assert all(bundle not in m for m in mounted), mounted

    # The key changed under the Ready profile: the next pod the webhook admits with it mounts
    # nothing, and its fetch refuses what the old key signed.
    other, _ = _other_key_pair(registry, tmp_path)
    key = {"spec": {"storage": {"signing": {"publicKey": (other / "cosign.pub").read_text()}}}}
    cluster.kubectl("patch", "tp", "-n", namespace, "guard", "--type", "merge", "-p",
                    json.dumps(key))  # fmt: skip
    tries = iter(range(100))

    def with_new_key() -> dict[str, Any]:
        return _admitted(cluster, namespace, f"rekeyed-{next(tries)}", "guard")

    def sees_new_key(pod: dict[str, Any]) -> bool:
        fetch = [c for c in pod["spec"].get("initContainers") or [] if c["name"] == FETCH]
        env = {e["name"]: e.get("value") for c in fetch for e in c.get("env") or []}
        return (
            env.get("TUNEFLEET_VERIFY_KEY", "").strip()
            == key["spec"]["storage"]["signing"]["publicKey"].strip()
        )

    rekeyed = eventually(with_new_key, sees_new_key, "a pod admitted under the new key",
                         timeout=60, interval=1)  # fmt: skip
    assert _mounted(rekeyed) == [], rekeyed["spec"]["volumes"]
    create(cluster, namespace, model_pod("rekeyed-run", "guard", gpus=1))
    done = ended(cluster, namespace, "rekeyed-run", "the pod under the new key")
    fetch = statuses(done)[FETCH]["state"]["terminated"]["message"]
    assert "bundle not served" in fetch and "signed by another key" in fetch, fetch

    # The key back; then the volume's signature removed from the registry: within the
    # verdicts' 60 s, new pods stop mounting it (they fetch the bundle, verified, instead).
    back = {"spec": {"storage": {"signing": {"publicKey": public_key}}}}
    cluster.kubectl("patch", "tp", "-n", namespace, "guard", "--type", "merge", "-p",
                    json.dumps(back))  # fmt: skip
    delete_signatures(registry, repository, volume)
    start = time.monotonic()
    tries = iter(range(200))
    eventually(
        lambda: _admitted(cluster, namespace, f"unsigned-{next(tries)}", "guard"),
        lambda pod: _mounted(pod) == [],
        "new pods to stop mounting the unsigned volume image",
        timeout=150,
        interval=5,
    )
    print(
        f"signature removed: new pods stopped mounting the volume after {time.monotonic() - start:.0f}s"
    )


def test_a_pod_that_cannot_pull_its_volume_image_is_counted_degraded(
    cluster: Any,
    in_cluster: InCluster,
    s3: Any,
    namespace: str,
    registry: Registry,
    tmp_path: Any,
) -> None:
    """Issue 40: a model pod admitted with an image volume that its node cannot pull (here its
    pull Secret, the serving Secret, is missing from the namespace) waits for it for good;
    Degraded did not count it. Now it does, with the kubelet's reason."""
    _volume_ready(cluster, namespace, s3, registry, tmp_path, "unpulled",
                  serving={"credentialsSecret": {"name": "no-such-puller"}})  # fmt: skip
    create(cluster, namespace, model_pod("stuck", "unpulled", gpus=1))
    degraded = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "unpulled")["status"],
        lambda st: any(
            c["type"] == "Degraded" and c["status"] == "True" for c in st.get("conditions") or []
        ),
        "the profile Degraded by the pod that cannot pull its volume image",
        timeout=180,
        interval=2,
    )
    cond = next(c for c in degraded["conditions"] if c["type"] == "Degraded")
    assert "volume_not_pulled" in cond["message"] and "stuck" in cond["message"], cond
    assert "ImagePullBackOff" in cond["message"] or "ErrImagePull" in cond["message"], cond
    assert degraded["phase"] == "Degraded"


def test_a_board_lists_one_group_by_tag_pages_and_skips_notes_moved_onto_its_tags(
    registry: Registry,
) -> None:
    """The board fleet claims use on a registry (storage.Board), on Distribution itself."""
    store = OciStore(
        parse_uri(f"oci://{registry.host}/e2e/board-{uuid.uuid4().hex[:8]}"), config=registry.writer
    )
    store.page_size = 2  # several pages, each asked from the group's first tag on
    store.put("a/object", b"not a note", "text/plain")
    for member in ("m1", "m2", "m3"):
        store.post("g1", member, member.encode())
    store.post("g2", "m1", b"another group's")
    assert sorted(store.notes("g1", 100)) == [b"m1", b"m2", b"m3"]
    assert store.notes("g1", 1) == []  # each over max_bytes: skipped, not read
    # Someone who can push moves g2's note under a tag of g1's: it names g2, and is skipped.
    found = store.manifest(note_tag("g2", "m1"))
    assert found is not None
    store.push_manifest(found[0], note_tag("g1", "m4"))
    assert sorted(store.notes("g1", 100)) == [b"m1", b"m2", b"m3"]
    store.post("g1", "m2", b"m2 again")  # a member replaces its own note
    store.unpost("g1", "m1")
    store.unpost("g1", "m1")  # already gone: fine
    assert sorted(store.notes("g1", 100)) == [b"m2 again", b"m3"]
    assert store.notes("g2", 100) == [b"another group's"]
