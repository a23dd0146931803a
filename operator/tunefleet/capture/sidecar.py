"""`tunefleet-capture`: the capture sidecar of a model pod, and the init step that installs the
hook (capture/hook.py) for the user's containers.

    tunefleet-capture install-hook --dest DIR
    tunefleet-capture run --dir DIR --results DIR --url URL --token FILE [limits]

`run` follows the untuned files TunableOp writes in DIR (``tunableop_untuned<ordinal>.csv``,
one per device ordinal and process group; they only grow), keeps the rows that the pod's
pinned artifact (the results files in --results) does not have, de-duplicates them, and sends
the new ones to the operator (contracts/capture_upload.py): in batches of at most --max-rows rows
and --max-bytes bytes, at most one batch per --interval seconds, retried with exponential backoff
(the operator's Retry-After first). At SIGTERM it reads the files once more and makes a last
flush, bounded by --final-seconds. It holds no credential that can write an artifact: its token
is good for the operator's capture endpoint only.

Standard library only (with tuner_job's untuned-file parser): it runs beside every model pod,
so it stays small (bench/bench_capture.py measures it).
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import signal
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunefleet import pod_https
from tunefleet.capture import hook
from tunefleet.contracts.capture_upload import (
    MAX_BODY_BYTES,
    MAX_ROWS,
    PATH,
    CacheLoad,
    Reply,
    Upload,
    row_problem,
)
from tuner_job.results import parse_results, parse_untuned

PROG = "tunefleet-capture"
UNTUNED_GLOB = "tunableop_untuned*.csv"
UNTUNED_FILENAME = "tunableop_untuned.csv"  # torch puts the ordinal before the last '.'
HOOK_NAME = "sitecustomize.py"
MAX_PENDING = 8192  # rows waiting to be sent; beyond this they are counted as dropped
MAX_KNOWN = 65536  # distinct rows remembered as sent
BACKOFF_MAX_S = 300.0


def log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def install_hook(dest: Path) -> Path:
    """Copy the hook where the user's containers find it first on their PYTHONPATH."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / HOOK_NAME
    tmp = dest / f".{HOOK_NAME}.tmp"
    shutil.copyfile(hook.__file__, tmp)
    tmp.chmod(0o444)
    os.replace(tmp, target)
    return target


@dataclass
class Tail:
    """New complete lines of files that only grow (a shorter file starts over)."""

    offsets: dict[str, int] = field(default_factory=dict)
    max_read: int = 1 << 20  # bytes read per file per scan

    def read(self, path: Path) -> str:
        key = str(path)
        try:
            size = path.stat().st_size
        except OSError:
            return ""
        start = self.offsets.get(key, 0)
        if size < start:
            start = 0  # truncated or replaced: read it again (rows already sent stay sent)
        if size == start:
            return ""
        try:
            with path.open("rb") as f:
                f.seek(start)
                chunk = f.read(min(size - start, self.max_read))
        except OSError:
            return ""
        end = chunk.rfind(b"\n")
        if end < 0:
            # No complete line yet: wait, unless one line fills the whole read (not a row).
            if len(chunk) >= self.max_read:
                self.offsets[key] = start + len(chunk)
            return ""
        self.offsets[key] = start + end + 1
        return chunk[: end + 1].decode("utf-8", errors="surrogateescape")


def artifact_keys(results_dir: Path | None) -> set[str]:
    """The GEMMs the pod's pinned artifact has (`OpSig,ParamSig`), from its results files."""
    keys: set[str] = set()
    if results_dir is None or not results_dir.is_dir():
        return keys
    for path in sorted(results_dir.glob("*.csv"))[:1]:  # every ordinal holds the same artifact
        try:
            parsed = parse_results(path.read_bytes().decode("utf-8", "surrogateescape"), str(path))
        except (OSError, ValueError) as e:
            log(f"warning: cannot read the pinned artifact {path}: {e}")
            continue
        keys |= {f"{r.op},{r.params}" for r in parsed.rows}
    return keys


@dataclass
class Collector:
    """Rows to send: new, de-duplicated, not in the artifact; bounded."""

    known_artifact: set[str]
    pending: dict[str, None] = field(default_factory=dict)
    sent: set[str] = field(default_factory=set)
    not_loaded: set[str] = field(default_factory=set)
    dropped: int = 0
    skipped: int = 0  # rows the contract cannot carry (malformed, too long)

    def add_text(self, text: str, source: str) -> int:
        added = 0
        for row in parse_untuned(text, source).rows:
            line = f"{row.op},{row.params}"
            if line in self.known_artifact:
                # Recorded although the artifact has it: this process did not load the results.
                self.not_loaded.add(line)
                continue
            if line in self.sent or line in self.pending:
                continue
            if row_problem(line):
                self.skipped += 1
                continue
            if len(self.pending) >= MAX_PENDING:
                self.dropped += 1
                continue
            self.pending[line] = None
            added += 1
        return added

    def batch(self, max_rows: int, max_bytes: int) -> list[str]:
        rows: list[str] = []
        size = 128  # the body's own bytes
        for line in self.pending:
            if len(rows) >= max_rows or size + len(line) + 3 > max_bytes:
                break
            rows.append(line)
            size += len(line) + 3
        return rows

    def done(self, rows: Sequence[str]) -> None:
        for line in rows:
            self.pending.pop(line, None)
            if len(self.sent) < MAX_KNOWN:
                self.sent.add(line)


class SendError(Exception):
    def __init__(self, message: str, retry_after: float | None = None, drop: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.drop = drop  # the operator refused these rows for good: do not send them again


@dataclass
class Sender:
    url: str
    token_file: Path
    ca_pem: str = ""
    address: str = ""
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        self._endpoint = pod_https.Endpoint(
            self.url, self.ca_pem, self.address, self.timeout_s
        )  # ValueError: not https://host[:port]

    def send(self, upload: Upload) -> Reply:
        body = upload.encode()
        try:
            token = self.token_file.read_text().strip()  # the kubelet rotates it: read each time
        except OSError as e:
            raise SendError(f"cannot read the token {self.token_file}: {e}") from None
        try:
            got = self._endpoint.post(PATH, body, token, 64 * 1024)
        except (OSError, http.client.HTTPException) as e:
            raise SendError(f"cannot reach {self.url}: {e}") from None
        reply = Reply.decode(got.body)
        if got.status == 200:
            return reply
        retry = reply.retry_after
        if retry is None and got.retry_after.isdigit():
            retry = float(got.retry_after)
        why = f"{got.status} {reply.message or got.reason}"
        # 400/413: these rows will never be taken; 401/403: this pod is not (yet) accepted,
        # retried slowly (a token not yet valid, a profile whose capture is off for now).
        drop = got.status in (400, 413)
        if got.status in (401, 403) and retry is None:
            retry = BACKOFF_MAX_S
        raise SendError(why, retry_after=retry, drop=drop)


@dataclass
class Settings:
    interval_s: float = 30.0
    poll_s: float = 1.0
    max_rows: int = 256
    max_bytes: int = 64 * 1024
    final_s: float = 5.0


class Sidecar:
    def __init__(
        self,
        directory: Path,
        results: Path | None,
        sender: Callable[[Upload], Reply],
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dir = directory
        self.sender = sender
        self.settings = settings
        self.clock = clock
        self.tail = Tail()
        self.collector = Collector(artifact_keys(results))
        self.next_send = 0.0
        self.failures = 0
        self.stopping = False
        self.reported_not_loaded = 0
        self.reported_dropped = 0
        self.uploads = 0
        self.cache_records: list[dict[str, Any]] = []
        self.cache_load: CacheLoad | None = None  # what vLLM's records say, at the last scan
        self.reported_cache: CacheLoad | None = None

    def scan(self) -> int:
        added = 0
        for path in sorted(self.dir.glob(UNTUNED_GLOB)):
            text = self.tail.read(path)
            if text:
                added += self.collector.add_text(text, path.name)
        self.scan_cache_log()
        return added

    def scan_cache_log(self) -> None:
        """vLLM's records of its compile path (capture/hook.py writes them), judged."""
        text = self.tail.read(self.dir / hook.CACHE_LOG_NAME)
        if not text:
            return
        self.cache_records.extend(hook.read_cache_log(text)[: hook.MAX_RECORDS])
        del self.cache_records[: max(0, len(self.cache_records) - 4 * hook.MAX_RECORDS)]
        verdict = hook.cache_verdict(self.cache_records)
        if verdict is not None:
            load = CacheLoad("vllm", verdict["path"], verdict["key"], verdict["reason"])
            if load != self.cache_load:
                log(
                    f"vLLM's compiled model: {load.path}"
                    + (f" (key {load.key[:16]})" if load.key else "")
                    + (f": {load.reason}" if load.reason else "")
                )
            self.cache_load = load

    def _news(self) -> bool:
        c = self.collector
        return (
            bool(c.pending)
            or len(c.not_loaded) > self.reported_not_loaded
            or c.dropped > self.reported_dropped
            or self.cache_load != self.reported_cache
        )

    def flush_once(self) -> bool:
        """Send one batch if one is due; True when something was sent."""
        now = self.clock()
        if not self._news() or now < self.next_send:
            return False
        s, c = self.settings, self.collector
        rows = c.batch(s.max_rows, s.max_bytes)
        loads = (self.cache_load,) if self.cache_load is not None else ()
        upload = Upload(tuple(rows), len(c.not_loaded), c.dropped + c.skipped, loads)
        try:
            reply = self.sender(upload)
        except Exception as e:
            # Whatever goes wrong here must not stop the sidecar: serving does not wait on it.
            if not isinstance(e, SendError):
                e = SendError(f"{type(e).__name__}: {e}")
            if e.drop:
                log(f"the operator refused {len(rows)} row(s) for good ({e}); dropped")
                c.done(rows)
                c.dropped += len(rows)
                self.next_send = now + s.interval_s
                return False
            self.failures += 1
            backoff = min(BACKOFF_MAX_S, s.interval_s * 2 ** min(self.failures, 10))
            delay = e.retry_after if e.retry_after is not None else backoff
            delay *= random.uniform(1.0, 1.2)  # replicas of a Deployment do not retry in step
            self.next_send = now + delay
            log(f"upload failed ({e}); {len(c.pending)} row(s) kept, next try in {delay:.0f}s")
            return False
        self.failures = 0
        self.uploads += 1
        c.done(rows)
        self.reported_not_loaded, self.reported_dropped = len(c.not_loaded), c.dropped
        self.reported_cache = self.cache_load
        self.next_send = now + (s.interval_s if not c.pending else s.interval_s / 4)
        log(
            f"uploaded {len(rows)} GEMM(s) ({reply.new} new to the operator), "
            f"{len(c.pending)} pending, {len(c.sent)} sent in all"
            + (
                f"; {len(c.not_loaded)} recorded GEMM(s) are in the artifact: a process "
                "recorded without the results loaded"
                if c.not_loaded
                else ""
            )
        )
        return True

    def run(self) -> int:
        s = self.settings
        while not self.stopping:
            self.scan()
            if len(self.collector.pending) >= s.max_rows:
                self.next_send = min(self.next_send, self.clock())
            self.flush_once()
            time.sleep(s.poll_s)
        return self.final_flush()

    def final_flush(self) -> int:
        """At SIGTERM: what was recorded up to now goes, within final_s."""
        self.scan()
        deadline = self.clock() + self.settings.final_s
        self.next_send = 0.0
        while self._news() and self.clock() < deadline:
            before = len(self.collector.pending)
            if not self.flush_once():
                if self.next_send > deadline or self.failures > 2:
                    break
                time.sleep(min(0.5, max(0.0, self.next_send - self.clock())))
            elif len(self.collector.pending) == before:
                break
        left = len(self.collector.pending)
        log(f"stopped: {len(self.collector.sent)} GEMM(s) sent, {left} not sent")
        return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else "")
    sub = p.add_subparsers(dest="command", required=True)
    ih = sub.add_parser("install-hook", help="copy the capture hook for the user's containers")
    ih.add_argument("--dest", required=True, type=Path)
    run = sub.add_parser("run", help="follow the untuned files and upload new misses")
    run.add_argument("--dir", required=True, type=Path, help="where TunableOp writes them")
    run.add_argument("--results", type=Path, help="the pinned artifact's results directory")
    run.add_argument("--url", required=True, help="the operator's capture endpoint")
    run.add_argument("--token", required=True, type=Path, help="projected token file")
    run.add_argument("--ca-env", default="TUNEFLEET_CAPTURE_CA", help="env var with the CA PEM")
    run.add_argument("--address", default="", help="where to connect if --url's host won't resolve")
    run.add_argument("--interval", type=float, default=30.0, help="seconds between uploads")
    run.add_argument("--poll", type=float, default=1.0, help="seconds between file scans")
    run.add_argument("--max-rows", type=int, default=256)
    run.add_argument("--max-bytes", type=int, default=64 * 1024)
    run.add_argument("--final-seconds", type=float, default=5.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "install-hook":
        target = install_hook(args.dest)
        log(f"installed the capture hook as {target}")
        return 0
    settings = Settings(
        interval_s=max(args.interval, 1.0),
        poll_s=max(args.poll, 0.05),
        max_rows=max(1, min(args.max_rows, MAX_ROWS)),
        max_bytes=max(4096, min(args.max_bytes, MAX_BODY_BYTES)),
        final_s=max(args.final_seconds, 0.0),
    )
    try:
        sender = Sender(args.url, args.token, os.environ.get(args.ca_env, ""), args.address)
    except (ValueError, ssl.SSLError) as e:
        # Idle rather than exit: a native sidecar that exits is restarted, and one that keeps
        # failing holds up nothing but must not look like the serving pod's problem.
        log(f"error: {e}; capturing nothing (fix the pod's capture settings)")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)
    args.dir.mkdir(parents=True, exist_ok=True)
    car = Sidecar(args.dir, args.results, sender.send, settings)
    known = len(car.collector.known_artifact)
    log(
        f"following {args.dir / UNTUNED_GLOB} (pinned artifact: {known} GEMM(s)); "
        f"uploading to {args.url} at most every {settings.interval_s:.0f}s"
    )

    def stop(*_: object) -> None:
        car.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return car.run()


if __name__ == "__main__":
    sys.exit(main())
