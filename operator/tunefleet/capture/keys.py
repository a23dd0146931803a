"""Which GEMMs an artifact has (``OpSig,ParamSig``): what "tuned" means in status.capture.

Read once per artifact (its content never changes: it is named by its SHA-256) from what the
operator can read: the immutable ConfigMap it delivered the artifact in (checked by uid and
SHA-256), else the store with its delivery read identity. Without either, None: loop.py then
counts what the artifact's retune froze as tuned.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections import OrderedDict

from tunefleet import kube
from tunefleet.artifacts import gz, kinds
from tunefleet.artifacts.fetch import MAX_RESULTS_BYTES, FetchError, Pinned, download_verified
from tunefleet.builders.artifact import PACKED_NAME
from tunefleet.config import Config
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.kube import Kube
from tunefleet.serving import delivery
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import StoreError, StoreOptions
from tuner_job.output import RESULTS_NAME
from tuner_job.results import decode, parse_results

log = logging.getLogger(__name__)

RETRY_S = 300.0  # a failed read is tried again after this long
MAX_ENTRIES = 256


def keys_in(results: bytes) -> frozenset[str]:
    parsed = parse_results(decode(results), "<artifact>")
    return frozenset(f"{r.op},{r.params}" for r in parsed.rows)


class ArtifactKeys:
    def __init__(self, client: Kube, config: Config, max_entries: int = MAX_ENTRIES) -> None:
        self.client = client
        self.config = config
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._keys: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._failed: dict[str, float] = {}

    def _from_config_map(self, record: ArtifactRecord, namespace: str) -> bytes | None:
        if not (record.config_map and record.config_map_uid):
            return None
        cm = self.client.read("ConfigMap", namespace, record.config_map)
        if cm is None or (cm.get("metadata") or {}).get("uid") != record.config_map_uid:
            return None  # gone or replaced: not the one the operator made
        data, binary = cm.get("data") or {}, cm.get("binaryData") or {}
        if RESULTS_NAME in data:
            return str(data[RESULTS_NAME]).encode("utf-8")
        if PACKED_NAME in binary:
            # Bounded as it unpacks: the record is status's word (name and uid), and whoever
            # can write status can name a ConfigMap of their own; its SHA-256 is checked after.
            return gz.gunzip(base64.b64decode(binary[PACKED_NAME]), MAX_RESULTS_BYTES, PACKED_NAME)
        return None

    def _from_store(self, record: ArtifactRecord, endpoint: str, region: str) -> bytes | None:
        if delivery.deliverable(self.config) or parse_uri(record.uri).scheme != "s3":
            return None
        options = StoreOptions(
            endpoint_url=endpoint or None,
            region=region or None,
            timeout_s=self.config.delivery_timeout_s,
        )
        pin = Pinned(
            record.uri, record.sha256, record.manifest_sha256 or None, record.gpu_model or None
        )
        got = download_verified(pin, options=options)
        return got.results

    def get(
        self, record: ArtifactRecord, namespace: str, endpoint: str = "", region: str = ""
    ) -> frozenset[str] | None:
        sha = record.sha256
        if record.kind != kinds.DEFAULT:
            return frozenset()  # caches alone: no TunableOp results, so no GEMM is tuned
        with self._lock:
            if sha in self._keys:
                self._keys.move_to_end(sha)
                return self._keys[sha]
            failed = self._failed.get(sha)
            if failed is not None and time.monotonic() - failed < RETRY_S:
                return None
        try:
            data = self._from_config_map(record, namespace)
            if data is None:
                data = self._from_store(record, endpoint, region)
        except (FetchError, StoreError, ValueError, OSError, kube.Gone) as e:
            log.info(f"cannot read artifact {sha[:12]} for its GEMMs: {e}")
            data = None
        except Exception as e:  # kube.Temporary and the like: tried again later
            log.info(f"cannot read artifact {sha[:12]} for its GEMMs now: {e}")
            data = None
        if data is not None and hashlib.sha256(data).hexdigest() != sha:
            log.warning(f"artifact {sha[:12]}: its ConfigMap holds other results; not used")
            data = None
        keys = None
        if data is not None:
            try:
                keys = keys_in(data)
            except ValueError as e:  # verified bytes that still do not parse: never a crash
                log.warning(f"artifact {sha[:12]}: its results do not parse ({e}); not used")
        with self._lock:
            if keys is None:
                self._failed[sha] = time.monotonic()
                return None
            self._failed.pop(sha, None)
            self._keys[sha] = keys
            while len(self._keys) > self.max_entries:
                self._keys.popitem(last=False)
            return keys
