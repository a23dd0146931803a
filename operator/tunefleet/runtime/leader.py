"""Leader election on a coordination.k8s.io Lease: one replica reconciles, all serve admission.

Every replica watches and indexes (so a takeover starts warm) and answers the webhook (so a
replica going away never leaves labelled pods untuned); only the holder of the Lease runs
the reconcile workers. The holder renews every `retry` seconds; a Lease not renewed for
`duration` seconds is taken over by another replica (client-go's algorithm: optimistic
concurrency on the Lease's resourceVersion, clock-free: a candidate waits `duration` from the
moment it last saw the record change). A replica that stops cleanly releases the Lease, so
the next one takes over at once.

The fence: a holder may write only until `renew_deadline` after it *began* its last successful
renewal (the API server applied it later than that, so no other replica can take the Lease
before `duration` after it). Every Lease call times out well inside that, so a hung
connection cannot hold the loop; writes ask `fence()` how long they may take (client.py), and
stop being made at the deadline even if this thread is stuck. The gap between `renew_deadline`
and `duration` is the longest a write in flight may still land.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from tunefleet.runtime.client import Client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    duration: float = 10.0  # a Lease older than this is up for grabs
    # The holder writes only this long after the start of its last good renewal, and steps
    # down when it passes; duration - renew_deadline bounds a write still in flight.
    renew_deadline: float = 7.0
    retry: float = 2.0  # how often to try to acquire or renew
    call_timeout: float = 2.0  # each Lease read or write: well inside renew_deadline


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Callbacks:
    """What the elector calls as it starts and stops leading (client-go's LeaderCallbacks)."""

    on_started: Callable[[], None]
    on_stopped: Callable[[], None]


class LeaseElector:
    def __init__(
        self,
        name: str,
        namespace: str,
        identity: str,
        callbacks: Callbacks,
        client: Client,  # the process's: its Lease calls and, in turn, its writes' fence
        timing: Timing | None = None,
    ) -> None:
        self.name, self.namespace, self.identity = name, namespace, identity
        self.on_started, self.on_stopped = callbacks.on_started, callbacks.on_stopped
        self.timing = timing or Timing()
        self._api = client.coordination()
        self._leading = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The record as last seen, and when (monotonic): the expiry clock of others' leases.
        self._seen: tuple[str, str] | None = None
        self._seen_at = 0.0
        self._renewed_at = 0.0
        self._valid_until = 0.0  # monotonic: the fence (see the module docstring)

    @property
    def leading(self) -> bool:
        return self._leading

    def fence(self) -> float:
        """Seconds this replica may still write: 0 unless it leads and renewed in time."""
        if not self._leading:
            return 0.0
        return max(self._valid_until - time.monotonic(), 0.0)

    def coordination(self) -> Any:
        return self._api

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timing.retry + 5)
        if release and self._leading:
            self._release()
        self._set_leading(False)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                got = self.try_acquire_or_renew()
            except Exception as e:  # the API is unreachable, RBAC, ...: not the holder's fault
                log.warning(f"leader election: {e}")
                got = False
            if got:
                self._renewed_at = time.monotonic()
                self._valid_until = began + self.timing.renew_deadline
                self._set_leading(True)
            elif self._leading and time.monotonic() >= self._valid_until:
                log.warning("leader election: could not renew the Lease in time; stepping down")
                self._set_leading(False)
            self._stop.wait(self.timing.retry)

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        log.info(f"leader election: {self.identity} {'leads' if leading else 'follows'}")
        (self.on_started if leading else self.on_stopped)()

    def _body(self, resource_version: str | None, transitions: int) -> dict[str, Any]:
        now = _now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.timing.duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def try_acquire_or_renew(self) -> bool:
        api = self.coordination()
        try:
            lease = api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.timing.call_timeout
            )
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                api.create_namespaced_lease(
                    self.namespace, self._body(None, 0), _request_timeout=self.timing.call_timeout
                )
            except ApiException as ce:
                if ce.status == 409:
                    return False  # another replica created it first
                raise
            return True
        spec = lease.spec
        holder = spec.holder_identity or ""
        record = (holder, str(spec.renew_time))
        if record != self._seen:
            self._seen, self._seen_at = record, time.monotonic()
        duration = float(spec.lease_duration_seconds or self.timing.duration)
        held = holder and holder != self.identity
        if held and time.monotonic() - self._seen_at < duration:
            return False  # held and renewed recently (by our own clock)
        transitions = int(spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        body = self._body(lease.metadata.resource_version, transitions)
        if holder == self.identity and spec.acquire_time is not None:
            body["spec"]["acquireTime"] = spec.acquire_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self.timing.call_timeout
            )
        except ApiException as e:
            if e.status == 409:
                return False  # someone else wrote it between our read and write
            raise
        return True

    def _release(self) -> None:
        try:
            api = self.coordination()
            lease = api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.timing.call_timeout
            )
            if lease.spec.holder_identity != self.identity:
                return
            body = self._body(
                lease.metadata.resource_version, int(lease.spec.lease_transitions or 0)
            )
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self.timing.call_timeout
            )
            log.info("leader election: released the Lease")
        except Exception as e:
            log.info(f"leader election: could not release the Lease: {e}")
