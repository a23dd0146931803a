"""Builders of test objects, one per kind, in kueue's wrapper style (pkg/util/testing/wrappers.go):
`make_profile("llm", "ml").gpu("nvidia", "H100").phase("Ready").obj()`.

Every test that needs a TuningProfile, a spec, a Job, a pod, a model pod, a Node, a Workload, an
artifact entry or ConfigMap, or a tuner run's JobSpec starts here; no test module defines a
builder of its own (tests/unit/test_layering.py keeps it so). Each wrapper is immutable: every
method returns a changed copy, so a module constant (`BASE = make_profile().image("x")`) is a
safe starting point for many tests and no test sees another's changes.

Defaults are the smallest object the product accepts; a test names what it depends on. The
outputs are plain dicts (as the API server and the informers hand them over) or, where a test
works on parsed objects, the product's own types (`spec_model()`, `record()`, JobSpec)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Self

from testbed.builders.objects import GROUP_VERSION, document, manifest
from testbed.library_pod import JobSpec, shapes
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.naming import (
    MANAGED_KEY,
    MANAGED_VALUE,
    MODEL_ANNOTATION,
    PROFILE_LABEL,
    PROFILE_UID_LABEL,
    REVISION_LABEL,
    ROLE_LABEL,
    TUNING_PROFILE_LABEL,
)
from tunefleet.reconciler.observe import JobObservation

DELETED_AT = "2026-01-01T00:00:00Z"


class _Wrapper:
    """A document and the metadata methods every kind shares."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self._doc = doc

    def _with(self, path: tuple[str, ...], value: Any) -> Self:
        """A copy with doc[path...] = value (missing parents made)."""
        doc = copy.deepcopy(self._doc)
        node = doc
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = copy.deepcopy(value)
        return type(self)._of(doc)

    def _merge(self, path: tuple[str, ...], fields: dict[str, Any]) -> Self:
        """A copy with fields set one by one under doc[path...]."""
        doc = copy.deepcopy(self._doc)
        node = doc
        for key in path:
            node = node.setdefault(key, {})
        node.update(copy.deepcopy(fields))
        return type(self)._of(doc)

    def _without(self, *path: str) -> Self:
        doc = copy.deepcopy(self._doc)
        node = doc
        for key in path[:-1]:
            node = node.get(key, {})
        node.pop(path[-1], None)
        return type(self)._of(doc)

    def _appended(self, path: tuple[str, ...], item: Any) -> Self:
        """A copy with item added to the list at doc[path...] (made if missing)."""
        node: Any = self._doc
        for key in path:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        return self._with(path, [*(node or []), item])

    @classmethod
    def _of(cls, doc: dict[str, Any]) -> Self:
        out = cls.__new__(cls)
        _Wrapper.__init__(out, doc)
        return out

    def clone(self) -> Self:
        return type(self)._of(copy.deepcopy(self._doc))

    def obj(self) -> dict[str, Any]:
        """The document (a fresh copy: the caller may change it)."""
        return copy.deepcopy(self._doc)

    # metadata, for the kinds that have it
    def name(self, name: str) -> Self:
        return self._with(("metadata", "name"), name)

    def namespace(self, ns: str) -> Self:
        return self._with(("metadata", "namespace"), ns)

    def generate_name(self, prefix: str) -> Self:
        """generateName in place of a name, as a pod's controller writes it."""
        return self._without("metadata", "name")._with(("metadata", "generateName"), prefix)

    def uid(self, uid: str) -> Self:
        return self._with(("metadata", "uid"), uid)

    def generation(self, generation: int) -> Self:
        return self._with(("metadata", "generation"), generation)

    def resource_version(self, rv: str) -> Self:
        return self._with(("metadata", "resourceVersion"), rv)

    def created(self, timestamp: str) -> Self:
        return self._with(("metadata", "creationTimestamp"), timestamp)

    def deleting(self, timestamp: str = DELETED_AT) -> Self:
        return self._with(("metadata", "deletionTimestamp"), timestamp)

    def label(self, key: str, value: str) -> Self:
        return self._merge(("metadata", "labels"), {key: value})

    def labels(self, labels: dict[str, str]) -> Self:
        """All of the labels: replaces any set before."""
        return self._with(("metadata", "labels"), labels)

    def annotation(self, key: str, value: str) -> Self:
        return self._merge(("metadata", "annotations"), {key: value})

    def annotations(self, annotations: dict[str, str]) -> Self:
        """All of the annotations: replaces any set before."""
        return self._with(("metadata", "annotations"), annotations)

    def meta(self, **fields: Any) -> Self:
        """Any other metadata field, as the API writes it (camelCase)."""
        return self._merge(("metadata",), fields)

    def owner(
        self,
        uid: str,
        name: str = "p",
        kind: str = "TuningProfile",
        api_version: str = GROUP_VERSION,
        controller: bool = True,
    ) -> Self:
        """One more ownerReference (a controller one unless told otherwise)."""
        ref: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}
        if controller:
            ref["controller"] = True
        return self._appended(("metadata", "ownerReferences"), ref)

    def managed_by(self, profile: str = "p", profile_uid: str = "uid-1") -> Self:
        """The labels tunefleet puts on the children it makes for a profile."""
        return self._merge(
            ("metadata", "labels"),
            {
                MANAGED_KEY: MANAGED_VALUE,
                PROFILE_UID_LABEL: profile_uid,
                TUNING_PROFILE_LABEL: profile,
            },
        )

    def set(self, *path: str, value: Any) -> Self:
        """Any field at all: `.set("spec", "serving", "delivery", value="ImageVolume")`."""
        return self._with(path, value)

    def without(self, *path: str) -> Self:
        """The document with one key removed (e.g. `.without("metadata")`)."""
        return self._without(*path)

    def status(self, **fields: Any) -> Self:
        """Status fields, set one by one (camelCase, as the API writes them)."""
        return self._merge(("status",), fields)


def _doc_of(value: dict[str, Any] | _Wrapper) -> dict[str, Any]:
    return value.obj() if isinstance(value, _Wrapper) else copy.deepcopy(value)


class ProfileWrapper(_Wrapper):
    """A TuningProfile; its spec alone via `spec_dict()` or, parsed, `spec_model()`."""

    def image(self, image: str) -> ProfileWrapper:
        return self._with(("spec", "image"), image)

    def gpu(self, vendor: str, *models: str, **extra: Any) -> ProfileWrapper:
        """spec.gpu: the vendor, its models, and any other field (count=8, parallelism=2)."""
        return self._with(("spec", "gpu"), {"vendor": vendor, "models": list(models), **extra})

    def shapes(self, *mnk: tuple[int, int, int] | list[int]) -> ProfileWrapper:
        """A workload of GEMM shapes."""
        return self._with(("spec", "workload"), {"shapes": [{"mnk": list(s)} for s in mnk]})

    def command(self, *argv: str, env: list[dict[str, Any]] | None = None) -> ProfileWrapper:
        """A workload that runs the user's command (optionally with env)."""
        workload: dict[str, Any] = {"command": list(argv)}
        if env is not None:
            workload["env"] = env
        return self._with(("spec", "workload"), workload)

    def storage(self, uri: str, **extra: Any) -> ProfileWrapper:
        """spec.storage: the uri and any other field (endpoint=..., credentialsSecret=...)."""
        return self._with(("spec", "storage"), {"uri": uri, **extra})

    def serving(self, **fields: Any) -> ProfileWrapper:
        return self._with(("spec", "serving"), fields)

    def tuning(self, **fields: Any) -> ProfileWrapper:
        return self._with(("spec", "tuning"), fields)

    def template(self, template: dict[str, Any]) -> ProfileWrapper:
        return self._with(("spec", "template"), template)

    def spec(self, **fields: Any) -> ProfileWrapper:
        """Any top-level spec field, set whole (camelCase)."""
        return self._merge(("spec",), fields)

    def spec_is(self, spec: dict[str, Any]) -> ProfileWrapper:
        """The whole spec, as given."""
        return self._with(("spec",), spec)

    def phase(self, phase: str) -> ProfileWrapper:
        return self._with(("status", "phase"), phase)

    def revision(self, revision: str) -> ProfileWrapper:
        """status.revision: the spec revision the status speaks of."""
        return self._with(("status", "revision"), revision)

    def artifacts(self, *artifacts: dict[str, Any] | _Wrapper) -> ProfileWrapper:
        return self._with(("status", "artifacts"), [_doc_of(a) for a in artifacts])

    def history(self, *artifacts: dict[str, Any] | _Wrapper) -> ProfileWrapper:
        return self._with(("status", "history"), [_doc_of(a) for a in artifacts])

    def spec_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._doc.get("spec", {}))

    def spec_model(self) -> TuningProfileSpec:
        return TuningProfileSpec.model_validate(self.spec_dict())


def make_profile(name: str = "p", ns: str = "ml") -> ProfileWrapper:
    """A valid TuningProfile: one NVIDIA H100, one 8x8x8 GEMM, stored at s3://bkt/p."""
    spec = {
        "image": "serve:1",
        "gpu": {"vendor": "nvidia", "models": ["H100"]},
        "workload": {"shapes": [{"mnk": [8, 8, 8]}]},
        "storage": {"uri": "s3://bkt/p"},
    }
    return ProfileWrapper(manifest(GROUP_VERSION, "TuningProfile", name, ns, spec=spec))


class JobWrapper(_Wrapper):
    """A batch/v1 Job as its informer sees it."""

    def revision(self, revision: str) -> JobWrapper:
        return self.label(REVISION_LABEL, revision)

    def role(self, role: str) -> JobWrapper:
        return self.label(ROLE_LABEL, role)

    def gpu_model(self, model: str) -> JobWrapper:
        return self.annotation(MODEL_ANNOTATION, model)

    def template(self, pod: PodWrapper) -> JobWrapper:
        """spec.template: the pod each of its pods is made from."""
        return self._with(("spec", "template"), pod.template())

    def spec(self, **fields: Any) -> JobWrapper:
        """Any other Job spec field (camelCase)."""
        return self._merge(("spec",), fields)

    def suspend(self, suspended: bool = True) -> JobWrapper:
        return self._with(("spec", "suspend"), suspended)

    def conditions(self, *conditions: dict[str, Any]) -> JobWrapper:
        return self._with(("status", "conditions"), list(conditions))

    def condition(self, type_: str, status: str = "True", **extra: Any) -> JobWrapper:
        """One more status condition (reason=..., message=...)."""
        return self._appended(("status", "conditions"), {"type": type_, "status": status, **extra})

    def active(self, count: int) -> JobWrapper:
        return self._with(("status", "active"), count)

    def started(self, timestamp: str = "2026-12-03T00:00:00Z") -> JobWrapper:
        return self._with(("status", "startTime"), timestamp)


def make_job(name: str = "tune-x", ns: str = "ml") -> JobWrapper:
    return JobWrapper(manifest("batch/v1", "Job", name, ns, spec={}, status={}))


class PodWrapper(_Wrapper):
    """A v1 Pod; a model pod is one with the profile label (`make_model_pod`)."""

    def profile(self, profile: str) -> PodWrapper:
        """The label that asks tunefleet to serve this pod a profile's artifact."""
        return self.label(PROFILE_LABEL, profile)

    def container(
        self,
        name: str = "server",
        image: str = "serve:1",
        *,
        gpus: int | None = None,
        gpu_resource: str = "nvidia.com/gpu",
        limits: dict[str, str] | None = None,
        env: list[dict[str, Any]] | None = None,
        init: bool = False,
        **extra: Any,
    ) -> PodWrapper:
        """One more container (or init container). `gpus` sets the GPU limit; `limits` all
        of them; both leave `resources` out unless given."""
        container: dict[str, Any] = {"name": name, "image": image}
        if gpus is not None or limits is not None:
            lim = dict(limits or {})
            if gpus is not None:
                lim[gpu_resource] = str(gpus)
            container["resources"] = {"limits": lim}
        if env is not None:
            container["env"] = env
        container.update(extra)
        key = "initContainers" if init else "containers"
        return self._appended(("spec", key), container)

    def containers(self, *containers: dict[str, Any]) -> PodWrapper:
        """All of the containers, as given."""
        return self._with(("spec", "containers"), list(containers))

    def selector(self, selector: dict[str, str]) -> PodWrapper:
        return self._with(("spec", "nodeSelector"), selector)

    def affinity(self, *terms: dict[str, Any]) -> PodWrapper:
        """Required node affinity: any of these nodeSelectorTerms."""
        required = {"nodeSelectorTerms": list(terms)}
        return self._with(
            ("spec", "affinity"),
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
        )

    def toleration(self, key: str, effect: str = "NoSchedule") -> PodWrapper:
        tol = {"key": key, "operator": "Exists", "effect": effect}
        return self._appended(("spec", "tolerations"), tol)

    def claim(self, name: str, template: str) -> PodWrapper:
        """A DRA resource claim from a ResourceClaimTemplate."""
        claim = {"name": name, "resourceClaimTemplateName": template}
        return self._appended(("spec", "resourceClaims"), claim)

    def spec(self, **fields: Any) -> PodWrapper:
        """Any other pod spec field (camelCase)."""
        return self._merge(("spec",), fields)

    def phase(self, phase: str) -> PodWrapper:
        return self._with(("status", "phase"), phase)

    def container_state(
        self, name: str, state: dict[str, Any], init: bool = False, image: str = ""
    ) -> PodWrapper:
        """One more container status: {"terminated": {...}}, {"waiting": {...}}, ...; with the
        image the kubelet reports when given."""
        key = "initContainerStatuses" if init else "containerStatuses"
        status = {"name": name, "state": state, **({"image": image} if image else {})}
        return self._appended(("status", key), status)

    def terminated(self, name: str, code: int, message: str = "", init: bool = False) -> PodWrapper:
        return self.container_state(
            name, {"terminated": {"exitCode": code, "message": message}}, init=init
        )

    def template(self) -> dict[str, Any]:
        """The pod as a workload's pod template: its labels and annotations, and its spec."""
        meta = {k: v for k, v in self._doc["metadata"].items() if k in ("labels", "annotations")}
        return {"metadata": copy.deepcopy(meta), "spec": copy.deepcopy(self._doc["spec"])}

    def admitted(self, admission: Any) -> PodWrapper:
        """The webhook's admission record on the pod (tunefleet.contracts.admission_record.Admission),
        written by its owner module, as the webhook writes it."""
        doc = copy.deepcopy(self._doc)
        admission.write(doc)
        return PodWrapper._of(doc)


def make_pod(name: str = "m", ns: str = "ml") -> PodWrapper:
    return PodWrapper(manifest("v1", "Pod", name, ns, spec={"containers": []}))


def make_model_pod(
    profile: str = "p", name: str = "m", ns: str = "ml", image: str = "serve:1"
) -> PodWrapper:
    """A pod that asks for a profile's artifact, with one container named server and no GPU
    request (add one with `.containers(...)` or build from make_pod)."""
    return make_pod(name, ns).profile(profile).container("server", image)


class NodeWrapper(_Wrapper):
    pass


def make_node(name: str) -> NodeWrapper:
    return NodeWrapper(manifest("v1", "Node", name))


class WorkloadWrapper(_Wrapper):
    """A Kueue Workload."""

    def condition(
        self, type_: str, status: str, message: str = "", reason: str = "Pending"
    ) -> WorkloadWrapper:
        cond = {"type": type_, "status": status, "reason": reason, "message": message}
        return self._appended(("status", "conditions"), cond)


def make_workload(name: str = "job-x-1", ns: str = "ml") -> WorkloadWrapper:
    return WorkloadWrapper(manifest("kueue.x-k8s.io/v1beta1", "Workload", name, ns))


class ConfigMapWrapper(_Wrapper):
    def data(self, **files: str) -> ConfigMapWrapper:
        return self._merge(("data",), files)

    def binary(self, **files: str) -> ConfigMapWrapper:
        """binaryData, each value base64 as the API server keeps it."""
        return self._merge(("binaryData",), files)

    def uid(self, uid: str) -> ConfigMapWrapper:
        return self._with(("metadata", "uid"), uid)

    def immutable(self, value: bool = True) -> ConfigMapWrapper:
        return self._with(("immutable",), value)


def make_config_map(name: str, ns: str = "ml") -> ConfigMapWrapper:
    return ConfigMapWrapper(manifest("v1", "ConfigMap", name, ns))


class ArtifactWrapper(_Wrapper):
    """An entry of a profile's status.artifacts[] or history[] (camelCase, as written); as
    the operator reads it, `record()`."""

    def uri(self, uri: str) -> ArtifactWrapper:
        return self._with(("uri",), uri)

    def revision(self, revision: str) -> ArtifactWrapper:
        return self._with(("revision",), revision)

    def library_key(self, key: str) -> ArtifactWrapper:
        return self._with(("libraryKey",), key)

    def identity(self, identity: dict[str, str]) -> ArtifactWrapper:
        return self._with(("identity",), identity)

    def tuned_at(self, timestamp: str) -> ArtifactWrapper:
        return self._with(("tunedAt",), timestamp)

    def verdict(self, verdict: str, message: str = "") -> ArtifactWrapper:
        """The value gate's promotion verdict (Passed, Rejected, Unmeasured, ...)."""
        return self._with(("promotion",), {"verdict": verdict, "message": message})

    def delivered(self, delivery: str, config_map: str, uid: str) -> ArtifactWrapper:
        """Served from the ConfigMap `config_map` (uid) by `delivery`."""
        return self._with(("configMap",), {"name": config_map, "uid": uid})._with(
            ("delivery",), delivery
        )

    def fields(self, **fields: Any) -> ArtifactWrapper:
        """Any other field, set whole (camelCase)."""
        return self._merge((), fields)

    def record(self) -> ArtifactRecord:
        got = ArtifactRecord.from_status(self.obj())
        assert got is not None, self._doc
        return got


def make_artifact(
    model: str = "H100", sha: str = "ab" * 32, profile: str = "p", ns: str = "ml",
    base: str = "s3://bkt/p",
) -> ArtifactWrapper:  # fmt: skip
    """A published artifact of one GPU model, at the path the publisher writes it to."""
    return ArtifactWrapper(
        {"gpuModel": model, "uri": f"{base}/{ns}/{profile}/{model}/{sha}", "sha256": sha}
    )


class TunerRunWrapper:
    """What the operator puts into each pod of one tuning Job (testbed.library_pod.JobSpec),
    for the tests that run tuner_job's steps as processes."""

    def __init__(self, spec: JobSpec) -> None:
        self._spec = spec

    def env(self, **env: str) -> TunerRunWrapper:
        """The stand-in torch's settings (FAKE_TORCH_*, PYTORCH_*) for the tune step."""
        return self.fields(torch_env={**self._spec.torch_env, **env})

    def fields(self, **fields: Any) -> TunerRunWrapper:
        """Any other JobSpec field."""
        return TunerRunWrapper(dataclasses.replace(copy.deepcopy(self._spec), **fields))

    def obj(self) -> JobSpec:
        return copy.deepcopy(self._spec)


def make_tuner_run(uri: str | Path, profile: str, gemms: range) -> TunerRunWrapper:
    """A run of the testbed's GEMM shapes `gemms` (testbed.library_pod.shapes) into the store
    at uri (a Path is a file:// store)."""
    where = f"file://{uri}" if isinstance(uri, Path) else uri
    return TunerRunWrapper(JobSpec(uri=where, profile=profile, gemms=shapes(gemms)))


class ObservationWrapper:
    """What the reconcile observed of one tuning Job (reconciler.observe.JobObservation)."""

    def __init__(self, obs: JobObservation) -> None:
        self._obs = obs

    def record(self, record: ArtifactRecord | ArtifactWrapper) -> ObservationWrapper:
        """The artifact record its publish step wrote."""
        rec = record.record() if isinstance(record, ArtifactWrapper) else record
        return self.fields(record=rec)

    def fields(self, **fields: Any) -> ObservationWrapper:
        """Any other JobObservation field (uid, reason, message, role, image_id, ...)."""
        return ObservationWrapper(dataclasses.replace(copy.deepcopy(self._obs), **fields))

    def obj(self) -> JobObservation:
        return copy.deepcopy(self._obs)


def make_observation(
    name: str = "tune-x", model: str = "H100", revision: str = "r1", state: str = "Running"
) -> ObservationWrapper:
    return ObservationWrapper(JobObservation(name, model, revision, state))  # type: ignore[arg-type]


class ObjectWrapper(_Wrapper):
    """Any other kind (PersistentVolumeClaim, RuntimeClass, Deployment, AdmissionReview, ...)."""

    def spec(self, **fields: Any) -> ObjectWrapper:
        return self._merge(("spec",), fields)

    def fields(self, **fields: Any) -> ObjectWrapper:
        """Top-level fields beside metadata (RuntimeClass's handler, a review's response)."""
        return self._merge((), fields)


def make_object(api_version: str, kind: str, name: str = "", ns: str = "") -> ObjectWrapper:
    """An object of any kind; without a name it has no metadata (an AdmissionReview)."""
    if not name:
        return ObjectWrapper(document(api_version, kind))
    return ObjectWrapper(manifest(api_version, kind, name, ns))


def make_pvc(
    name: str, ns: str, volume: str, access: tuple[str, ...] = ("ReadWriteOnce",),
    size: str = "1Gi", storage_class: str = "tunefleet-e2e",
) -> ObjectWrapper:  # fmt: skip
    """A PersistentVolumeClaim bound to the PersistentVolume `volume` (no provisioner here)."""
    return make_object("v1", "PersistentVolumeClaim", name, ns).spec(
        accessModes=list(access),
        storageClassName=storage_class,
        volumeName=volume,
        resources={"requests": {"storage": size}},
    )


def make_deployment(name: str, pod: PodWrapper, replicas: int = 1, ns: str = "") -> ObjectWrapper:
    """An apps/v1 Deployment of `pod` (its labels the template's), selecting on app=name."""
    return make_object("apps/v1", "Deployment", name, ns).spec(
        replicas=replicas,
        selector={"matchLabels": {"app": name}},
        template=pod.label("app", name).template(),
    )
