"""Whether the operator signs a manifest a publishing pod sends it, and what it attests: pure.

The key never leaves the operator, so what it signs must be what it can vouch for. Every fact
comes from the API server (the caller's pod, the pod's Job, the profile), never from the body:

1. the token's very pod (runtime/pod_tokens.the_callers_pod);
2. in that pod, the signing token is in one volume and mounted by one container only,
   tunefleet's publish (or merge) step in tunefleet's own image; no container can reach
   another's files (shareProcessNamespace, hostPID) and none has the ServiceAccount's token
   (to ask for another): user code in the pod never holds one;
3. the pod's controller is a Job of that uid, labelled and named as the operator names its own
   tuning (or merge) Jobs for the profile, and owned by the profile of that uid: a Job someone
   else made with our labels is not ours;
4. the manifest is of that profile, GPU model and revision, and carries the identity document
   the operator computes for them now (naming.identity_document; none for a retune): a profile
   changed since the Job was made gets no signature for the old spec's output.

The attestation names the cluster, profile, GPU model, Job and time, and binds the manifest's
and the identity's SHA-256: what the signature says beyond the manifest's own words.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from tunefleet import KIND, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts.sign_request import (
    AUDIENCE,
    TOKEN_VOLUME,
    Attestation,
    identity_sha256,
)
from tunefleet.runtime.pod_tokens import Caller, Denied, the_callers_pod
from tuner_job.manifest import Manifest, ManifestError, loads


@dataclass(frozen=True)
class TokenRule:
    """Who in a pod may hold one of the operator's tokens: its volume and audience, the
    steps (container name: its command's first word) that may mount it, in tunefleet's image,
    at most `most` of them, and per Job role the steps it may be."""

    what: str  # in messages: "signing", "store"
    volume: str
    audience: str
    steps: dict[str, str]
    most: int
    roles: dict[str, frozenset[str]]


# The steps that may hold the signing token, and the command each runs (builders/job.py).
SIGNING = TokenRule(
    what="signing",
    volume=TOKEN_VOLUME,
    audience=AUDIENCE,
    steps={"publish": "tunefleet-publish", "merge": "tunefleet-merge"},
    most=1,
    roles={"tune": frozenset({"publish"}), "merge": frozenset({"merge"})},
)


def _refuse(message: str) -> Denied:
    return Denied(403, "forbidden", message)


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c
        for key in ("initContainers", "containers", "ephemeralContainers")
        for c in spec.get(key) or []
        if isinstance(c, dict)
    ]


def token_holders(pod: dict[str, Any], image: str, rule: TokenRule) -> frozenset[str]:
    """The containers of `pod` that mount the rule's token (their names), when each is one of
    its steps in tunefleet's `image`, and no container can reach another's files; Denied
    otherwise."""
    spec = pod.get("spec") or {}
    where = f"pod {(pod.get('metadata') or {}).get('name', '')}"
    if spec.get("shareProcessNamespace") or spec.get("hostPID"):
        raise _refuse(f"{where} shares its processes: another container could read the token")
    if spec.get("automountServiceAccountToken") is not False:
        # Its ServiceAccount's token in every container: user code could ask the API server
        # for a token of the operator's audience, wherever RBAC lets it.
        raise _refuse(f"{where} mounts its ServiceAccount's token")
    for volume in spec.get("volumes") or []:
        sources = ((volume or {}).get("projected") or {}).get("sources") or []
        ours = any(((s or {}).get("serviceAccountToken") or {}).get("audience") == rule.audience
                   for s in sources)  # fmt: skip
        if ours and volume.get("name") != rule.volume:
            raise _refuse(f"{where}: volume {volume.get('name')} holds a {rule.what} token too")
    holders = [
        c
        for c in _containers(spec)
        if any(m.get("name") == rule.volume for m in c.get("volumeMounts") or [])
    ]
    if not 1 <= len(holders) <= rule.most:
        names = ", ".join(str(c.get("name")) for c in holders) or "none"
        raise _refuse(
            f"{where}: the {rule.what} token must be mounted by at most {rule.most} of "
            f"tunefleet's steps (got: {names})"
        )
    for step in holders:
        name = str(step.get("name") or "")
        command = step.get("command") or []
        if name not in rule.steps or not command or command[0] != rule.steps[name]:
            raise _refuse(
                f"{where}: container {name} mounts the {rule.what} token and is not "
                f"tunefleet's {' or '.join(rule.steps)} step"
            )
        if step.get("image") != image:
            raise _refuse(
                f"{where}: container {name} runs {step.get('image')}, not tunefleet's image {image}"
            )
    return frozenset(str(c.get("name")) for c in holders)


def signing_step(pod: dict[str, Any], image: str) -> str:
    """The one container of `pod` that mounts the signing token (its name), when it is
    tunefleet's publish or merge step in tunefleet's `image`; Denied otherwise."""
    return next(iter(token_holders(pod, image, SIGNING)))


def _controller(meta: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") == kind:
            return ref
    return None


def job_of(pod: dict[str, Any]) -> tuple[str, str]:
    """The name and uid of the Job that controls `pod`; Denied when none does."""
    ref = _controller(pod.get("metadata") or {}, "Job")
    if ref is None or not ref.get("name") or not ref.get("uid"):
        raise _refuse("the pod is not controlled by a Job")
    return str(ref["name"]), str(ref["uid"])


@dataclass(frozen=True)
class Seen:
    """What the API server says of a signing request: the token's caller, its pod, the pod's
    Job and the profile the Job names (None: not found)."""

    caller: Caller
    pod: dict[str, Any] | None
    job: dict[str, Any] | None
    profile: dict[str, Any] | None


@dataclass(frozen=True)
class Vouched:
    """The Job a request comes from, as checked: the profile's spec and what the Job tunes."""

    spec: TuningProfileSpec
    name: str
    profile_uid: str
    model: str
    revision: str
    job: str
    job_uid: str


def the_job(seen: Seen, image: str, rule: TokenRule = SIGNING) -> Vouched:
    """The caller's Job, when it is one the operator made for the profile and the token's
    holders are steps that the rule lets a Job of its role have; Denied with what is wrong
    otherwise."""
    caller = seen.caller
    pod = the_callers_pod(caller, seen.pod)
    steps = token_holders(pod, image, rule)
    job_name, job_uid = job_of(pod)
    jmeta = (seen.job or {}).get("metadata") or {}
    if jmeta.get("uid") != job_uid or jmeta.get("namespace") != caller.namespace:
        raise _refuse(f"Job {caller.namespace}/{job_name} (uid {job_uid}) no longer exists")
    labels = jmeta.get("labels") or {}
    name = str(labels.get(naming.TUNING_PROFILE_LABEL) or "")
    profile_uid = str(labels.get(naming.PROFILE_UID_LABEL) or "")
    model = str(labels.get(naming.MODEL_LABEL) or "")
    revision = str(labels.get(naming.REVISION_LABEL) or "")
    role = str(labels.get(naming.ROLE_LABEL) or "")
    if not steps <= rule.roles.get(role, frozenset()):
        said = " and ".join(sorted(steps))
        raise _refuse(f"Job {job_name} (role {role or 'none'}) has no {said} step that may hold it")
    pmeta = (seen.profile or {}).get("metadata") or {}
    if pmeta.get("uid") != profile_uid or pmeta.get("name") != name:
        raise _refuse(f"Job {job_name} names no TuningProfile that exists ({name}, {profile_uid})")
    owner = _controller(jmeta, KIND)
    if owner is None or owner.get("uid") != profile_uid or owner.get("name") != name:
        raise _refuse(f"Job {job_name} is not owned by TuningProfile {name}")
    expected = naming.job_name(name, model, revision, profile_uid, role)
    if job_name != expected:
        raise _refuse(f"Job {job_name} is not named as the operator names its own ({expected})")
    try:
        spec = TuningProfileSpec.model_validate((seen.profile or {}).get("spec") or {})
    except ValidationError:
        raise _refuse(f"TuningProfile {name} has an invalid spec") from None
    return Vouched(spec, name, profile_uid, model, revision, job_name, job_uid)


def _check_manifest(v: Vouched, namespace: str, m: Manifest) -> None:
    """Denied unless the manifest is of the Job's profile, model and revision, with the
    identity document the operator computes for them now (none for a retune)."""
    theirs = (m.namespace, m.profile, m.gpu_model, m.revision)
    ours = (namespace, v.name, v.model, v.revision)
    if theirs != ours:
        said = "{}/{} {} revision {}"
        raise _refuse(
            f"the manifest is of {said.format(*theirs)}, and this Job tunes {said.format(*ours)}"
        )
    current = naming.revision(v.spec) == v.revision
    if not current and m.fleet_identity is None:
        return  # a retune: its own revision, no identity (builders/job.Child.identity)
    if not current:
        raise _refuse(
            f"TuningProfile {v.name} changed since Job {v.job} was made (revision "
            f"{naming.revision(v.spec)} now): its output's identity is not vouched for"
        )
    differs = naming.identity_difference(
        naming.identity_document(v.spec, v.model), m.fleet_identity
    )
    if differs is not None:
        path, here, there = differs
        raise _refuse(
            f"the manifest's identity differs at {path}: {naming.shown(there)} in it, "
            f"{naming.shown(here)} for TuningProfile {v.name} now"
        )


def judge(seen: Seen, manifest: bytes, image: str, cluster: str, now: datetime) -> Attestation:
    """What the operator attests when it signs `manifest` for this caller (`image`: its own,
    `cluster`: this cluster's uid); Denied with what is wrong (the publish step fails with
    it)."""
    v = the_job(seen, image)
    try:
        m = loads(manifest)
    except ManifestError as e:
        raise Denied(400, "bad_request", f"the manifest does not read: {e}") from None
    _check_manifest(v, seen.caller.namespace, m)
    return Attestation(
        cluster=cluster,
        namespace=seen.caller.namespace,
        profile=v.name,
        profile_uid=v.profile_uid,
        gpu_model=v.model,
        job=v.job,
        job_uid=v.job_uid,
        revision=v.revision,
        manifest_sha256=hashlib.sha256(manifest).hexdigest(),
        identity_sha256=identity_sha256(m.fleet_identity),
        signed_at=now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
