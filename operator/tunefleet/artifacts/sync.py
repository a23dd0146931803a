"""tunefleet-sync: the tuning pod's native sidecar, all of the tune step's S3 traffic.

The tune step runs in the user's image with neither our dependencies nor S3 credentials; this
sidecar (tunefleet's image) meets it in the exchange directory (tuner_job/exchange.py):

1. at start, before anything else: this shard's checkpoint -> checkpoint.csv (when a valid one
   exists) and checkpoint.json, then the marker checkpoint.done;
2. once the tuner has written identity.json: the GEMM library of that identity, verified entry
   by entry -> library.csv (when it has rows) and library.json, then library.done;
3. while tuning runs: progress.csv, polled; a checkpoint upload (the resumed checkpoint's rows
   merged with every progress row seen) when K new GEMMs have come since the last upload, or T
   seconds have passed with any new one, never more often than every few seconds;
4. on tune.done, and on SIGTERM: one final upload. Between them it idles.

It never exits non-zero on its own: the kubelet restarts a native sidecar that does, so every
failure is logged and it carries on (SIGTERM ends it with status 0).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from tunefleet.artifacts.brokered import with_broker
from tunefleet.storage import cli_flags as storage_cli
from tunefleet.storage.registry import open_store, parse_uri, session
from tunefleet.storage.store import (
    Location,
    NotFoundError,
    Store,
    StoreError,
    StoreOptions,
    check_key_parts,
)
from tuner_job import exchange as ex
from tuner_job.config import SHARD_ENV
from tuner_job.files import atomic_write_bytes, sha256_hex
from tuner_job.library import (
    CheckpointError,
    CheckpointId,
    EntrySource,
    library_key,
    make_checkpoint,
    parse_checkpoint,
)
from tuner_job.library import (
    Settings as TuningSettings,
)
from tuner_job.manifest import rfc3339_utc
from tuner_job.results import (
    CsvFormatError,
    ResultsFile,
    ResultsMerger,
    ValidatorMismatchError,
    format_results,
    merge_results,
    read_results,
)

from . import cli
from .library import (
    MAX_CHECKPOINT_BYTES,
    SCOPES,
    Library,
    TunedRows,
    add_rows,
    check_revision,
    check_scope,
    check_shard,
    checkpoint_key,
    read_library,
)

PROG = "tunefleet-sync"
MIN_UPLOAD_INTERVAL_S = 2.0
POLL_S = 0.5
OPERATION_TIMEOUT_S = 60.0  # each S3 operation's own deadline (a sidecar lives for hours)
# Reading a library is up to 500 downloads; the tuner waits 300 s by default for all of it.
LIBRARY_TIMEOUT_S = 240.0


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


class Stop:
    """Set from a signal handler, read by the loop: a plain attribute, no lock. A
    threading.Event will not do: its set() takes the lock that the main thread holds for a
    moment inside every wait(), and a SIGTERM landing in that moment ran the handler on the
    main thread, which then waited on its own lock forever (seen in CI: the sidecar hung
    after "SIGTERM", its final upload never made, until the kubelet's SIGKILL)."""

    def __init__(self) -> None:
        self.why = ""  # what stopped it (a signal's name); "" while running

    def set(self, why: str = "stopped") -> None:
        self.why = why

    def is_set(self) -> bool:
        return bool(self.why)

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` unless stopped; whether stopped. A signal ends no sleep early
        (PEP 475): the loop notices within one poll."""
        if not self.why:
            time.sleep(timeout)
        return self.is_set()


@dataclass(frozen=True)
class Settings:
    exchange: Path
    location: Location
    ident: CheckpointId
    scope: str
    every_gemms: int
    every_seconds: float
    min_interval_s: float = MIN_UPLOAD_INTERVAL_S
    poll_s: float = POLL_S
    options: StoreOptions = field(
        default_factory=lambda: StoreOptions(timeout_s=OPERATION_TIMEOUT_S)
    )


class Sync:
    """The sidecar's state and steps; `run` drives them until stopped."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Callable[[], Store] | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = _log,
    ) -> None:
        self.s = settings
        self.clock = clock
        self.log = log
        self._session: StoreOptions | None = None
        self._store_factory = store
        self.key = checkpoint_key(settings.location, settings.ident)
        # The checkpoint read at start: loaded, absent, ignored (another Job's), or unknown (the
        # read failed: retried before the first upload, so an upload never drops its rows).
        self.base: ResultsFile | None = None
        self.base_state = "unknown"
        self.progress = ResultsMerger()
        self.progress_stamp: tuple[int, int] | None = None
        self.uploaded: set[tuple[str, str]] = set()
        self.last_upload = clock()
        self.uploads = 0
        self.library_done = False
        self.tune_done_stamp: int | None = None
        self.stopping = Stop()

    # --- the store ---------------------------------------------------------------------------

    def store(self, timeout_s: float = OPERATION_TIMEOUT_S) -> Store:
        """A store per operation, so each gets its own deadline; one boto3 client for all."""
        if self._store_factory is not None:
            return self._store_factory()
        if self._session is None:
            self._session = session(self.s.location, self.s.options)
        return open_store(self.s.location, replace(self._session, timeout_s=timeout_s))

    def path(self, name: str) -> Path:
        return self.s.exchange / name

    # --- 1. the checkpoint -------------------------------------------------------------------

    def _read_checkpoint(self) -> tuple[str, str]:
        """Sets base/base_state; returns (status, reason) for checkpoint.json."""
        ident = self.s.ident
        try:
            data = self.store().get(self.key, MAX_CHECKPOINT_BYTES)
        except NotFoundError:
            self.base_state = "absent"
            return "none", f"no checkpoint for shard {ident.shard} of {ident.shards} yet"
        except StoreError as exc:
            self.base_state = "unknown"
            return "none", f"could not read the checkpoint: {exc}"
        try:
            results = parse_checkpoint(data, ident)
        except CheckpointError as exc:
            # Another Job's (or a hand-placed) object: not resumed from; this run's first
            # upload replaces it.
            self.base_state = "ignored"
            return "ignored", str(exc)
        self.base, self.base_state = results, "loaded"
        if not results.rows:
            return "none", "the checkpoint holds no GEMMs"
        return "resumed", f"{results.gemms} GEMM(s) tuned by an earlier attempt"

    def start(self) -> None:
        """Step 1. Never raises: whatever happens, the tuner gets checkpoint.done."""
        if self.path(ex.CHECKPOINT_DONE).exists():
            # This container was restarted in a running pod: the tuner has its answer; only
            # the rows are needed again, for later uploads.
            self._read_checkpoint()
            return
        try:
            status, reason = self._read_checkpoint()
        except Exception as exc:  # a sidecar carries on
            status, reason = "none", f"internal error reading the checkpoint: {exc!r}"
        gemms = 0
        try:
            if status == "resumed" and self.base is not None:
                gemms = self.base.gemms
                atomic_write_bytes(
                    self.path(ex.CHECKPOINT_CSV), format_results(self.base).encode("utf-8")
                )
            ex.CheckpointAnswer(status, reason, gemms).write(self.s.exchange)
            ex.mark(self.path(ex.CHECKPOINT_DONE))
        except OSError as exc:
            self.log(f"error: cannot write into {self.s.exchange}: {exc}")
        self.log(f"checkpoint: {status}: {reason}")

    # --- 2. the library ----------------------------------------------------------------------

    def library(self) -> None:
        """Step 2, once identity.json is there. Never raises; always ends with library.done."""
        if self.library_done:
            return
        doc = ex.read_json(self.path(ex.IDENTITY_JSON))
        if doc is None:
            return
        self.library_done = True
        if self.path(ex.LIBRARY_DONE).exists():
            return  # a restarted sidecar: done already
        answer = ex.LibraryAnswer(str(doc.get("libraryKey", "")))
        try:
            validators, key = self._identity(doc)
            raw = doc.get("settings")
            settings = TuningSettings.from_dict(raw) if raw is not None else None
            view = read_library(
                self.store(LIBRARY_TIMEOUT_S),
                Library(
                    self.s.location,
                    self.s.scope,
                    self.s.ident.namespace,
                    self.s.ident.gpu_model,
                    key,
                ),
                validators,
                settings,
            )
            if view.results is not None and view.results.rows:
                atomic_write_bytes(
                    self.path(ex.LIBRARY_CSV), format_results(view.results).encode("utf-8")
                )
            answer = ex.LibraryAnswer(
                key, view.entries, view.gemms, tuple(view.skipped), settings=raw
            )
            self.log(
                f"library {key[:12]}...: {view.entries} entries, {view.gemms} GEMM(s), "
                f"{len(view.skipped)} skipped"
            )
            for obj, reason in view.skipped:
                self.log(f"library entry skipped: {obj}: {reason}")
        except (StoreError, ValueError, OSError) as exc:
            answer = replace(answer, error=" ".join(str(exc).split()))
            self.log(f"library not read: {answer.error}")
        except Exception as exc:
            answer = replace(answer, error=f"internal error: {exc!r}")
            self.log(f"library not read: {answer.error}")
        try:
            answer.write(self.s.exchange)
            ex.mark(self.path(ex.LIBRARY_DONE))
        except OSError as exc:
            self.log(f"error: cannot write into {self.s.exchange}: {exc}")

    def _identity(self, doc: dict[str, Any]) -> tuple[dict[str, str], str]:
        """identity.json, checked: the key is recomputed, not trusted."""
        model, validators, identity = (
            doc.get("gpuModel"),
            doc.get("validators"),
            doc.get("identity"),
        )
        if model != self.s.ident.gpu_model:
            want = self.s.ident.gpu_model
            raise ValueError(f"identity.json names GPU model {model!r}, this Job tunes {want!r}")
        for name, value in (("validators", validators), ("identity", identity)):
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ValueError(f"identity.json {name} is not a map of strings")
        assert isinstance(validators, dict) and isinstance(identity, dict)
        key = library_key(model, validators, identity)
        if doc.get("libraryKey") != key:
            raise ValueError(f"identity.json's libraryKey is not its identity's key {key}")
        return dict(validators), key

    # --- 3. progress and checkpoint uploads --------------------------------------------------

    def poll_progress(self) -> None:
        path = self.path(ex.PROGRESS_CSV)
        try:
            st = path.stat()
        except FileNotFoundError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self.progress_stamp:
            return
        self.progress_stamp = stamp
        try:
            rows = read_results(path)
        except (OSError, CsvFormatError) as exc:
            self.log(f"progress.csv unreadable, waiting for the next one: {exc}")
            return
        try:
            self.progress.add(rows)
        except ValidatorMismatchError as exc:
            # Another run in this pod under other validators (cannot happen with one image):
            # keep the newest.
            self.log(f"progress.csv changed validators, starting over: {exc}")
            self.progress = ResultsMerger()
            self.progress.add(rows)

    def pending(self) -> int:
        return len(self.progress.keys() - self.uploaded)

    def due(self) -> bool:
        pending = self.pending()
        if not pending:
            return False
        since = self.clock() - self.last_upload
        if since < self.s.min_interval_s:
            return False
        return pending >= self.s.every_gemms or since >= self.s.every_seconds

    def upload(self, why: str) -> None:
        """Never raises; a failed upload is retried after the minimum interval."""
        pending = self.pending()
        self.last_upload = self.clock()
        try:
            if self.base_state == "unknown":
                self._read_checkpoint()  # its rows must not be lost by this upload
                if self.base_state == "unknown":
                    self.log("checkpoint not uploaded: the stored one cannot be read (retrying)")
                    return
            progress = self.progress.result()
            merged = progress
            if self.base is not None and self.base.rows:
                if self.base.validators == progress.validators:
                    merged = merge_results([self.base, progress])
                else:
                    self.log("the stored checkpoint was tuned under other validators: replaced")
                    self.base = None
            data = make_checkpoint(self.s.ident, format_results(merged), rfc3339_utc())
            self.store().put(self.key, data, "application/json")
        except (StoreError, OSError, ValueError) as exc:
            self.log(f"checkpoint upload failed (retrying): {' '.join(str(exc).split())}")
            return
        except Exception as exc:
            self.log(f"checkpoint upload failed (retrying): internal error: {exc!r}")
            return
        self.uploaded = progress.keys()
        self.uploads += 1
        self.log(f"checkpoint: uploaded {merged.gemms} GEMM(s), {pending} new ({why})")

    # --- the loop ----------------------------------------------------------------------------

    def step(self) -> None:
        """One round: library, progress, uploads, the end of tuning. Never raises."""
        try:
            self.library()
            self.poll_progress()
            done = self.path(ex.TUNE_DONE)
            stamp = done.stat().st_mtime_ns if done.exists() else None
            if stamp is not None and stamp != self.tune_done_stamp:
                self.tune_done_stamp = stamp
                if self.pending():
                    self.upload("tuning ended")
                self.log("tuning ended; idle until terminated")
            elif self.due():
                self.upload("interval")
        except Exception as exc:  # a sidecar carries on
            self.log(f"error (carrying on): {exc!r}")

    def final(self) -> None:
        try:
            self.poll_progress()
            if self.pending():
                self.upload("terminating")
            if self.tune_done_stamp is None:
                self.keep_in_library()
        except Exception as exc:
            self.log(f"error in the final upload: {exc!r}")

    def keep_in_library(self) -> None:
        """Stopped before tuning ended (a new revision superseded this Job, the deadline, a
        drain): what it tuned joins the library of its identity, so the next run that records
        the same GEMMs does not tune them again. Published artifacts do this too; the entry is
        create-only under its own hash."""
        doc = ex.read_json(self.path(ex.IDENTITY_JSON))
        rows = self.progress.result()
        if doc is None or not rows.rows:
            return
        validators, _ = self._identity(doc)
        if rows.validators != validators:
            return
        text = format_results(rows)
        ident = self.s.ident
        source = EntrySource(
            ident.namespace, ident.profile, ident.revision, sha256_hex(text.encode())
        )
        tuned = TunedRows(
            gpu_model=ident.gpu_model,
            validators=validators,
            identity={str(k): str(v) for k, v in (doc.get("identity") or {}).items()},
            source=source,
            results_text=text,
            # Tuned with the settings identity.json names: readers asking for stronger skip it.
            settings=TuningSettings.from_dict(doc["settings"]) if doc.get("settings") else None,
        )
        added = add_rows(self.store(), self.s.location, self.s.scope, tuned)
        self.log(
            f"stopped before tuning ended: {rows.gemms} GEMM(s) kept in the library ({added.uri})"
        )

    def run(self) -> int:
        try:
            self.s.exchange.mkdir(parents=True, exist_ok=True)  # an emptyDir in a pod
        except OSError as exc:
            self.log(f"error: cannot create {self.s.exchange}: {exc}")
        self.start()
        while not self.stopping.is_set():
            self.step()
            self.stopping.wait(self.s.poll_s)
        self.log(f"{self.stopping.why}: final upload, then exit")
        self.final()
        self.log(f"stopped after {self.uploads} checkpoint upload(s)")
        return 0


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # A bad command line must not crash-loop a native sidecar: report it and idle.
        raise _ArgumentError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--exchange", required=True, type=Path, help="the directory shared with tune")
    cli.add_where(p)
    p.add_argument("--revision", required=True)
    p.add_argument("--shards", type=int, default=1, help=f"N; this pod's index is ${SHARD_ENV}")
    p.add_argument("--library-scope", choices=SCOPES, default="namespace")
    p.add_argument("--checkpoint-every-gemms", type=int, default=25, metavar="K")
    p.add_argument("--checkpoint-every-seconds", type=float, default=60.0, metavar="T")
    p.add_argument(
        "--min-upload-interval-seconds",
        type=float,
        default=MIN_UPLOAD_INTERVAL_S,
        help="never upload more often than this (default: %(default)s)",
    )
    p.add_argument("--poll-seconds", type=float, default=POLL_S, help=argparse.SUPPRESS)
    storage_cli.add_arguments(p, timeout_s=OPERATION_TIMEOUT_S)
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    raw = os.environ.get(SHARD_ENV, "").strip() or "0"
    if not raw.isdigit():
        raise ValueError(f"{SHARD_ENV}={raw!r} is not a shard index")
    shard = int(raw)
    check_shard(shard, args.shards)
    check_key_parts(args.namespace, args.profile, args.gpu_model)
    check_revision(args.revision)
    check_scope(args.library_scope)
    if args.checkpoint_every_gemms < 1 or args.checkpoint_every_seconds <= 0:
        raise ValueError("--checkpoint-every-gemms must be >= 1, --checkpoint-every-seconds > 0")
    return Settings(
        exchange=args.exchange,
        location=parse_uri(args.uri),
        ident=CheckpointId(
            args.namespace, args.profile, args.gpu_model, args.revision, shard, args.shards
        ),
        scope=args.library_scope,
        every_gemms=args.checkpoint_every_gemms,
        every_seconds=args.checkpoint_every_seconds,
        min_interval_s=max(args.min_upload_interval_seconds, 0.0),
        poll_s=max(args.poll_seconds, 0.05),
        options=with_broker(args, storage_cli.options(args)),
    )


def _unusable(raw: Sequence[str], reason: str, stop: Stop) -> int:
    """Tell the tuner (if the exchange directory is known) not to wait, then idle."""
    _log(f"error: {reason}; the tuner proceeds without checkpoint or library")
    if "--exchange" in raw[:-1]:
        directory = Path(raw[raw.index("--exchange") + 1])
        try:
            ex.answer_without(directory, reason)
        except OSError as exc:
            _log(f"error: cannot write into {directory}: {exc}")
    while not stop.wait(1.0):
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    stop = Stop()

    def on_signal(signum: int, _frame: object) -> None:
        # Nothing here may take a lock (stderr's included): the main thread may hold it.
        stop.set(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        settings = settings_from(_parser().parse_args(raw))
    except (_ArgumentError, ValueError) as exc:
        return _unusable(raw, f"bad arguments: {exc}", stop)
    sync = Sync(settings)
    sync.stopping = stop
    return sync.run()


if __name__ == "__main__":
    sys.exit(main())
