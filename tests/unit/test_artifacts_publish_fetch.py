"""publish, fetch and bootstrap over the directory store (file://), as CLIs and functions.

The S3 path, same code plus boto3, is in tests/e2e/test_artifacts_s3.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.artifacts import tuner_output
from tunefleet.artifacts import fetch as fetch_mod
from tunefleet.artifacts import publish as publish_mod
from tunefleet.artifacts.bootstrap import bootstrap
from tunefleet.artifacts.publish import Output
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import Location
from tuner_job.files import sha256_hex
from tuner_job.results import count_outcomes, read_results

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]


def cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=60
    )


def publish_args(
    out: Path, store: Path, tl: Path, model: str = "AMD_Instinct_MI300X_OAM"
) -> list[str]:
    return [
        "--dir",
        str(out),
        "--uri",
        f"file://{store}",
        "--namespace",
        "ml",
        "--profile",
        "llama",
        "--gpu-model",
        model,
        "--termination-log",
        str(tl),
    ]


def test_publish_then_fetch_writes_one_verified_file_per_ordinal(tmp_path: Path) -> None:
    manifest = tuner_output(tmp_path / "out")
    store = tmp_path / "store"
    done = cli(
        "tunefleet.artifacts.publish", *publish_args(tmp_path / "out", store, tmp_path / "tl")
    )
    assert done.returncode == 0, done.stderr
    message = json.loads(done.stdout)
    assert (tmp_path / "tl").read_text().strip() == done.stdout.strip()
    sha = manifest.results_sha256
    assert message == {
        "uri": f"file://{store}/ml/llama/AMD_Instinct_MI300X_OAM/{sha}",
        "sha256": sha,
        "gemms": manifest.gemms,
        "tunedAt": manifest.tuned_at,
        "tuningSeconds": 812.5,
        "revision": "3f2a9c01de",
        "identity": manifest.identity,
        "manifestSha256": message["manifestSha256"],
        **({"outcomes": manifest.outcomes.to_dict()} if manifest.outcomes else {}),
        # A manifest without the reuse fields: nothing reused, everything tuned by one pod.
        "recorded": manifest.recorded,
        "reused": 0,
        "resumed": 0,
        "newlyTuned": manifest.gemms,
        "shards": 1,
        "librarySkipped": 0,
        "librarySkippedReason": "",
    }
    stored = store / "ml" / "llama" / "AMD_Instinct_MI300X_OAM" / sha
    assert (stored / "results.csv").read_bytes() == (tmp_path / "out" / "results.csv").read_bytes()
    assert (
        message["manifestSha256"]
        == hashlib.sha256((stored / "manifest.json").read_bytes()).hexdigest()
    )

    dest = tmp_path / "artifact"
    args = ["--uri", message["uri"], "--sha256", sha, "--dest", str(dest), "--devices", "3"]
    done = cli("tunefleet.artifacts.fetch", *args, "--gpu-model", "AMD_Instinct_MI300X_OAM")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir()) == [f"tunableop_results{i}.csv" for i in range(3)]
    for i in range(3):
        assert sha256_hex((dest / f"tunableop_results{i}.csv").read_bytes()) == sha
    outcomes = count_outcomes(read_results(stored / "results.csv"))
    counts = f"({outcomes.tuned} tuned, {outcomes.default} Default)"
    # Fetch counts tuned and Default rows as the manifest and status do, not every row as tuned.
    assert done.stdout.count("\n") == 1 and f"with {manifest.gemms} GEMMs {counts}" in done.stdout


def test_publishing_the_same_artifact_again_succeeds_without_rewriting(tmp_path: Path) -> None:
    tuner_output(tmp_path / "out")
    args = publish_args(tmp_path / "out", tmp_path / "store", tmp_path / "tl")
    first = cli("tunefleet.artifacts.publish", *args)
    again = cli("tunefleet.artifacts.publish", *args)
    assert first.returncode == again.returncode == 0, again.stderr
    assert first.stdout == again.stdout
    assert "already published" in again.stderr


def test_retuned_identical_results_keep_the_stored_manifest(tmp_path: Path) -> None:
    store = tmp_path / "store"
    tuner_output(tmp_path / "a")
    tuner_output(tmp_path / "b", revision="99aa77", tuning_seconds=3.0)
    assert (
        cli(
            "tunefleet.artifacts.publish", *publish_args(tmp_path / "a", store, tmp_path / "t")
        ).returncode
        == 0
    )
    done = cli("tunefleet.artifacts.publish", *publish_args(tmp_path / "b", store, tmp_path / "t"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["revision"] == "99aa77"  # this run's revision for the operator
    assert "kept the manifest already stored" in done.stderr


def test_a_different_object_under_the_content_key_is_an_error(tmp_path: Path) -> None:
    manifest = tuner_output(tmp_path / "out")
    store = tmp_path / "store"
    squatter = store / "ml" / "llama" / "AMD_Instinct_MI300X_OAM" / manifest.results_sha256
    squatter.mkdir(parents=True)
    (squatter / "results.csv").write_text("something else\n")
    done = cli(
        "tunefleet.artifacts.publish", *publish_args(tmp_path / "out", store, tmp_path / "tl")
    )
    assert done.returncode == 1
    assert "a different object already exists" in done.stderr
    assert (tmp_path / "tl").read_text().startswith("tunefleet-publish: error: a different object")
    assert not (squatter / "manifest.json").exists()


@pytest.mark.parametrize(
    ("tamper", "fragment"),
    [
        ("results", "is not the SHA-256 of results.csv"),
        ("namespace", "manifest namespace 'other' is not 'ml'"),
        ("gemms", "manifest says 99 GEMMs"),
        ("csv", "no Validator,PT_VERSION"),
    ],
)
def test_publish_refuses_inconsistent_output_before_uploading(
    tmp_path: Path, tamper: str, fragment: str
) -> None:
    out = tmp_path / "out"
    if tamper == "namespace":
        tuner_output(out, namespace="other")
    elif tamper == "gemms":
        tuner_output(out, gemms=99)
    else:
        tuner_output(out)
    if tamper == "results":
        with (out / "results.csv").open("a") as f:
            f.write("GemmTunableOp_float_NN,nn_8_8_8_ld_8_8_8,Default,0.1\n")
    if tamper == "csv":
        text = (out / "results.csv").read_text().replace("Validator,PT_VERSION,2.11.0\n", "")
        (out / "results.csv").write_text(text)
    done = cli(
        "tunefleet.artifacts.publish", *publish_args(out, tmp_path / "store", tmp_path / "tl")
    )
    assert done.returncode == 1
    assert fragment in done.stderr
    assert not (tmp_path / "store").exists()


def test_termination_message_stays_under_4096_bytes_by_trimming_identity(tmp_path: Path) -> None:
    identity = {"gpuName": "MI300X", "notes": "x" * 3000, "more": "y" * 2000, "arch": "gfx942"}
    manifest = tuner_output(tmp_path / "out", identity=identity)
    pub = publish_mod.Published(
        "s3://b/p/" + manifest.results_sha256, manifest.results_sha256, manifest, True, False
    )
    message = publish_mod.termination_message(pub)
    assert len(message.encode()) <= 4096
    doc = json.loads(message)
    assert doc["identity"] == {"gpuName": "MI300X", "more": "y" * 2000, "arch": "gfx942"}
    assert doc["sha256"] == manifest.results_sha256 and doc["gemms"] == manifest.gemms
    small = publish_mod.termination_message(pub, limit=560)
    assert len(small.encode()) <= 560 and json.loads(small)["identity"] == {
        "arch": "gfx942",
        "gpuName": "MI300X",
    }


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, str]:
    manifest = tuner_output(tmp_path / "out")
    store = tmp_path / "store"
    pub = publish_mod.publish(
        Output(tmp_path / "out", f"file://{store}", "ml", "llama", "AMD_Instinct_MI300X_OAM")
    )
    assert pub.created
    return Path(parse_uri(pub.uri).bucket), manifest.results_sha256


def fetch_cli(
    artifact: Path, sha: str, dest: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return cli(
        "tunefleet.artifacts.fetch",
        "--uri",
        f"file://{artifact}",
        "--sha256",
        sha,
        "--dest",
        str(dest),
        "--devices",
        "2",
        *extra,
    )


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.chmod(0o644)
    if how == "flip":
        data = data[:100] + bytes([data[100] ^ 0x01]) + data[101:]
    elif how == "truncate":
        data = data[: len(data) // 2]
    path.write_bytes(data)


@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("closed", [False, True])
def test_fetch_refuses_a_corrupted_or_truncated_object(
    tmp_path: Path, published: tuple[Path, str], how: str, closed: bool
) -> None:
    artifact, sha = published
    corrupt(artifact / "results.csv", how)
    dest = tmp_path / "dest"
    done = fetch_cli(artifact, sha, dest, *(["--fail-closed"] if closed else []))
    verb = "refusing to start" if closed else "starting untuned"
    assert done.returncode == (1 if closed else 0)
    assert done.stderr.startswith(f"tunefleet-fetch: {verb}: results.csv has SHA-256 ")
    assert done.stderr.count("\n") == 1 and "(corrupted or truncated)" in done.stderr
    assert not dest.exists() or not list(dest.iterdir())  # no partial files


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("gpu-model", "tuned on 'AMD_Instinct_MI300X_OAM', this pod runs 'NVIDIA-H200'"),
        ("manifest-sha", "manifest describes results"),
        ("manifest-garbage", "manifest is not JSON"),
        ("manifest-profile", "manifest is for ml/other/AMD_Instinct_MI300X_OAM, the URI says"),
        ("missing", "no object at file://"),
        ("wrong-pin", "does not end in the pinned SHA-256"),
        ("bad-args", "bad arguments"),
        ("bad-sha", "is not a SHA-256"),
    ],
)
def test_fetch_follows_the_policy_on_every_problem(
    tmp_path: Path, published: tuple[Path, str], case: str, fragment: str
) -> None:
    artifact, sha = published
    extra: list[str] = []
    pin = sha
    if case == "gpu-model":
        extra = ["--gpu-model", "NVIDIA-H200"]
    elif case == "manifest-sha":
        doc = json.loads((artifact / "manifest.json").read_text())
        doc["resultsSha256"] = "0" * 64
        (artifact / "manifest.json").chmod(0o644)
        (artifact / "manifest.json").write_text(json.dumps(doc))
    elif case == "manifest-profile":
        doc = json.loads((artifact / "manifest.json").read_text())
        doc["profile"] = "other"
        (artifact / "manifest.json").chmod(0o644)
        (artifact / "manifest.json").write_text(json.dumps(doc))
    elif case == "manifest-garbage":
        (artifact / "manifest.json").chmod(0o644)
        (artifact / "manifest.json").write_text("{")
    elif case == "missing":
        (artifact / "results.csv").unlink()
    elif case == "wrong-pin":
        pin = "f" * 64
    elif case == "bad-args":
        extra = ["--devices", "two"]
    elif case == "bad-sha":
        pin = "xyz"
    for closed in (False, True):
        dest = tmp_path / f"dest-{closed}"
        done = fetch_cli(artifact, pin, dest, *extra, *(["--fail-closed"] if closed else []))
        assert done.returncode == (1 if closed else 0), done.stderr
        verb = "refusing to start" if closed else "starting untuned"
        assert done.stderr.startswith(f"tunefleet-fetch: {verb}: ") and fragment in done.stderr
        assert not dest.exists() or not list(dest.iterdir())


def test_fetch_replaces_files_from_an_earlier_attempt_atomically(
    tmp_path: Path, published: tuple[Path, str]
) -> None:
    artifact, sha = published
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "tunableop_results0.csv").write_text("stale\n")
    got = fetch_mod.fetch(fetch_mod.Pinned(f"file://{artifact}", sha), dest, fetch_mod.Serving(2))
    assert [p.name for p in got.paths] == ["tunableop_results0.csv", "tunableop_results1.csv"]
    assert sorted(p.name for p in dest.iterdir()) == [
        "tunableop_results0.csv",
        "tunableop_results1.csv",
    ]
    assert all(sha256_hex(p.read_bytes()) == sha for p in got.paths)


def test_uri_parsing_and_key_layout() -> None:
    loc = parse_uri("s3://bucket/some/prefix/")
    assert loc == Location("s3", "bucket", "some/prefix")
    assert loc.key("ml", "p", "M", "abc", "results.csv") == "some/prefix/ml/p/M/abc/results.csv"
    assert loc.uri(loc.key("ml")) == "s3://bucket/some/prefix/ml"
    assert parse_uri("s3://bucket").key("ml", "results.csv") == "ml/results.csv"
    assert parse_uri("file:///srv/store").bucket == "/srv/store"
    for bad in ("http://x/y", "s3:///nobucket", "s3://b/../etc", "file://host/x"):
        with pytest.raises(ValueError):
            parse_uri(bad)


def test_bootstrap_copies_a_runnable_tuner_without_caches(tmp_path: Path) -> None:
    target = bootstrap(tmp_path / "tools")
    assert target == tmp_path / "tools" / "tuner_job"
    names = {p.name for p in target.rglob("*")}
    assert {"__init__.py", "__main__.py", "results.py", "tune.py"} <= names
    assert "__pycache__" not in names and not any(n.endswith(".pyc") for n in names)
    bootstrap(tmp_path / "tools")  # a restarted init container copies again, cleanly
    assert sorted(p.name for p in (tmp_path / "tools").iterdir()) == ["tuner_job"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "tools")
    done = subprocess.run(
        [sys.executable, "-c", "import tuner_job, sys; print(tuner_job.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == str(target / "__init__.py")
    shutil.rmtree(tmp_path / "tools")


@pytest.mark.parametrize("closed", [False, True])
def test_fetch_leaves_its_outcome_as_the_termination_message(
    tmp_path: Path, published: tuple[Path, str], closed: bool
) -> None:
    """A fail-open start exits 0, so only this file tells `kubectl describe pod` why."""
    artifact, sha = published
    log = tmp_path / "termination-log"
    bad = fetch_cli(
        artifact,
        "f" * 64,
        tmp_path / "d1",
        "--termination-log",
        str(log),
        *(["--fail-closed"] if closed else []),
    )
    verb = "refusing to start" if closed else "starting untuned"
    assert log.read_text().startswith(f"tunefleet-fetch: {verb}: ")
    assert log.read_text().strip() == bad.stderr.strip()
    good = fetch_cli(artifact, sha, tmp_path / "d2", "--termination-log", str(log))
    assert good.returncode == 0
    assert log.read_text().startswith("tunefleet-fetch: wrote 2 results file(s)")


def test_a_manifest_changed_after_publishing_is_refused_when_pinned(tmp_path: Path) -> None:
    store, tl = tmp_path / "store", tmp_path / "tl"
    tuner_output(tmp_path / "out")
    done = cli("tunefleet.artifacts.publish", *publish_args(tmp_path / "out", store, tl))
    message = json.loads(done.stdout)
    artifact = Path(message["uri"][len("file://") :])
    # Tamper with what the manifest claims, keeping it self-consistent with the results.
    doc = json.loads((artifact / "manifest.json").read_text())
    doc["identity"]["gpuName"] = "something else"
    (artifact / "manifest.json").chmod(0o644)
    (artifact / "manifest.json").write_text(json.dumps(doc))
    args = ["--uri", message["uri"], "--sha256", message["sha256"], "--dest", str(tmp_path / "d")]
    unpinned = cli("tunefleet.artifacts.fetch", *args, "--devices", "1")
    assert "wrote 1 results file" in unpinned.stdout  # what an old artifact without a pin gets
    pinned = cli(
        "tunefleet.artifacts.fetch",
        *args,
        "--devices",
        "1",
        "--manifest-sha256",
        message["manifestSha256"],
        "--fail-closed",
    )
    assert pinned.returncode == 1
    assert (
        "manifest.json has SHA-256" in pinned.stderr and "changed after publishing" in pinned.stderr
    )


def test_publish_records_the_tune_steps_image_once_the_operator_names_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    tuner_output(tmp_path / "out")
    id_file = tmp_path / "tune-image-id"
    image_id = "registry.example.com/serve@sha256:" + "e" * 64
    id_file.write_text(image_id + "\n")
    pub = publish_mod.publish(
        Output(tmp_path / "out", f"file://{store}", "ml", "llama", "AMD_Instinct_MI300X_OAM"),
        image=publish_mod.TuneImage("registry.example.com/serve:1", id_file, 5),
    )
    assert pub.manifest.image is not None and pub.manifest.image.id == image_id
    assert pub.manifest.image.digest == "sha256:" + "e" * 64
    message = json.loads(publish_mod.termination_message(pub))
    assert message["image"] == {"reference": "registry.example.com/serve:1", "id": image_id}


def test_publish_without_the_image_id_records_the_reference_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tuner_output(tmp_path / "out")
    pub = publish_mod.publish(
        Output(
            tmp_path / "out",
            f"file://{tmp_path / 'store'}",
            "ml",
            "llama",
            "AMD_Instinct_MI300X_OAM",
        ),
        image=publish_mod.TuneImage(
            "registry.example.com/serve:1", tmp_path / "never-written", 0.2
        ),
    )
    assert pub.manifest.image is not None and pub.manifest.image.id == ""
    assert "did not arrive" in capsys.readouterr().err


def test_outcomes_that_do_not_match_the_results_are_refused(tmp_path: Path) -> None:
    from tuner_job.results import Outcomes

    parsed = read_results(DATA / "rocm_results.csv")
    wrong = Outcomes(tuned=0, default=parsed.gemms)  # claims Default-only: it is not
    tuner_output(tmp_path / "out", outcomes=wrong)
    store, tl = tmp_path / "store", tmp_path / "tl"
    done = cli("tunefleet.artifacts.publish", *publish_args(tmp_path / "out", store, tl))
    assert done.returncode == 1 and "manifest outcomes" in done.stderr  # refused before upload
    # The same inconsistency put into the store by hand is refused by fetch too.
    tuner_output(tmp_path / "good")
    done = cli("tunefleet.artifacts.publish", *publish_args(tmp_path / "good", store, tl))
    message = json.loads(done.stdout)
    artifact = Path(message["uri"][len("file://") :])
    (artifact / "manifest.json").chmod(0o644)
    shutil.copy(tmp_path / "out" / "manifest.json", artifact / "manifest.json")
    got = cli(
        "tunefleet.artifacts.fetch",
        "--uri",
        message["uri"],
        "--sha256",
        message["sha256"],
        "--dest",
        str(tmp_path / "d"),
        "--devices",
        "1",
    )
    assert "manifest outcomes" in got.stderr and "differ from results.csv" in got.stderr


# --- a credentials Secret that did not reach the pod ------------------------------------------


@pytest.mark.parametrize("closed", [False, True])
def test_fetch_says_which_secret_is_missing_and_follows_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    closed: bool,
) -> None:  # fmt: skip
    from tunefleet.artifacts import fetch as fetch_mod

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    args = [
        "--uri", f"s3://bkt/p/ns/x/M/{'a' * 64}", "--sha256", "a" * 64,
        "--dest", str(tmp_path / "d"), "--devices", "1", "--credentials-secret", "s3-reader",
        "--termination-log", str(tmp_path / "log"), *(["--fail-closed"] if closed else []),
    ]  # fmt: skip
    code = fetch_mod.main(args)
    verb = "refusing to start" if closed else "starting untuned"
    said = capsys.readouterr().err
    assert code == (1 if closed else 0) and not (tmp_path / "d").exists()
    assert said.startswith(f"tunefleet-fetch: {verb}: the Secret s3-reader with the store's read")
    assert "lacks AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY" in said
    assert "spec.serving.credentialsSecret" in said
    assert (tmp_path / "log").read_text().strip() == said.strip()


def test_fetch_with_its_credentials_present_goes_on_to_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import argparse

    from tunefleet.artifacts.fetch import credentials_problem

    args = argparse.Namespace(credentials_secret="s3-reader", from_volume=None, oci_config=None)
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    assert credentials_problem(args, env) == ""
    assert "lacks AWS_SECRET_ACCESS_KEY" in credentials_problem(args, {"AWS_ACCESS_KEY_ID": "k"})
    none = argparse.Namespace(credentials_secret="", from_volume=None, oci_config=None)
    assert credentials_problem(none, {}) == ""


def test_publish_writes_the_identity_document_into_the_manifest_it_signs(tmp_path: Path) -> None:
    """The operator's identity document (from the tuning ConfigMap) is in the stored manifest
    before it is signed: the signature binds what the artifact was tuned for (fleet adoption
    compares it). One that is not there leaves the manifest without it, and publishes."""
    from tests.support.artifacts import signing_dir
    from tunefleet.artifacts import signing

    store, tl = tmp_path / "store", tmp_path / "tl"
    tuner_output(tmp_path / "out")
    doc = {"version": 1, "image": "sha256:" + "a" * 64, "tuning": {"numericalCheck": True}}
    (tmp_path / "identity.json").write_text(json.dumps(doc))
    args = publish_args(tmp_path / "out", store, tl)
    signed = [*args, "--signing-key-dir", str(signing_dir(tmp_path))]
    done = cli(
        "tunefleet.artifacts.publish", *signed, "--identity-file", str(tmp_path / "identity.json")
    )
    assert done.returncode == 0, done.stderr
    manifest = next(store.rglob("manifest.json"))
    assert json.loads(manifest.read_bytes())["fleetIdentity"] == doc
    sig = manifest.with_name("manifest.json" + signing.BLOB_SIGNATURE_SUFFIX).read_bytes()
    key = signing.load_public_key((DATA / "cosign" / "cosign.pub").read_bytes())
    assert signing.verify_blob(manifest.read_bytes(), sig, key).ok

    other = tmp_path / "other"
    tuner_output(other / "out")
    missing = cli(
        "tunefleet.artifacts.publish",
        *publish_args(other / "out", other / "store", other / "tl"),
        "--identity-file",
        str(other / "absent.json"),
    )
    assert missing.returncode == 0, missing.stderr
    assert "no fleet adopts this artifact" in missing.stderr
    assert "fleetIdentity" not in json.loads(
        next((other / "store").rglob("manifest.json")).read_bytes()
    )
