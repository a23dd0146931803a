"""The one startup handler: kopf settings, API login, the webhook server, the reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import uuid
from typing import Any

import kopf

from tunefleet import kube, metrics, naming, watch
from tunefleet.cache import Cache
from tunefleet.config import Config
from tunefleet.controller import Controller, Indexes
from tunefleet.leader import LeaseElector
from tunefleet.watch import Reflectors
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


CONFIG = _ConfigHolder()
CONTROLLER = _ControllerHolder()
CACHE = Cache()
ELECTOR = _ElectorHolder()


class _ReflectorsHolder:
    reflectors: Reflectors | None = None


REFLECTORS = _ReflectorsHolder()


def reflectors(config: Config) -> Reflectors:
    """A reflector per watched kind and namespace (all namespaces: one per kind), each
    feeding its event handler (@watch.on in handlers/)."""
    spaces: list[str | None] = list(config.namespaces) or [None]
    kinds = list(watch.HANDLERS.values())
    api = kube.WatchApi(connections=len(spaces) * len(kinds) + 2)
    out = []
    for ns in spaces:
        for kind, handler in kinds:

            def forget(uid: str, kind: watch.Kind = kind, handler: watch.Handler = handler) -> None:
                handler("DELETED", CACHE.stub(kind.name, uid))

            known = functools.partial(CACHE.known, kind.name, ns)
            out.append(watch.Reflector(api, kind, ns, handler, known, forget))
    return Reflectors(out)


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
    # kopf watches nothing of ours (watch.py does: its reflectors feed handlers/), so it keeps
    # nothing on our objects (no finalizer, no copy of the spec in annotations) and no state
    # of its own about them; it serves the webhook and runs this startup. Events are posted
    # by us, on purpose.
    settings.posting.level = logging.WARNING
    kube.login(pool_size=config.workers + 6)
    indexes = Indexes(
        profile=CACHE.profile,
        profiles=CACHE.profiles,
        jobs=CACHE.jobs,
        pods=CACHE.pods,
        untrusted=CACHE.untrusted,
        written=CACHE.written,
        refresh=CACHE.put_profile,
        has_profile=CACHE.has_profile_uid,
    )
    controller = Controller(
        config, indexes, workers=config.workers, resync_seconds=config.resync_seconds
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
            on_started=controller.lead,
            on_stopped=controller.follow,
        )
        # Every write of this process passes the Lease's fence first (kube.py, leader.py).
        kube.set_fence(ELECTOR.elector.fence)
        ELECTOR.elector.start()
    else:
        controller.lead()  # one replica: nobody to elect
    if config.webhook_enabled:
        settings.admission.server = webhook_server.build(config)
        if config.webhook_register:
            settings.admission.managed = None
            await webhook_server.register_when_ready(settings.admission.server, config, logger)
    logger.info(
        f"tunefleet operator started: {config.workers} reconcile workers, resync every "
        f"{config.resync_seconds:.0f}s; tuning Jobs use image {config.image}"
    )


@kopf.on.cleanup()
async def operator_cleanup(**_: Any) -> None:
    if REFLECTORS.reflectors is not None:
        REFLECTORS.reflectors.stop()
    if ELECTOR.elector is not None:
        # Hand the Lease over at once rather than after it expires.
        await asyncio.to_thread(ELECTOR.elector.stop, True)
    with contextlib.suppress(RuntimeError):  # startup never got that far
        CONTROLLER.get().stop()
