"""The one startup handler: kopf settings, API login, the webhook server, the reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import kopf

from tunefleet import kube, metrics, naming
from tunefleet.capture import endpoint as capture_endpoint
from tunefleet.capture.cache import CaptureCache
from tunefleet.capture.keys import ArtifactKeys
from tunefleet.capture.step import CaptureSource
from tunefleet.capture.store import Writer
from tunefleet.config import Config
from tunefleet.informers import watch
from tunefleet.informers.cache import Cache
from tunefleet.placement.nodemap import NodeMaps
from tunefleet.reconciler.controller import Controller, Indexes
from tunefleet.runtime import reflector
from tunefleet.runtime.leader import Callbacks, LeaseElector
from tunefleet.runtime.reflector import Reflectors
from tunefleet.serving.delivered import DeliveredConfigMaps
from tunefleet.serving.served import ServedPods
from tunefleet.webhook import server as webhook_server


class _Holder:
    """Made once at startup; handlers reach it without re-reading the environment."""

    def __init__(self) -> None:
        self._config: Config | None = None
        self._controller: Controller | None = None

    def set(self, config: Config, controller: Controller | None = None) -> None:
        self._config = config
        self._controller = controller


class _ConfigHolder(_Holder):
    def get(self) -> Config:
        if self._config is None:
            self._config = Config.from_env()
        return self._config


class _ControllerHolder(_Holder):
    def get(self) -> Controller:
        if self._controller is None:
            raise RuntimeError("the reconciler is not running (operator_startup did not run)")
        return self._controller


class _ElectorHolder:
    elector: LeaseElector | None = None


class _NodeMapsHolder:
    maps: NodeMaps | None = None

    def profile_changed(self, namespace: str) -> None:
        if self.maps is not None:
            self.maps.profile_changed(namespace)


CONFIG = _ConfigHolder()
CONTROLLER = _ControllerHolder()
CACHE = Cache()
ELECTOR = _ElectorHolder()
NODE_MAPS = _NodeMapsHolder()
CAPTURES = CaptureCache()  # capture stores and retune sets (handlers/capture.py follows them)
# Artifact ConfigMaps and admitted model pods (handlers/delivery.py follows them).
DELIVERED = DeliveredConfigMaps()
SERVED = ServedPods()


class _EndpointHolder:
    server: capture_endpoint.Server | None = None


ENDPOINT = _EndpointHolder()


class _ReflectorsHolder:
    reflectors: Reflectors | None = None


REFLECTORS = _ReflectorsHolder()


def reflectors(config: Config) -> Reflectors:
    """A reflector per watched kind and namespace (all namespaces: one per kind), each
    feeding its event handler (@reflector.on in handlers/)."""
    spaces: list[str | None] = list(config.namespaces) or [None]
    kinds = list(reflector.HANDLERS.values())
    api = kube.WatchApi(connections=len(spaces) * len(kinds) + 2)
    meta_api = kube.WatchApi(connections=len(spaces) + 2, metadata_only=True)
    tables: dict[str, _Table] = {
        watch.CAPTURE_CONFIGMAPS.name: CAPTURES,
        watch.ARTIFACT_CONFIGMAPS.name: DELIVERED,
        watch.MODEL_PODS.name: SERVED,
    }
    out = []
    for ns in spaces:
        for kind, handler in kinds:
            # Where what this kind's handler keeps is: its own table, or the main cache.
            table: _Table = tables.get(kind.name, CACHE)

            def forget(
                uid: str, kind: reflector.Kind = kind, handler: reflector.Handler = handler,
                table: _Table = table,
            ) -> None:  # fmt: skip
                handler("DELETED", table.stub(kind.name, uid))

            known = functools.partial(table.known, kind.name, ns)
            via = meta_api if kind.metadata_only else api
            out.append(reflector.Reflector(via, kind, ns, handler, reflector.Held(known, forget)))
    return Reflectors(out)


def _compact_tables() -> None:
    for table in (CACHE, DELIVERED, SERVED):
        table.compact()


class _Table(Protocol):
    """What a reflector checks its lists against (cache.Cache, capture.cache.CaptureCache)."""

    def known(self, kind: str, namespace: str | None) -> set[str]: ...

    def stub(self, kind: str, uid: str) -> dict[str, Any]: ...


def follow_child(kind: str, event: str | None, body: dict[str, Any]) -> None:
    """A tuning Job's or pod's watch event (handlers/job.py, pod.py): keep its view in the
    cache, and queue its profile (after a short delay that folds a burst of one object's
    events into one reconcile)."""
    metrics.HANDLER_CALLS.labels(f"{kind[:-1]}_event").inc()
    CACHE.follow(kind, event, body)
    # By the profile the object names: only a trigger, the reconcile reads what is owned.
    meta = body.get("metadata") or {}
    profile = (meta.get("labels") or {}).get(naming.TUNING_PROFILE_LABEL)
    CONTROLLER.get().enqueue_owner(meta.get("namespace"), profile)


@kopf.on.startup()
async def operator_startup(
    settings: kopf.OperatorSettings, logger: kopf.Logger, **kwargs: Any
) -> None:
    config = Config.from_env()
    # kopf watches nothing of ours (runtime/reflector.py does, the kinds of watch.py, feeding
    # handlers/), so it keeps nothing on our objects (no finalizer, no copy of the spec in
    # annotations) and no state of its own about them; it serves the webhook and runs this
    # startup. Events are posted by us, on purpose.
    settings.posting.level = logging.WARNING
    kube.login(pool_size=config.workers + 6)
    controller = Controller(
        config, _indexes(config), workers=config.workers, resync_seconds=config.resync_seconds
    )
    CONFIG.set(config)
    CONTROLLER.set(config, controller)
    # Each kind listed (page by page) into the cache before the reconciler starts: it never
    # takes a Job it has not seen yet for a missing one.
    REFLECTORS.reflectors = reflectors(config).start()
    await asyncio.to_thread(REFLECTORS.reflectors.wait_listed)
    sizes = CACHE.sizes()
    logger.info(
        f"cache primed: {sizes['profiles']} profiles, {sizes['jobs']} tuning Jobs, "
        f"{sizes['pods']} tuning pods"
    )
    controller.start()
    # The node maps pods pick their GPU model by (nodemap.py): written while leading only.
    maps = NodeMaps(CACHE.profiles, CACHE.profile, controller.active)
    NODE_MAPS.maps = maps
    maps.start()
    metrics.REGISTRY.register(
        metrics.IndexCollector(
            statuses=CACHE.statuses,
            queue_depth=controller.queue.pending,
            profiles=_profile_statuses,
            untuned=_untuned_causes,
        )
    )
    metrics.serve(config.metrics_port)
    _elect(config, leaders=(controller, maps))
    if config.webhook_enabled:
        config = await _serve_webhook(settings, config, controller, logger)
    logger.info(
        f"tunefleet operator started: {config.workers} reconcile workers, resync every "
        f"{config.resync_seconds:.0f}s; tuning Jobs use image {config.image}"
    )


def _profile_statuses() -> Iterator[metrics.Profiled]:
    """Each profile's status with its namespace and name, for the per-profile gauges: read
    from the cache's views at scrape time (a view unpacks in microseconds), so nothing is
    kept for the metrics beside what the reconciler keeps already."""
    for key in CACHE.profiles():
        view = CACHE.profile(key)
        if view is not None:  # deleted since the list
            yield key[0], key[1], view.get("status") or {}


def _untuned_causes(namespace: str, profile: str) -> list[str]:
    """Why each of the profile's model pods runs untuned for a cause of ours (served.py)."""
    return [u.cause for u in SERVED.of(namespace, profile)]


def _indexes(config: Config) -> Indexes:
    """What the reconciler reads: the cache and the tables beside it."""
    return Indexes(
        profile=CACHE.profile,
        profiles=CACHE.profiles,
        jobs=CACHE.jobs,
        pods=CACHE.pods,
        untrusted=CACHE.untrusted,
        written=CACHE.written,
        refresh=CACHE.put_profile,
        has_profile=CACHE.has_profile_uid,
        compact=_compact_tables,
        captures=CaptureSource(CAPTURES, ArtifactKeys(config)),
        config_map_uid=DELIVERED.uid_of,
        untuned_pods=SERVED.of,
    )


class _Leads(Protocol):
    """What writes only while this replica leads (the controller, the node maps)."""

    def lead(self) -> None: ...

    def follow(self) -> None: ...


def _elect(config: Config, leaders: tuple[_Leads, ...]) -> None:
    """Lead at once (one replica), or stand for the Lease and lead while holding it."""

    def lead() -> None:
        for part in leaders:
            part.lead()

    def follow() -> None:
        for part in leaders:
            part.follow()

    if not config.lease_namespace:
        lead()  # one replica: nobody to elect
        return
    # Unique per process: a replica restarted in the same pod (same hostname, same PID 1)
    # must not take the dead process's Lease for its own.
    identity = f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    ELECTOR.elector = LeaseElector(
        config.lease_name, config.lease_namespace, identity, Callbacks(lead, follow)
    )
    # Every write of this process passes the Lease's fence first (runtime/client.py,
    # runtime/leader.py).
    kube.set_fence(ELECTOR.elector.fence)
    ELECTOR.elector.start()


async def _serve_webhook(
    settings: kopf.OperatorSettings, config: Config, controller: Controller, logger: kopf.Logger
) -> Config:
    """kopf's webhook server, the capture endpoint beside it, and (out of a cluster) the
    webhook's registration; returns the config with what capture learnt (its URL, CA)."""
    server = webhook_server.build(config)
    settings.admission.server = server
    config = await _start_capture(config, server, logger)
    CONFIG.set(config, controller)
    if config.webhook_register:
        settings.admission.managed = None
        await webhook_server.register_when_ready(settings.admission.server, config, logger)
    return config


def _service_address(service: str) -> str:
    """The cluster IP of the Service (name.namespace) model pods reach the endpoint through:
    for clusters whose pods have no DNS (the sidecar connects there, and checks the
    certificate against the Service's name)."""
    import kubernetes

    name, _, namespace = service.partition(".")
    core = kubernetes.client.CoreV1Api(kube.api())
    svc = core.read_namespaced_service(name, namespace, _request_timeout=kube.REQUEST_TIMEOUT)
    ip = str(svc.spec.cluster_ip or "")
    return "" if ip == "None" else ip


async def _start_capture(config: Config, server: kopf.WebhookServer, logger: kopf.Logger) -> Config:
    """The capture endpoint beside the webhook, with its certificate; and how model pods reach
    it (URL, address, CA), for admission."""
    if not config.capture_port or not (server.certfile and server.pkeyfile):
        return config
    deps = capture_endpoint.real_deps(
        lambda ns, name: CACHE.profile((ns, name)), Writer(), CAPTURES.store
    )
    ENDPOINT.server = capture_endpoint.Server(
        capture_endpoint.Endpoint(deps),
        config.webhook_addr,
        config.capture_port,
        str(server.certfile),
        str(server.pkeyfile),
    )
    try:
        await ENDPOINT.server.start()
    except OSError as e:  # the port is taken: the webhook and reconciler go on without capture
        logger.warning(f"capture endpoint not started on port {config.capture_port}: {e}")
        ENDPOINT.server = None
        return config
    url, address = config.capture_url, config.capture_address
    if not url and config.capture_service:
        name, _, namespace = config.capture_service.partition(".")
        url = f"https://{name}.{namespace}.svc:{config.capture_service_port}"
    if config.capture_service and not address:
        try:
            address = await asyncio.to_thread(_service_address, config.capture_service)
        except Exception as e:
            logger.warning(f"capture: cannot read Service {config.capture_service}: {e}")
    ca = ""
    bundle = [server.cafile] if server.cafile else []
    if server.certfile:
        bundle.append(str(Path(str(server.certfile)).with_name("ca-previous.crt")))
    for path in bundle:
        with contextlib.suppress(OSError):
            ca += Path(str(path)).read_text()
    if url:
        logger.info(
            f"capture endpoint for model pods: {url}" + (f" ({address})" if address else "")
        )
    return replace(config, capture_url=url, capture_address=address, capture_ca=ca)


@kopf.on.cleanup()
async def operator_cleanup(**_: Any) -> None:
    if REFLECTORS.reflectors is not None:
        REFLECTORS.reflectors.stop()
    if ELECTOR.elector is not None:
        # Hand the Lease over at once rather than after it expires.
        await asyncio.to_thread(ELECTOR.elector.stop, True)
    with contextlib.suppress(RuntimeError):  # startup never got that far
        CONTROLLER.get().stop()
    if NODE_MAPS.maps is not None:
        NODE_MAPS.maps.stop()
    if ENDPOINT.server is not None:
        await ENDPOINT.server.stop()
