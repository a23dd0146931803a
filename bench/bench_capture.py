"""The capture loop's figures (docs/capture.md):

(a) the capture sidecar alone, as it runs in a model pod (`tunefleet-capture run`, a process
    here): its peak RSS and CPU (percent of a core) while a serving process records N new
    misses a second into its untuned file, and the time from a miss being written to its
    arrival at the endpoint (a local HTTP endpoint stands in for the operator's; the sidecar's
    own work, not the network's), at its default upload interval (30 s) and at 2 s;
(b) the loop on the real node (`--loop`, needs the local cluster): the e2e test
    tests/e2e/test_capture_loop.py run once, with the times it prints: a miss to its upload
    through the real endpoint and store, a threshold to the retune's new artifact (the stand-in
    torch's "tuning", so a stand-in time), and the coverage after one loop.

    python -m bench.bench_capture            # (a) only: no cluster needed
    python -m bench.bench_capture --loop     # (a) and (b)
    python -m bench --only capture           # both, into bench/results.md
"""

from __future__ import annotations

import http.server
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOP_LINE = re.compile(
    r"miss to upload (?P<upload>[\d.]+)s, threshold to new artifact (?P<artifact>[\d.]+)s, "
    r"coverage after one loop (?P<coverage>\d+)%"
)


class _Endpoint(http.server.BaseHTTPRequestHandler):
    arrivals: ClassVar[dict[str, float]] = {}
    uploads: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        now = time.monotonic()
        rows = json.loads(body)["rows"]
        for row in rows:
            _Endpoint.arrivals.setdefault(row, now)
        _Endpoint.uploads.append(len(rows))
        reply = json.dumps({"accepted": len(rows), "new": len(rows)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


def _proc(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU seconds) of a process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / CLK_TCK


def _workdir() -> tuple[Path, Path]:
    """A scratch folder with the sidecar's token and an empty untuned file; (folder, file)."""
    work = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    (work / "misses").mkdir()
    (work / "token").write_text("bench-token\n")
    untuned = work / "misses" / "tunableop_untuned0.csv"
    untuned.touch()
    return work, untuned


def _sidecar(work: Path, port: int, interval: float) -> subprocess.Popen[bytes]:
    """`tunefleet-capture run` as a process, watching work/misses, posting to the port."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"}
    return subprocess.Popen(
        [
            sys.executable, "-m", "tunefleet.capture.sidecar", "run", "--dir",
            str(work / "misses"), "--url", f"http://127.0.0.1:{port}",
            "--token", str(work / "token"), "--interval", str(interval),
        ],
        env=env, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _figures(
    rate: float,
    interval: float,
    written: dict[str, float],
    samples: list[tuple[float, float, float]],
) -> dict[str, Any]:
    """One run's figures from what was written when, what arrived when, and the samples."""
    lat = sorted(_Endpoint.arrivals[r] - t for r, t in written.items() if r in _Endpoint.arrivals)
    span = samples[-1][0]
    return {
        "misses_per_s": rate,
        "upload_interval_s": interval,
        "misses_written": len(written),
        "misses_received": len(lat),
        "uploads": len(_Endpoint.uploads),
        "rss_peak_mib": round(max(s[1] for s in samples), 1),
        "cpu_percent_of_a_core": round(100 * samples[-1][2] / span, 2),
        "miss_to_upload_p50_s": round(statistics.median(lat), 2) if lat else None,
        "miss_to_upload_p99_s": round(lat[int(0.99 * (len(lat) - 1))], 2) if lat else None,
    }


def sidecar_run(rate: float, seconds: float, interval: float) -> dict[str, Any]:
    """One run: `rate` new misses a second for `seconds`, the sidecar at `interval`."""
    _Endpoint.arrivals, _Endpoint.uploads = {}, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work, untuned = _workdir()
    proc = _sidecar(work, server.server_port, interval)
    written: dict[str, float] = {}
    samples: list[tuple[float, float, float]] = []
    try:
        time.sleep(1.0)  # its start-up is not what is measured
        _, cpu0 = _proc(proc.pid)
        started = time.monotonic()
        n = 0
        next_sample = started
        with untuned.open("a") as f:
            while time.monotonic() - started < seconds:
                due = int((time.monotonic() - started) * rate) + 1
                while n < due:
                    row = f"GemmTunableOp_BFloat16_TN,tn_{n + 1}_4096_4096_ld_4096_4096_{n + 1}"
                    f.write(row + "\n")
                    f.flush()  # std::endl, as torch writes each row
                    written[row] = time.monotonic()
                    n += 1
                now = time.monotonic()
                if now >= next_sample:
                    rss, cpu = _proc(proc.pid)
                    samples.append((now - started, rss, cpu - cpu0))
                    next_sample = now + 0.5
                time.sleep(min(0.01, 1.0 / rate))
        deadline = time.monotonic() + interval + 5
        while len(_Endpoint.arrivals) < len(written) and time.monotonic() < deadline:
            time.sleep(0.1)
        rss, cpu = _proc(proc.pid)
        samples.append((time.monotonic() - started, rss, cpu - cpu0))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()
    return _figures(rate, interval, written, samples)


def sidecar_figures() -> dict[str, Any]:
    runs = [
        sidecar_run(rate, seconds, interval)
        for rate, seconds, interval in (
            (1, 40, 30.0),
            (100, 40, 30.0),
            (1000, 20, 2.0),
            (10, 20, 2.0),
        )
    ]
    for r in runs:
        print(f"capture sidecar: {json.dumps(r)}", flush=True)
    return {
        "runs": runs,
        "note": "the sidecar process (tunefleet-capture run) here, a local HTTP endpoint for "
        "the operator's; every miss a new GEMM (the worst case: serving repeats a GEMM far "
        "more often than it meets a new one)",
    }


def loop_figures() -> dict[str, Any]:
    """tests/e2e/test_capture_loop.py once, on the real node, and the times it prints."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-m", "e2e", "-q", "-s", "-p", "no:cacheprovider",
            str(ROOT / "tests" / "e2e" / "test_capture_loop.py"),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    found = LOOP_LINE.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"the capture loop e2e failed:\n{done.stdout[-4000:]}")
    out = {
        "miss_to_upload_s": float(found["upload"]),
        "threshold_to_new_artifact_s": float(found["artifact"]),
        "coverage_after_one_loop_percent": int(found["coverage"]),
        "e2e_wall_s": round(time.monotonic() - started, 1),
        "note": "real API server, S3, kubelet and containers on the real node; the stand-in "
        "torch's tuning (no GPU): the retune's time is a stand-in time, its counts are real "
        "(reused 3 of the profile's shapes from the library, newly tuned the 2 captured)",
    }
    print(f"capture loop: {json.dumps(out)}", flush=True)
    return out


def run(loop: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"sidecar": sidecar_figures()}
    if loop:
        out["loop"] = loop_figures()
    return out


def main() -> None:
    result = run(loop="--loop" in sys.argv)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
