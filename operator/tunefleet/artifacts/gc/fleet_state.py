"""What the fleet says, read from the API server before the store is listed: each
TuningProfile's current revisions, GPU models and published artifacts (status.artifacts and
history), whether its spec names this store, and the artifacts that model pods still running
were pinned to at admission. The lists are read as JSON, a page at a time, through a
connection found as kubectl finds one (runtime/kubeconfig.py: kubeconfig, or the pod's
ServiceAccount); a refusal or an API server out of reach ends the run with the fix,
before anything is deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tunefleet import GROUP, PLURAL, VERSION, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.admission_record import Admission
from tunefleet.runtime.client import pages
from tunefleet.runtime.kubeconfig import Connection, KubeconfigError, connect
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import Location

from .common import GcError

PROFILE_PAGE = 500
REQUEST_TIMEOUT = (5, 60)  # (connect, read) seconds per API request

# (namespace, profile, GPU model, sha256) of an artifact directory (contracts/fleet.py's: the
# refs docs other clusters write name artifacts the same way).
ArtifactId = contract.ArtifactId


@dataclass(frozen=True)
class ProfileFacts:
    namespace: str
    name: str
    revisions: frozenset[str]  # current: the status's and the spec's (both, when they differ)
    models: frozenset[str] | None  # the spec's GPU models; None when the spec does not parse
    published: frozenset[tuple[str, str]]  # (model, revision) of status.artifacts and history


@dataclass
class Fleet:
    profiles: dict[tuple[str, str], ProfileFacts] = field(default_factory=dict)
    referenced: set[ArtifactId] = field(default_factory=set)
    pinned: set[ArtifactId] = field(default_factory=set)  # by model pods that still run
    using_store: int = 0  # profiles whose spec.storage.uri is this store


def _spec_facts(spec: Any) -> tuple[str | None, frozenset[str] | None]:
    """(revision, GPU models) of a spec the operator can read; Nones otherwise."""
    try:
        parsed = TuningProfileSpec.model_validate(spec or {})
        return naming.revision(parsed), frozenset(parsed.gpu.models)
    except (ValidationError, ValueError):
        return None, None


def _same_store(spec: Any, location: Location) -> bool:
    """Whether spec.storage.uri is this store (read as it is: an invalid spec still says)."""
    storage = spec.get("storage") if isinstance(spec, dict) else None
    uri = storage.get("uri") if isinstance(storage, dict) else None
    try:
        return isinstance(uri, str) and parse_uri(uri) == location
    except ValueError:
        return False


def add_profile(fleet: Fleet, doc: dict[str, Any], location: Location) -> None:
    meta = doc.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    raw = doc.get("status")
    status: dict[str, Any] = raw if isinstance(raw, dict) else {}
    spec_revision, models = _spec_facts(doc.get("spec"))
    revisions = {r for r in (status.get("revision"), spec_revision) if isinstance(r, str) and r}
    # The one notion of "referenced" that the operator's refs docs use too (contracts/fleet.py):
    # what a cluster's refs name is what its own gc keeps for its profiles.
    records = contract.status_records(status)
    published = {(r.gpu_model, r.revision) for r in records}
    fleet.referenced |= contract.referenced(records, namespace, name)
    fleet.profiles[(namespace, name)] = ProfileFacts(
        namespace, name, frozenset(revisions), models, frozenset(published)
    )
    fleet.using_store += _same_store(doc.get("spec"), location)


def pinned_ids(uris: Iterable[str]) -> set[ArtifactId]:
    """The artifacts model pods were pinned to at admission, by their URIs' last four
    segments (`<ns>/<profile>/<model>/<sha256>`)."""
    return {i for i in map(contract.artifact_id, uris) if i is not None}


def fleet_of(
    docs: Iterable[dict[str, Any]], location: Location, pinned: Iterable[str] = ()
) -> Fleet:
    fleet = Fleet()
    for doc in docs:
        add_profile(fleet, doc, location)
    fleet.pinned = pinned_ids(pinned)
    return fleet


def _connect(kubeconfig: str | None, context: str | None) -> Connection:
    try:
        return connect(kubeconfig, context)
    except KubeconfigError as e:
        raise GcError(str(e)) from None


def read_profiles(
    kubeconfig: str | None, context: str | None, namespaces: Sequence[str] | None
) -> list[dict[str, Any]]:
    """Every TuningProfile (cluster-wide, or in each of `namespaces`), page by page."""
    cluster = _connect(kubeconfig, context)
    docs: list[dict[str, Any]] = []
    for namespace in namespaces if namespaces is not None else [None]:
        docs += _list_profiles(cluster.api, cluster.host, namespace)
    return docs


def read_pinned(
    kubeconfig: str | None, context: str | None, namespaces: Sequence[str] | None
) -> list[str]:
    """The artifact URIs that model pods not yet ended were pinned to at admission (their
    annotations, read by the contract's owner). A pod that restarts (its init containers run
    again) or whose fetch has not run yet still reads its artifact, however old: status and
    history are bounded, pods are not. A pod can only keep an artifact, never remove one."""
    cluster = _connect(kubeconfig, context)
    uris: list[str] = []
    for namespace in namespaces if namespaces is not None else [None]:
        path = "/api/v1/" + (f"namespaces/{namespace}/" if namespace else "") + "pods"
        where = f"in namespace {namespace}" if namespace else "cluster-wide"
        query = [
            ("labelSelector", naming.PROFILE_LABEL),
            ("fieldSelector", "status.phase!=Succeeded,status.phase!=Failed"),
        ]
        for pod in _pages(cluster.api, cluster.host, path, query, f"pods {where}"):
            admitted = Admission.read(pod)
            if admitted is not None and admitted.uri:
                uris.append(admitted.uri)
    return uris


def _pages(
    api: Any, host: str, path: str, query: list[tuple[str, str]], what: str
) -> Iterator[dict[str, Any]]:
    """Every item of a list, a page at a time (only one page is held)."""

    def fetch(token: str) -> dict[str, Any]:
        paged = [*query, ("limit", str(PROFILE_PAGE))] + ([("continue", token)] if token else [])
        got = _api_get(api, host, path, paged, what)
        return got if isinstance(got, dict) else {}

    for page in pages(fetch):
        yield from (d for d in page.get("items") or [] if isinstance(d, dict))


def _list_profiles(api: Any, host: str, namespace: str | None) -> list[dict[str, Any]]:
    where = f"in namespace {namespace}" if namespace else "cluster-wide"
    path = f"/apis/{GROUP}/{VERSION}/" + (f"namespaces/{namespace}/" if namespace else "") + PLURAL
    return list(_pages(api, host, path, [], f"tuningprofiles.{GROUP} {where}"))


def _api_get(api: Any, host: str, path: str, query: list[tuple[str, str]], what: str) -> Any:
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        resp = api.call_api(
            path, "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _return_http_data_only=True, _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip
        return json.loads(resp.data)
    except ApiException as e:
        raise GcError(_api_refusal(e, host, what)) from None
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise GcError(
            f"cannot read {what} from the API server at {host} ({reason}): check --kubeconfig/"
            "--context and that the cluster is up; nothing was deleted"
        ) from None


def _api_refusal(e: Any, host: str, what: str) -> str:
    status = int(e.status or 0)
    try:
        message = str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        message = str(e.reason)
    fixes = {
        401: "log in again or pick another --context",
        403: f"grant get/list on tuningprofiles.{GROUP} and list on pods (the chart's gc RBAC "
        "does), or restrict gc to namespaces it may read with --namespace",
        404: "is the TuningProfile CRD installed in this cluster?",
    }
    fix = fixes.get(status, "try again; if it persists, check the API server")
    return f"listing {what} at {host} failed ({status} {message}): {fix}; nothing was deleted"
