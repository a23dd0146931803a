"""The Operator, which owns the process, and kopf's startup and cleanup handlers, which hand
it kopf's settings and stop it: kopf settings, API login, the webhook server, the reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import kopf

from tunefleet import kube, metrics, naming
from tunefleet.capture import endpoint as capture_endpoint
from tunefleet.capture.keys import ArtifactKeys
from tunefleet.capture.retune_sets import Writer
from tunefleet.capture.retune_sets_cache import CaptureCache
from tunefleet.capture.step import CaptureSource
from tunefleet.config import Config
from tunefleet.placement.gate import Gate, node_gpus
from tunefleet.placement.nodemap_keeper import NodeMaps
from tunefleet.reconciler.controller import Controller, Indexes
from tunefleet.reconciler.reconcile import sync_profile
from tunefleet.runtime import reflector
from tunefleet.runtime.leader import Callbacks, LeaseElector
from tunefleet.runtime.reflector import Reflectors
from tunefleet.serving.delivered import DeliveredConfigMaps
from tunefleet.serving.served import ServedPods
from tunefleet.watched import kinds
from tunefleet.watched.cache import ProfileCache
from tunefleet.webhook import server as webhook_server


class Operator:
    """The one object that owns the process: the client (its connection, fence and Event
    poster), the configuration, the cache and the tables beside it, and the parts started
    at start-up (reflectors, controller, node maps, elector, capture endpoint). __main__ makes
    it and hands it to kopf in the root memo, which kopf hands (a shallow copy of it) to every
    handler: kopf's handlers reach it as `memo.operator`, the reflectors' handlers are bound
    to it (reflectors()); everything below them is handed what it uses. Tests hand it its
    parts (a fake client, a config, a stand-in controller) rather than patching a global."""

    def __init__(
        self,
        client: kube.Kube | None = None,
        config: Config | None = None,
        *,
        cache: ProfileCache | None = None,
        delivered: DeliveredConfigMaps | None = None,
        controller: Controller | None = None,
        node_maps: NodeMaps | None = None,
    ) -> None:
        # Logs in on first use (start() sizes the pool).
        self.client = client if client is not None else kube.Kube()
        self._config = config
        self._controller = controller
        self.cache = cache if cache is not None else ProfileCache()
        self.captures = CaptureCache()  # capture stores and retune sets (handlers/on_capture.py)
        # Artifact ConfigMaps and admitted model pods (handlers/on_delivery.py follows them).
        self.delivered = delivered if delivered is not None else DeliveredConfigMaps()
        self.served = ServedPods()
        self.elector: LeaseElector | None = None
        self.node_maps = node_maps
        self.endpoint: capture_endpoint.Server | None = None
        self.reflectors: Reflectors | None = None
        # What startup left running: the reconciler's start once the caches are listed.
        self.started: asyncio.Task[None] | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = Config.from_env()
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        self._config = config

    @property
    def controller(self) -> Controller:
        if self._controller is None:
            raise RuntimeError("the reconciler is not running (operator_startup did not run)")
        return self._controller

    @controller.setter
    def controller(self, controller: Controller) -> None:
        self._controller = controller

    def profile_changed(self, namespace: str, name: str) -> None:
        if self.node_maps is not None:
            self.node_maps.profile_changed(namespace, name)

    def follow_child(self, kind: str, event: str | None, body: dict[str, Any]) -> None:
        """A tuning Job's or pod's watch event (handlers/on_job.py, on_pod.py): keep its view in the
        cache, and queue its profile (after a short delay that folds a burst of one object's
        events into one reconcile)."""
        metrics.HANDLER_CALLS.labels(f"{kind[:-1]}_event").inc()
        changed = self.cache.follow(kind, event, body)
        gate = self.controller.gate
        if gate is not None:
            (gate.follow_job if kind == "jobs" else gate.follow_pod)(event, body)
        if not changed or (kind == "jobs" and self.controller.echoes_made(event, body)):
            # Nothing the reconcile reads moved (the Job controller marking a held Job
            # Suspended, a pod's status field no view keeps), or it is the echo of a Job the
            # reconcile that made it has observed already: no reconcile for it.
            return
        # By the profile the object names: only a trigger, the reconcile reads what is owned.
        meta = body.get("metadata") or {}
        profile = (meta.get("labels") or {}).get(naming.TUNING_PROFILE_LABEL)
        self.controller.enqueue_owner(meta.get("namespace"), profile)

    # --- start and stop -------------------------------------------------------------------

    async def start(self, settings: kopf.OperatorSettings, logger: kopf.Logger) -> None:
        """Log in, start the reflectors and (while the caches fill) the webhook and capture;
        the reconciler starts once every kind is listed (_start_when_listed)."""
        config = Config.from_env() if self._config is None else self._config
        # kopf watches nothing of ours (runtime/reflector.py does, watched/kinds.py, feeding
        # handlers/), so it keeps nothing on our objects (no finalizer, no copy of the spec in
        # annotations) and no state of its own about them; it serves the webhook and runs this
        # startup. Events are posted by us, on purpose.
        settings.posting.level = logging.WARNING
        self.client.login(pool_size=config.workers + 6)
        if config.fleet or config.signing_key_dir:
            # Claims and published entries name this cluster (fleet/), and so do the
            # operator's attestations (signer/): learnt once, before any reconcile could claim
            # under an empty name.
            uid = await asyncio.to_thread(self.client.cluster_uid)
            config = replace(config, fleet_cluster=uid)
            logger.info(f"this cluster is {uid} (kube-system's uid)")
            # The stores are the profiles' (spec.storage: a bucket, an endpoint or the
            # default one): each is probed at its first claim (fleet/probe.py), which for every
            # profile listed is its first reconcile, right after this start.
            logger.info(
                "fleet mode: each store's conditional writes (If-None-Match, If-Match) are "
                "probed before the first claim through it; a store that ignores them is not "
                "coordinated through (its profiles tune their own, and say why)"
            )
        # The reconcile the engine runs is handed to it: the engine imports none.
        controller = Controller(
            self.client, config, self._indexes(config), sync_profile, workers=config.workers
        )
        self.config = config
        self.controller = controller
        self.reflectors = listing = self.watch(config).start()
        if config.webhook_enabled:
            # Admission and capture listen while the caches fill: each asks the API server for
            # a profile the cache does not hold yet (handlers/on_pod.py, capture/endpoint.py), so a
            # restart beside 10,000 profiles takes admissions in seconds, not after every list.
            config = await self._serve_webhook(settings, config, controller, logger)
            # What the endpoint's start learnt (its URL, address, CA) reaches the reconcile
            # before it starts: tuning Jobs of profiles the operator signs for are pointed at
            # it (builders/storage.operator_signs).
            controller.config = config
        # kopf starts the webhook server once startup returns; the rest waits for the lists.
        self.started = asyncio.create_task(
            self._start_when_listed(listing, config, controller, logger)
        )

    async def stop(self) -> None:
        """Stop what start() started, as far as it got."""
        if self.started is not None:
            self.started.cancel()
        if self.reflectors is not None:
            self.reflectors.stop()
        if self.elector is not None:
            # Hand the Lease over at once rather than after it expires.
            await asyncio.to_thread(self.elector.stop, True)
        if self._controller is not None:
            self._controller.stop()
        if self.node_maps is not None:
            self.node_maps.stop()
        if self.endpoint is not None:
            await self.endpoint.stop()

    def watch(self, config: Config) -> Reflectors:
        """A reflector per watched kind and namespace (all namespaces: one per kind), each
        feeding its event handler (@reflector.on in handlers/), bound to this operator."""
        spaces: list[str | None] = list(config.namespaces) or [None]
        handled = list(reflector.HANDLERS.values())
        api = self.client.watch_api(len(spaces) * len(handled) + 2)
        meta_api = self.client.watch_api(len(spaces) + 2, metadata_only=True)
        tables: dict[str, _Table] = {
            kinds.CAPTURE_CONFIGMAPS.name: self.captures,
            kinds.ARTIFACT_CONFIGMAPS.name: self.delivered,
            kinds.MODEL_PODS.name: self.served,
        }
        out = []
        for ns in spaces:
            for kind, registered in handled:
                handler: reflector.Handler = functools.partial(registered, self)
                # Where what this kind's handler keeps is: its own table, or the main cache.
                table: _Table = tables.get(kind.name, self.cache)

                def forget(
                    uid: str, kind: reflector.Kind = kind, handler: reflector.Handler = handler,
                    table: _Table = table,
                ) -> None:  # fmt: skip
                    handler("DELETED", table.stub(kind.name, uid))

                known = functools.partial(table.known, kind.name, ns)
                via = meta_api if kind.metadata_only else api
                held = reflector.Held(known, forget)
                out.append(reflector.Reflector(via, kind, ns, handler, held))
        return Reflectors(out)

    async def _start_when_listed(
        self, listing: _Listed, config: Config, controller: Controller, logger: kopf.Logger
    ) -> None:
        """Each kind listed (page by page) into the cache before the reconciler starts: it
        never takes a Job it has not seen yet for a missing one. A failure here ends the
        process (the kubelet restarts it): an operator that admits but never reconciles must
        not go on."""
        try:
            await asyncio.to_thread(listing.wait_listed)
            sizes = self.cache.sizes()
            logger.info(
                f"cache primed: {sizes['profiles']} profiles, {sizes['jobs']} tuning Jobs, "
                f"{sizes['pods']} tuning pods"
            )
            controller.start()
            # The node maps pods pick their GPU model by (placement/nodemap_keeper.py): written
            # while leading.
            cache = self.cache
            maps = NodeMaps(self.client, cache.profiles, cache.profile, controller.active)
            self.node_maps = maps
            maps.start()
            metrics.REGISTRY.register(self.index_collector(config, controller.queue.pending))
            metrics.serve(config.metrics_port)
            self._elect(config, leaders=(controller, maps))
        except Exception:  # not a cancellation (a BaseException): stop() cancels this task
            logger.exception("the operator could not start its reconciler; it stops")
            os.kill(os.getpid(), signal.SIGTERM)
            return
        logger.info(
            f"tunefleet operator started: {config.workers} reconcile workers, resync every "
            f"{config.resync_seconds:.0f}s; tuning Jobs use image {config.image}"
        )

    # --- what the reconciler and the metrics read -----------------------------------------

    def _compact_tables(self) -> None:
        for table in (self.cache, self.delivered, self.served):
            table.compact()

    def _gpu_gate(self) -> Gate:
        """The GPU gate, its pools' GPUs read from their nodes (what they advertise)."""
        client = self.client
        return Gate(lambda pool: node_gpus(client.list_nodes(pool.selector), pool.resource))

    def index_collector(
        self, config: Config, queue_depth: Callable[[], int]
    ) -> metrics.IndexCollector:
        """The gauges computed at scrape time from the cache: the fleet's always, each
        profile's only when asked for (config.profile_metrics): their series grow with the
        profiles."""
        statuses = self.cache.statuses
        if not config.profile_metrics:
            return metrics.IndexCollector(statuses=statuses, queue_depth=queue_depth)
        return metrics.IndexCollector(
            statuses=statuses,
            queue_depth=queue_depth,
            profiles=self.profile_statuses,
            untuned=self.untuned_causes,
        )

    def profile_statuses(self) -> Iterator[metrics.Profiled]:
        """Each profile's status with its namespace and name, for the per-profile gauges: read
        from the cache's views at scrape time (a view unpacks in microseconds), so nothing is
        kept for the metrics beside what the reconciler keeps already."""
        for key in self.cache.profiles():
            view = self.cache.profile(key)
            if view is not None:  # deleted since the list
                yield key[0], key[1], view.get("status") or {}

    def untuned_causes(self, namespace: str, profile: str) -> list[str]:
        """Why each of the profile's model pods runs untuned for a cause of ours (served.py)."""
        return [u.cause for u in self.served.of(namespace, profile)]

    def _indexes(self, config: Config) -> Indexes:
        """What the reconciler reads: the cache and the tables beside it."""
        cache = self.cache
        return Indexes(
            profile=cache.profile,
            profiles=cache.profiles,
            jobs=cache.jobs,
            pods=cache.pods,
            untrusted=cache.untrusted,
            written=cache.written,
            refresh=cache.put_profile,
            has_profile=cache.has_profile_uid,
            compact=self._compact_tables,
            captures=CaptureSource(self.captures, ArtifactKeys(self.client, config)),
            config_map_uid=self.delivered.uid_of,
            untuned_pods=self.served.of,
            gate=self._gpu_gate() if config.gpu_gate else None,
        )

    # --- leading --------------------------------------------------------------------------

    def _elect(self, config: Config, leaders: tuple[_Leads, ...]) -> None:
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
        host = os.environ.get("HOSTNAME") or socket.gethostname()
        identity = f"{host}_{uuid.uuid4().hex[:8]}"
        elector = LeaseElector(
            config.lease_name,
            config.lease_namespace,
            identity,
            Callbacks(lead, follow),
            self.client,
        )
        self.elector = elector
        # Every write of this process passes the Lease's fence first (runtime/client.py,
        # runtime/leader.py).
        self.client.set_fence(elector.fence)
        elector.start()

    # --- the webhook and capture ----------------------------------------------------------

    async def _serve_webhook(
        self,
        settings: kopf.OperatorSettings,
        config: Config,
        controller: Controller,
        logger: kopf.Logger,
    ) -> Config:
        """kopf's webhook server, the capture endpoint beside it, and (out of a cluster) the
        webhook's registration; returns the config with what capture learnt (its URL, CA)."""
        server = webhook_server.build(config)
        settings.admission.server = server
        config = await self._start_capture(config, server, logger)
        self.config = config
        if config.webhook_register:
            settings.admission.managed = None
            await webhook_server.register_when_ready(
                self.client, settings.admission.server, config, logger
            )
        return config

    def _service_address(self, service: str) -> str:
        """The cluster IP of the Service (name.namespace) model pods reach the endpoint
        through: for clusters whose pods have no DNS (the sidecar connects there, and checks
        the certificate against the Service's name)."""
        name, _, namespace = service.partition(".")
        core = self.client.core()
        svc = core.read_namespaced_service(name, namespace, _request_timeout=kube.REQUEST_TIMEOUT)
        ip = str(svc.spec.cluster_ip or "")
        return "" if ip == "None" else ip

    def _signer_routes(self, config: Config) -> list[Any]:
        """The signing endpoint's routes, where the operator signs (signer/)."""
        if not config.signing_key_dir:
            return []
        from tunefleet.signer import route as signer_route

        cache = self.cache
        deps = signer_route.real_deps(
            self.client,
            lambda ns, name: cache.profile((ns, name)),
            oci_config=config.oci_config,
        )
        signer = signer_route.Signer(_signing_key(config), config.image, config.fleet_cluster)
        routes = signer_route.Endpoint(deps, signer).routes()
        if config.store_broker:
            from tunefleet.contracts import store_broker
            from tunefleet.signer import store_route

            store_deps = signer_route.real_deps(
                self.client, lambda ns, name: cache.profile((ns, name)), store_broker.AUDIENCE
            )
            presigner = store_route.Presigner.from_env(
                config.default_s3_endpoint, config.delivery_timeout_s
            )
            broker = store_route.StoreEndpoint(
                store_deps, presigner, config.image, config.library_scope
            )
            routes += broker.routes()
        if config.registry_broker_config:
            from tunefleet.contracts import store_broker
            from tunefleet.signer import registry_route

            proxy_deps = signer_route.real_deps(
                self.client, lambda ns, name: cache.profile((ns, name)), store_broker.AUDIENCE
            )
            # A docker config that cannot be read stops the start, saying what to fix.
            try:
                identity = registry_route.Identity.load(config.registry_broker_config)
            except ValueError as e:
                raise RuntimeError(
                    f"signing.registryCredentialsSecret: {e} (give a kubernetes.io/"
                    "dockerconfigjson Secret whose auths name the oci:// stores' registries)"
                ) from None
            if not identity.auths:
                logging.getLogger(__name__).warning(
                    "signing.registryCredentialsSecret names no registry credentials: oci:// "
                    "tuning pods keep their profile's Secret"
                )
            proxy = registry_route.RegistryProxy(
                proxy_deps, identity, config.image, config.library_scope
            )
            routes += proxy.routes()
        return routes

    async def _start_capture(
        self, config: Config, server: kopf.WebhookServer, logger: kopf.Logger
    ) -> Config:
        """The capture endpoint beside the webhook, with its certificate; and how model pods
        reach it (URL, address, CA), for admission."""
        if not config.capture_port or not (server.certfile and server.pkeyfile):
            return config
        cache = self.cache
        deps = capture_endpoint.real_deps(
            self.client,
            lambda ns, name: cache.profile((ns, name)),
            Writer(self.client),
            self.captures.store,
        )
        endpoint = capture_endpoint.Server(
            capture_endpoint.Endpoint(deps),
            config.webhook_addr,
            config.capture_port,
            str(server.certfile),
            str(server.pkeyfile),
            more=self._signer_routes(config),
        )
        try:
            await endpoint.start()
        except OSError as e:  # the port is taken: the webhook and reconciler go on without it
            logger.warning(f"capture endpoint not started on port {config.capture_port}: {e}")
            return config
        self.endpoint = endpoint
        url, address = config.capture_url, config.capture_address
        if not url and config.capture_service:
            name, _, namespace = config.capture_service.partition(".")
            url = f"https://{name}.{namespace}.svc:{config.capture_service_port}"
        if config.capture_service and not address:
            try:
                address = await asyncio.to_thread(self._service_address, config.capture_service)
            except Exception as e:
                logger.warning(f"capture: cannot read Service {config.capture_service}: {e}")
        if url:
            where = f" ({address})" if address else ""
            logger.info(f"capture endpoint for model pods: {url}{where}")
        ca = _ca_bundle(server)
        return replace(config, capture_url=url, capture_address=address, capture_ca=ca)


def _signing_key(config: Config) -> Any:
    """The operator's signing key (the chart's signing.secret); a key that cannot be read stops
    the start with what to fix, rather than failing every tuning Job's publish later."""
    from tunefleet.artifacts import signing

    try:
        return signing.read_key_dir(Path(config.signing_key_dir))
    except signing.SigningError as e:
        raise SystemExit(
            f"the chart's signing.secret (mounted at {config.signing_key_dir}): {e}"
        ) from None


def _ca_bundle(server: kopf.WebhookServer) -> str:
    """The CA model pods check the capture endpoint against: the webhook's, and the one before
    it while a rotation is under way (ca-previous.crt beside the certificate)."""
    ca = ""
    bundle = [server.cafile] if server.cafile else []
    if server.certfile:
        bundle.append(str(Path(str(server.certfile)).with_name("ca-previous.crt")))
    for path in bundle:
        with contextlib.suppress(OSError):
            ca += Path(str(path)).read_text()
    return ca


class _Table(Protocol):
    """What a reflector checks its lists against (cache.Cache,
    capture.retune_sets_cache.CaptureCache)."""

    def known(self, kind: str, namespace: str | None) -> set[str]: ...

    def stub(self, kind: str, uid: str) -> dict[str, Any]: ...


class _Listed(Protocol):
    """What the reconciler's start waits on (runtime/reflector.Reflectors)."""

    def wait_listed(self, timeout: float | None = None) -> bool: ...


class _Leads(Protocol):
    """What writes only while this replica leads (the controller, the node maps)."""

    def lead(self) -> None: ...

    def follow(self) -> None: ...


# kopf's handlers: module functions (kopf registers them so), each handing its work to the
# Operator that kopf's memo carries (__main__ puts it there; kopf hands every handler a
# shallow copy of that memo, so they all reach the one Operator).


@kopf.on.startup()
async def operator_startup(
    settings: kopf.OperatorSettings, logger: kopf.Logger, memo: kopf.Memo, **_: Any
) -> None:
    await memo.operator.start(settings, logger)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.operator.stop()
