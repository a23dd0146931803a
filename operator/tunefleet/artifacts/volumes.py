"""Whether a volume image (oci:// stores) may be mounted by model pods: its signature by the
profile's public key over exactly that digest, then its content against the artifact's pins.

One check, two callers. The operator's delivery runs it before status says `ImageVolume`;
admission runs it (or finds its recent verdict) before a pod mounts the digest, since status
is shown, never trusted: anyone who can write a profile's status could name any digest of the
repository there. A verdict is kept TTL_S seconds under (digest, key, policy): a changed public
key or policy is another entry, so it takes effect for the very next pod; a signature removed
from the registry stops new mounts within TTL_S.

The public key has one source, `spec.storage.signing.publicKey` (cosign.pub's PEM): the
operator verifies with it and model pods' fetch gets it from admission (never a Secret: the
signing Secret holds the publisher's key pair, read by tuning Jobs alone).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tunefleet.artifacts.fetch import FetchError
from tunefleet.config import Config
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import StoreError, StoreOptions

TTL_S = 60.0
# Checks run at once for admission: a burst of pods needing several digests checks them side by
# side, never one after another; more distinct digests than this wait their turn.
MAX_CHECKS = 8


@dataclass(frozen=True)
class VolumeVerdict:
    mountable: bool
    signed: bool  # a signature by the key verified (Optional may mount an unsigned one)
    reason: str = ""  # why not mountable, or why unsigned


def key_id(public_key: str) -> str:
    """The key as a verdict's key: its PEM's SHA-256 ("" for none)."""
    text = "".join(public_key.split())
    return hashlib.sha256(text.encode()).hexdigest() if text else ""


class Verdicts:
    """Recent verdicts by (digest, key, policy), kept TTL_S seconds."""

    def __init__(self, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._ttl, self._clock = ttl_s, clock
        self._kept: dict[tuple[str, str, bool], tuple[float, VolumeVerdict]] = {}

    def get(self, digest: str, public_key: str, required: bool) -> VolumeVerdict | None:
        key = (digest, key_id(public_key), required)
        with self._lock:
            got = self._kept.get(key)
            if got is None:
                return None
            if self._clock() - got[0] > self._ttl:
                del self._kept[key]
                return None
            return got[1]

    def remember(
        self, digest: str, public_key: str, required: bool, verdict: VolumeVerdict
    ) -> None:
        with self._lock:
            now = self._clock()
            self._kept = {k: v for k, v in self._kept.items() if now - v[0] <= self._ttl}
            self._kept[(digest, key_id(public_key), required)] = (now, verdict)


VERDICTS = Verdicts()


def check(record: ArtifactRecord, public_key: str, required: bool, config: Config) -> VolumeVerdict:
    """The volume image of `record`, read from the registry with the operator's read identity
    and judged. Never raises for what it finds (a verdict says why); a registry that cannot be
    reached is a verdict too (not mountable)."""
    from tunefleet.artifacts import ocibundle, signing
    from tunefleet.storage.oci import OciStore
    from tunefleet.storage.registry import open_store

    if not config.oci_config:
        return VolumeVerdict(False, False, "the operator has no registry read identity "
                             "(the chart's delivery.oci.credentialsSecret)")  # fmt: skip
    if not record.volume:
        return VolumeVerdict(False, False, "the artifact has no volume image")
    if required and not public_key:
        return VolumeVerdict(False, False, "a signature is required and the profile gives no "
                             "key to verify it: set spec.storage.signing.publicKey (the PEM of "
                             "cosign.pub)")  # fmt: skip
    try:
        options = StoreOptions(timeout_s=config.delivery_timeout_s, oci_config=config.oci_config)
        store = open_store(parse_uri(record.uri), options)
        assert isinstance(store, OciStore)
        signed, why = False, "the profile gives no public key: not verified"
        if public_key:
            try:
                key = signing.load_public_key(public_key.encode())
            except signing.SigningError as exc:
                return VolumeVerdict(False, False, f"spec.storage.signing.publicKey: {exc}")
            verdict = signing.verify(store, record.volume, key)
            signed, why = verdict.ok, verdict.reason
        if not signed and (required or record.caches):
            # Caches' bytes are bound by the signature alone (the operator does not read them).
            return VolumeVerdict(False, False, f"volume image not mounted: {why}")
        ocibundle.check_volume(
            store, record.volume, record.sha256, record.manifest_sha256, record.kind,
            len(record.caches),
        )  # fmt: skip
    except ocibundle.VolumeError as exc:
        return VolumeVerdict(False, False, f"volume image not mounted: {exc}")
    except (FetchError, StoreError, signing.SigningError, OSError) as exc:
        return VolumeVerdict(False, False, f"volume image not checked: {exc}")
    return VolumeVerdict(True, signed, "" if signed else why)


class Checks:
    """Admission's checks in flight: at most one per (digest, key, policy), however many pods
    need it at once (single flight), on a pool of MAX_CHECKS threads. The verdict is kept in
    VERDICTS as it lands, whether or not an admission still waits for it: a check admission
    gave up on (its time ran out) still serves the next pod, and is never started again while
    it runs, so a slow registry costs one thread per digest, not one per pod."""

    def __init__(self, workers: int = MAX_CHECKS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="volume-check")
        self._lock = threading.Lock()
        self._flying: dict[tuple[str, str, bool], Future[VolumeVerdict]] = {}

    def start(
        self, record: ArtifactRecord, public_key: str, required: bool, config: Config
    ) -> Future[VolumeVerdict]:
        """The check of record.volume in flight: the one already running, else a new one."""
        key = (record.volume, key_id(public_key), required)
        with self._lock:
            flying = self._flying.get(key)
            if flying is None:
                flying = self._pool.submit(self._run, key, record, public_key, required, config)
                self._flying[key] = flying
            return flying

    def in_flight(self) -> int:
        with self._lock:
            return len(self._flying)

    def _run(
        self,
        key: tuple[str, str, bool],
        record: ArtifactRecord,
        public_key: str,
        required: bool,
        config: Config,
    ) -> VolumeVerdict:
        try:
            verdict = check(record, public_key, required, config)
            # Kept before the flight ends: a pod arriving in between finds one or the other.
            VERDICTS.remember(record.volume, public_key, required, verdict)
            return verdict
        finally:
            with self._lock:  # after start() put it there: start holds the lock to submit
                self._flying.pop(key, None)


CHECKS = Checks()
