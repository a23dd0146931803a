"""The one startup handler: kopf settings, API login, the webhook server, the reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import kopf

from tunefleet import kube, metrics, naming
from tunefleet.cache import Cache
from tunefleet.capture import endpoint as capture_endpoint
from tunefleet.capture.cache import CaptureCache
from tunefleet.capture.keys import ArtifactKeys
from tunefleet.capture.step import CaptureSource
from tunefleet.capture.store import ROLE_CAPTURE, ROLE_RETUNE, Writer
from tunefleet.config import Config
from tunefleet.controller import Controller, Indexes
from tunefleet.leader import LeaseElector
from tunefleet.nodemap import NodeMaps
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
# Capture stores and retune sets: the ConfigMaps the capture watch selects, server-side.
CAPTURE_SELECTOR = (
    ",".join(f"{k}={v}" for k, v in naming.MANAGED_BY.items())
    + f",{naming.ROLE_LABEL} in ({ROLE_CAPTURE},{ROLE_RETUNE})"
)


class _EndpointHolder:
    server: capture_endpoint.Server | None = None


ENDPOINT = _EndpointHolder()


def _prime(config: Config) -> None:
    """One paginated list of each watched kind, before the reconciler runs: it never takes
    a Job it has not seen yet for a missing one."""
    managed = ",".join(f"{k}={v}" for k, v in naming.MANAGED_BY.items())
    selector = f"{managed},{naming.PROFILE_UID_LABEL}"
    spaces: list[str | None] = list(config.namespaces) or [None]

    def each(kind: str, labels: str = "") -> Iterator[dict[str, Any]]:
        for ns in spaces:
            yield from kube.list_all(kind, labels, ns)

    CACHE.prime(
        lambda: each("tuningprofiles"),
        lambda: each("jobs", selector),
        lambda: each("pods", selector),
    )
    # Before the reconciler too: what a retune froze is read from here.
    CAPTURES.prime(each("configmaps", CAPTURE_SELECTOR))


# Tuning Jobs and their pods carry these; model pods carry tunefleet.io/profile instead.
CHILD_LABELS: dict[str, Any] = {
    naming.MANAGED_KEY: naming.MANAGED_VALUE,
    naming.PROFILE_UID_LABEL: kopf.PRESENT,
}


def follow_child(kind: str, event: str | None, body: kopf.Body) -> None:
    """A tuning Job's or pod's watch event (handlers/job.py, pod.py): keep its view in the
    cache, and queue its profile (after a short delay that folds a burst of one object's
    events into one reconcile)."""
    metrics.HANDLER_CALLS.labels(f"{kind[:-1]}_event").inc()
    CACHE.follow(kind, event, dict(body))
    # By the profile the object names: only a trigger, the reconcile reads what is owned.
    profile = body.metadata.labels.get(naming.TUNING_PROFILE_LABEL)
    CONTROLLER.get().enqueue_owner(body.metadata.namespace, profile)


@kopf.on.startup()
async def operator_startup(
    settings: kopf.OperatorSettings, logger: kopf.Logger, **kwargs: Any
) -> None:
    config = Config.from_env()
    # kopf keeps nothing on our objects: no finalizer (deletion always works, whatever the
    # reconciler's state) and no copy of the spec in annotations (no 256 KiB limit): all
    # handlers are event handlers, and the reconciler is level-based.
    # Earlier versions added this finalizer; naming it lets kopf remove it from their profiles.
    settings.persistence.finalizer = "tunefleet.io/finalizer"
    # Only what we cache crosses the wire: tuning Jobs and tuning pods, selected server-side.
    managed = ",".join(f"{k}={v}" for k, v in naming.MANAGED_BY.items())
    settings.watching.label_selectors["batch", "v1", "jobs"] = managed
    settings.watching.label_selectors["", "v1", "pods"] = f"{managed},{naming.PROFILE_UID_LABEL}"
    settings.watching.label_selectors["", "v1", "configmaps"] = CAPTURE_SELECTOR
    # kopf's own per-object log lines stay in the log; Events are posted by us, on purpose.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # Memory (1,000 profiles, Jobs and pods, restart: 291 MiB peak, 261 settled before):
    # kopf keeps each object's worker, and with it that object's last event, 5 s after its
    # last event; after a restart's listing that is every object at once. 0.5 s: 225 / 195.
    settings.batching.idle_timeout = 0.5
    # Its initial listing in pages, as ours (kube.LIST_PAGE).
    settings.watching.chunk_size = kube.LIST_PAGE
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    kube.login(pool_size=config.workers + 6)
    indexes = Indexes(
        profile=CACHE.profile,
        profiles=CACHE.profiles,
        jobs=CACHE.jobs,
        pods=CACHE.pods,
        untrusted=CACHE.untrusted,
        written=CACHE.written,
        refresh=CACHE.put_profile,
        captures=CaptureSource(CAPTURES, ArtifactKeys(config)),
    )
    controller = Controller(
        config, indexes, workers=config.workers, resync_seconds=config.resync_seconds
    )
    CONFIG.set(config)
    CONTROLLER.set(config, controller)
    await asyncio.to_thread(_prime, config)
    controller.start()
    # The node maps pods pick their GPU model by (nodemap.py): written while leading only.
    maps = NodeMaps(CACHE.profiles, CACHE.profile, controller.active)
    NODE_MAPS.maps = maps
    maps.start()

    def lead() -> None:
        controller.lead()
        maps.lead()

    def follow() -> None:
        controller.follow()
        maps.follow()

    metrics.REGISTRY.register(
        metrics.IndexCollector(statuses=CACHE.statuses, queue_depth=controller.queue.pending)
    )
    metrics.serve(config.metrics_port)
    if config.lease_namespace:
        # Unique per process: a replica restarted in the same pod (same hostname, same PID 1)
        # must not take the dead process's Lease for its own.
        identity = f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        ELECTOR.elector = LeaseElector(
            config.lease_name,
            config.lease_namespace,
            identity,
            on_started=lead,
            on_stopped=follow,
        )
        # Every write of this process passes the Lease's fence first (kube.py, leader.py).
        kube.set_fence(ELECTOR.elector.fence)
        ELECTOR.elector.start()
    else:
        lead()  # one replica: nobody to elect
    if config.webhook_enabled:
        server = webhook_server.build(config)
        settings.admission.server = server
        config = await _start_capture(config, server, logger)
        CONFIG.set(config, controller)
        if config.webhook_register:
            settings.admission.managed = None
            await webhook_server.register_when_ready(settings.admission.server, config, logger)
    logger.info(
        f"tunefleet operator started: {config.workers} reconcile workers, resync every "
        f"{config.resync_seconds:.0f}s; tuning Jobs use image {config.image}"
    )


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
    if ELECTOR.elector is not None:
        # Hand the Lease over at once rather than after it expires.
        await asyncio.to_thread(ELECTOR.elector.stop, True)
    with contextlib.suppress(RuntimeError):  # startup never got that far
        CONTROLLER.get().stop()
    if NODE_MAPS.maps is not None:
        NODE_MAPS.maps.stop()
    if ENDPOINT.server is not None:
        await ENDPOINT.server.stop()
