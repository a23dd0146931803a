"""How tunefleet's containers in a pod reach the profile's artifact store: the one place where
the profile's storage settings meet the operator's defaults (credentials Secret, endpoint);
the backend (storage/registry.py) turns them into env, flags, volumes and mounts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from tunefleet.api import TuningProfileSpec
from tunefleet.artifacts import signing
from tunefleet.config import Config
from tunefleet.contracts import sign_request as sr
from tunefleet.contracts import store_broker as sb
from tunefleet.storage import registry
from tunefleet.storage.store import PodStorage


def pod_storage(
    spec: TuningProfileSpec, config: Config, *, read_only: bool = False, serving: bool = False
) -> PodStorage:
    """`serving`: for a model pod's fetch: the read-only credentials (spec.serving's, else the
    operator's default serving Secret, else the pod's cloud identity), never the publish ones."""
    storage = spec.storage
    if serving:
        chosen = spec.serving.credentials_secret
        secret = chosen.name if chosen else config.default_serving_credentials_secret
    else:
        chosen = storage.credentials_secret
        secret = chosen.name if chosen else config.default_credentials_secret
    got = registry.pod_storage(
        storage.uri,
        read_only=read_only,
        secret=secret,
        endpoint=storage.endpoint or config.default_s3_endpoint,
        region=storage.region or "",
    )
    if not serving:
        return got
    extra = signing_storage(spec, serving=True)
    return replace(
        got,
        args=[*got.args, *extra.args],
        env=[*got.env, *extra.env],
        volumes=[*got.volumes, *extra.volumes],
        mounts=[*got.mounts, *extra.mounts],
    )


# Where a pod's tunefleet container finds the signing Secret's keys (artifacts/signing.py).
SIGNING_VOLUME = "tunefleet-signing"
SIGNING_DIR = "/tunefleet/signing"


# The public key a model pod's fetch verifies with: spec.storage.signing.publicKey, the one
# source of it (the operator verifies volume images with the same), passed by value.
VERIFY_KEY_ENV = "TUNEFLEET_VERIFY_KEY"


# The operator's endpoint CA, for the publish step that asks it for a signature (by value).
SIGN_CA_ENV = "TUNEFLEET_SIGN_CA"
# The signing token's lifetime: the kubelet renews it at 80% of it; the API server's floor is
# 10 minutes.
SIGN_TOKEN_SECONDS = 3600


def operator_signs(spec: TuningProfileSpec, config: Config) -> bool:
    """Whether the operator signs this profile's artifacts (its key in the operator's
    namespace, the chart's signing.secret) rather than a key pair mounted in the Job: for
    stores that sign, when the operator holds a key and pods can reach it; on oci://, when
    it can also read the registry (delivery.oci.credentialsSecret), to check each image it
    signs."""
    return (
        bool(config.signing_key_dir and config.capture_url)
        and (not spec.storage.is_oci or bool(config.oci_config))
        and spec.storage.signing_policy is not None
    )


# The broker's CA, for the sync and publish steps (by value; apart from SIGN_CA_ENV, which
# publish gets too).
BROKER_CA_ENV = "TUNEFLEET_BROKER_CA"


def brokers(spec: TuningProfileSpec, config: Config) -> bool:
    """Whether the tuning Job reaches the store through the operator's broker, holding no
    credential of it: stores of profiles the operator signs for, when it holds a publish
    identity for the profile's store: s3:// for its endpoint (the chart's
    signing.storeCredentialsSecret), oci:// for its registry host (the chart's
    signing.registryCredentialsSecret). A profile that names another keeps its Secret."""
    if not operator_signs(spec, config):
        return False
    if spec.storage.is_oci:
        return urlsplit(spec.storage.uri).netloc in config.registry_broker_hosts
    return (
        config.store_broker
        and spec.storage.is_s3
        and sb.presigns_for(spec.storage.endpoint, config.default_s3_endpoint)
    )


def _to_the_operator(
    config: Config, flag: str, ca_env: str, volume: str, token_path: str, audience: str
) -> PodStorage:
    """A step's way to one of the operator's routes: its URL (`--<flag>-url`), address and CA
    by value, and a projected token of `audience` at `token_path`, in volume `volume` (each
    route has its own audience: a token is good for that route alone)."""
    args = [
        f"--{flag}-url", config.capture_url, f"--{flag}-token-file", token_path,
        *([f"--{flag}-address", config.capture_address] if config.capture_address else []),
    ]  # fmt: skip
    env = []
    if config.capture_ca:
        args += [f"--{flag}-ca-env", ca_env]
        env.append({"name": ca_env, "value": config.capture_ca})
    directory, _, name = token_path.rpartition("/")
    token = {"audience": audience, "expirationSeconds": SIGN_TOKEN_SECONDS, "path": name}
    projected = {"defaultMode": 0o444, "sources": [{"serviceAccountToken": token}]}
    mount = {"name": volume, "mountPath": directory, "readOnly": True}
    return PodStorage(
        args=args, env=env, volumes=[{"name": volume, "projected": projected}], mounts=[mount]
    )


def broker_storage(config: Config) -> PodStorage:
    """The tuning pod's way to its store with no credential (contracts/store_broker.py),
    mounted by the sync and publish steps."""
    token = f"{sb.TOKEN_DIR}/{sb.TOKEN_FILE}"
    return _to_the_operator(config, "broker", BROKER_CA_ENV, sb.TOKEN_VOLUME, token, sb.AUDIENCE)


def remote_signing(spec: TuningProfileSpec, config: Config) -> PodStorage:
    """The publish (merge) step's way to the operator's signature (contracts/sign_request.py),
    mounted in that step alone, and the profile's public key by value, to check the answer."""
    token = f"{sr.TOKEN_DIR}/{sr.TOKEN_FILE}"
    to = _to_the_operator(config, "sign", SIGN_CA_ENV, sr.TOKEN_VOLUME, token, sr.AUDIENCE)
    if not spec.storage.public_key:
        return to
    args = [*to.args, "--sign-public-key-env", VERIFY_KEY_ENV]
    env = [*to.env, {"name": VERIFY_KEY_ENV, "value": spec.storage.public_key}]
    return replace(to, args=args, env=env)


def signing_storage(
    spec: TuningProfileSpec, *, serving: bool, config: Config | None = None
) -> PodStorage:
    """Signing: model pods' fetch gets the public key from the spec (by value: it is public)
    and whether a signature is required; the tuning Job's publish step the way to the
    operator's signature where the operator signs (`config`), else the signing Secret's key
    pair, to sign with. Empty where nothing is signed."""
    policy, secret = spec.storage.signing_policy, spec.storage.signing_secret
    if not serving and config is not None and operator_signs(spec, config):
        return remote_signing(spec, config)
    if serving:
        if policy is None:
            return PodStorage()
        key = spec.storage.public_key
        args = ["--verify-key-env", VERIFY_KEY_ENV] if key else []
        args += ["--require-signature"] if policy == "Required" else []
        env = [{"name": VERIFY_KEY_ENV, "value": key}] if key else []
        return PodStorage(args=args, env=env)
    if policy is None or not secret:
        return PodStorage()
    items = [{"key": k, "path": k} for k in (signing.PRIVATE_KEY, signing.PASSWORD)]
    args = ["--signing-key-dir", SIGNING_DIR]
    volume = {
        "name": SIGNING_VOLUME,
        "secret": {"secretName": secret, "items": items, "defaultMode": 0o444},
    }
    mount = {"name": SIGNING_VOLUME, "mountPath": SIGNING_DIR, "readOnly": True}
    return PodStorage(args=args, volumes=[volume], mounts=[mount])


def with_storage(container: dict[str, Any], storage: PodStorage) -> dict[str, Any]:
    """The container, given the store: its flags after the command, env, mounts."""
    container["command"] = [*container["command"], *storage.args]
    if storage.env:
        container["env"] = [*(container.get("env") or []), *storage.env]
    container["volumeMounts"] = [*container.get("volumeMounts", []), *storage.mounts]
    return container
