"""A reconcile's one read step: everything the decision (decide.plan) needs, read once and
handed on as a frozen value (Inputs). Reads go through the process's client (each behind
its TTL in memory.py), the capture source and the profile's store; nothing here writes.

What is read: the spec parsed and checked against policy; node counts (parallelism); the
capture step's plan; the ConfigMaps of superseded Jobs and of the artifacts status names (a
deleted or replaced one is made again); what observing a Job wants beyond the cache; the
fleet's entry for each model that may adopt; the facts image-volume delivery turns on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from tunefleet import kube, naming
from tunefleet.api import TuningProfileSpec, policy
from tunefleet.api.conditions import truncate
from tunefleet.builders.storage import operator_signs, pod_storage
from tunefleet.capture import step as capture_step
from tunefleet.config import Config
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.fleet import adopt, coordinate, probe
from tunefleet.kube import Kube
from tunefleet.reconciler import children, decide
from tunefleet.reconciler.diagnose import Hints
from tunefleet.reconciler.inputs import (
    Around,
    ConfigMapFact,
    FleetFacts,
    Inputs,
    Probe,
    RefsPlace,
    View,
    Where,
)
from tunefleet.reconciler.memory import NODES_TTL, Memory
from tunefleet.reconciler.observe import Gathered, observe_wanting
from tunefleet.serving import delivery
from tunefleet.storage.registry import parse_uri, shared_session
from tunefleet.storage.store import Location, Store, StoreError, StoreOptions, swappable

log = logging.getLogger(__name__)


def validation_message(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        parts.append(f"spec.{where}: {e['msg']}" if where else e["msg"])
    return "; ".join(parts)


def parse_spec(
    raw: dict[str, Any], config: Config | None = None
) -> tuple[TuningProfileSpec | None, list[str]]:
    try:
        spec = TuningProfileSpec.model_validate(raw)
    except ValidationError as e:
        return None, [validation_message(e)]
    signs = config is not None and operator_signs(spec, config)
    return spec, naming.spec_problems(spec, operator_signs=signs)


def hints_for(spec: TuningProfileSpec | None, config: Config) -> Hints:
    if spec is None:
        return Hints()
    storage = pod_storage(spec, config)
    return Hints(
        label_key=naming.label_key(spec),
        resource=naming.resource_name(spec),
        credentials_secret=storage.credentials_secret,
        credentials_kind=storage.credentials_kind or "storage credentials",
        credential_keys=storage.credential_keys,
        pull_secrets=tuple(s.name for s in spec.image_pull_secrets or []),
        # A record that does not fit its model's vendor is refused, never served (fit.py).
        gpu_vendor=spec.gpu.vendor,
        stand_in_models=tuple(config.stand_in_models),
        tolerations=tuple(
            str(t.get("key") or "every taint")
            for t in (
                spec.template.spec.tolerations or [] if spec.template and spec.template.spec else []
            )
        ),
    )


def gather(view: View, around: Around, memory: Memory, config: Config) -> Inputs:
    """Every read one reconcile makes, in one value. A settled profile reads nothing beyond
    the cache: each read below is for something that changes or is due."""
    meta = view.profile["metadata"]
    spec, problems = parse_spec(view.profile.get("spec") or {}, config)
    refused = policy.refusals(spec, config.profile_policy) if spec and not problems else []
    inputs = Inputs(
        view, config, memory.of(meta["uid"]), around, spec, tuple(problems), tuple(refused),
        unadmitted=tuple(memory.unadmitted.get((meta["namespace"], meta["name"]), [])),
        hints=hints_for(spec, config), untrusted=tuple(around.untrusted),
        untuned_pods=tuple(around.untuned_pods), wall=time.time(), at=time.monotonic(),
        probes=memory.probes,
    )  # fmt: skip
    if spec is None:
        return inputs
    inputs = _capture(inputs)
    if inputs.acting and spec.gpu.parallelism > 1:
        inputs = replace(inputs, too_few=_too_few_nodes(around.client, spec, memory))
    inputs = replace(inputs, gathered=_observing(inputs), config_maps=_config_maps(inputs))
    if config.fleet and config.fleet_cluster:
        inputs = replace(inputs, refs_at=_refs_at(inputs))
    if inputs.acting and config.fleet:
        inputs = _checked(_wheres(inputs))
        inputs = replace(inputs, fleet=_entries(inputs))
    return inputs


def _refs_at(inputs: Inputs) -> RefsPlace | None:
    """Where the profile's refs doc goes: its store, when fleet mode writes there (s3://; an
    oci:// registry is not collected by tunefleet-gc, and pvc:// is not the operator's to
    open). Opening a store reads nothing."""
    opened = _open(inputs)
    if opened is None or opened[1].scheme != "s3":
        return None
    return RefsPlace(opened[0], opened[1], inputs.config.fleet_cluster)


def _capture(inputs: Inputs) -> Inputs:
    """The capture step's revisions; while acting, its plan (the retune sets it froze are
    made, and the stale ones removed, by apply.py), with the revisions it makes assumed."""
    assert inputs.spec is not None
    base = naming.revision(inputs.spec)
    captures = inputs.around.captures
    if not inputs.acting or captures is None:
        outcome = capture_step.revisions_only(inputs.spec, base, inputs.previous)
        return replace(inputs, capture=outcome)
    planned = capture_step.planned(
        captures, inputs.spec, inputs.profile, default_endpoint=inputs.config.default_s3_endpoint
    )
    return replace(
        inputs,
        planned=planned,
        capture=capture_step.outcome(planned, list(planned.plan.freezes)),
        stale_sets=tuple(capture_step.stale_sets(captures, planned)),
    )


def _too_few_nodes(client: Kube, spec: TuningProfileSpec, memory: Memory) -> dict[str, str]:
    """Models with fewer nodes than spec.gpu.parallelism: each share needs a node of its own."""
    key = naming.label_key(spec)
    out = {}
    for model in spec.gpu.models:
        cached = memory.node_counts.get((key, model))
        if cached is None or time.monotonic() - cached[0] > NODES_TTL:
            cached = (time.monotonic(), client.count_nodes(f"{key}={model}"))
            memory.node_counts[(key, model)] = cached
        nodes = cached[1]
        if nodes < spec.gpu.parallelism:
            out[model] = (
                f"spec.gpu.parallelism is {spec.gpu.parallelism} but {nodes} node(s) have "
                f"{key}={model}: each share runs on a node of its own. Lower "
                f"spec.gpu.parallelism to at most {max(nodes, 1)}, or add nodes; nothing was "
                "started for this model"
            )
    return out


def _observing(inputs: Inputs) -> Gathered:
    """What observing the Jobs wants beyond the cache (each read behind its TTL in memory.py):
    a settled profile wants nothing and reads nothing."""
    by_job = {r.job: r for r in inputs.served().values() if r.job}
    _, wants = observe_wanting(inputs.view.jobs, inputs.view.pods, inputs.hints, by_job)
    return inputs.memory.gather(wants, inputs.around.client) if wants else Gathered()


def _config_maps(inputs: Inputs) -> dict[str, ConfigMapFact]:
    """The ConfigMaps a reconcile may act on: each superseded Job's (deleted with it when it
    is this profile's), and each artifact's that status names (made again when deleted or
    replaced). The watch's word is taken where it agrees with status; else the API server's
    (the watch may not have seen one just made)."""
    out: dict[str, ConfigMapFact] = {}
    ns = inputs.meta["namespace"]
    client = inputs.around.client
    if inputs.acting:
        # Under the revisions assumed and under the spec's: a retune set that cannot be made
        # leaves the spec's revision current (decide.then).
        base = inputs.revision(capture_step.Outcome())
        for revision in (inputs.revision(), base):
            for job in children.superseded(inputs.view.jobs, revision):
                name = job["metadata"]["name"]
                out[name] = out.get(name) or read_config_map(client, ns, name)
    watched = inputs.around.config_map_uid
    if watched is None:
        return out
    for entry in inputs.previous.get("artifacts") or []:
        record = ArtifactRecord.from_status(entry)
        if record is None or not record.config_map or record.config_map in out:
            continue
        made = record.config_map_uid
        if made and watched(ns, record.config_map) == made:
            out[record.config_map] = ConfigMapFact(made)
            continue
        out[record.config_map] = read_config_map(client, ns, record.config_map)
    return out


def read_config_map(client: Kube, ns: str, name: str) -> ConfigMapFact:
    try:
        there = client.read("ConfigMap", ns, name)
    except kube.Temporary:
        return ConfigMapFact("", None, known=False)  # not known now: looked at again later
    return ConfigMapFact(str(((there or {}).get("metadata") or {}).get("uid") or ""), there)


def _wheres(inputs: Inputs) -> Inputs:
    """Where each model's identity's fleet objects are (opening a store reads nothing), and
    the store as its conditional writes are probed (a store that swaps: not a board)."""
    spec, config = inputs.spec, inputs.config
    if not config.fleet_cluster or spec is None:
        return inputs
    opened = _open(inputs)
    if opened is None or not coordinate.coordinates(opened[0]):
        return inputs
    store, location, endpoint = opened
    m = inputs.meta
    holder = contract.Holder(config.fleet_cluster, m["namespace"], m["name"], m["uid"])
    out = {}
    for model in spec.gpu.models:
        identity = naming.fleet_identity(spec, model)
        if identity is not None:
            out[model] = Where(identity, store, location, holder)
    key = probe.store_key(location.scheme, location.bucket, endpoint)
    words = probe.store_words(location.uri(), endpoint)
    target = Probe(store, location, key, words) if swappable(store) is not None else None
    return replace(inputs, wheres=out, probe=target)


def _checked(inputs: Inputs) -> Inputs:
    """The store's verdict on conditional writes, as this process knows it (fleet/probe.py):
    a store that fails them is not coordinated through (no `wheres`: the profile tunes its
    own); one with no fresh verdict is probed (apply.probe) before a model claims through it.
    A profile with nothing to claim (every model served, adopt: Never, a retune) leaves it
    unprobed: publishing and renewing go on."""
    target = inputs.probe
    if target is None or not inputs.wheres:
        return replace(inputs, probe=None)
    known = inputs.probes.verdict(target.key, inputs.at)
    if known is not None and not known.honours:
        return replace(inputs, wheres={}, probe=None, refusal=known)
    if known is not None or all(inputs.fleet_where(m) is None for m in decide.wanted(inputs)):
        return replace(inputs, probe=None)
    return inputs


def _open(inputs: Inputs) -> tuple[Store, Location, str] | None:
    """The profile's store with the operator's store identity (not pvc://: the operator
    mounts no PersistentVolumeClaim), and its S3 endpoint ("": the default, or oci://)."""
    assert inputs.spec is not None
    storage, config = inputs.spec.storage, inputs.config
    endpoint = ""
    try:
        location = parse_uri(storage.uri)
        if location.scheme == "oci":
            # The registry identity that may push claims (fleet.ociCredentialsSecret), else
            # delivery's: one per reconcile, as a registry token expires.
            options = StoreOptions(
                timeout_s=config.delivery_timeout_s,
                oci_config=config.fleet_oci_config or config.oci_config or None,
            )
        elif location.scheme == "s3":
            endpoint = storage.endpoint or config.default_s3_endpoint
            options = delivery.store_options(endpoint, storage.region or "", config)
        else:
            return None
        store = inputs.around.open_store(location, shared_session(location, options))
        return store, location, endpoint
    except (ValueError, StoreError):
        return None


def _entries(inputs: Inputs) -> dict[str, FleetFacts]:
    """Each model that needs a Job and may adopt: its identity's published entry, read and
    checked."""
    out = {}
    for model in decide.wanted(inputs):
        w = inputs.fleet_where(model)
        if w is not None:
            out[model] = read_entry(inputs, model, w)
    return out


def read_entry(inputs: Inputs, model: str, w: Where) -> FleetFacts:
    """The identity's published entry for one model, read and checked (adopt.read, verify).
    One that failed a check is not downloaded again by this profile (a waiting profile looks
    every few seconds): it is remembered by what it names."""
    assert inputs.spec is not None
    key = contract.published_key(w.location, model, w.identity)
    seen = key
    try:
        entry = adopt.read(w.store, key, w.identity, model)
        if entry is None:
            return FleetFacts(w)
        record = entry.record
        seen = f"{key}#{record.sha256}/{record.manifest_sha256}/{record.uri}"
        if seen in inputs.memory.refused_entries:
            return FleetFacts(w, refused="refused before", seen=seen)
        entry = adopt.verify(entry, inputs.spec, inputs.config.stand_in_models, w.store)
    except adopt.NotAdoptable as e:
        return FleetFacts(w, refused=str(e) or "refused", seen=seen)
    except StoreError as e:
        return FleetFacts(w, unread=truncate(str(e), 400))
    return FleetFacts(w, entry=entry, seen=seen)
