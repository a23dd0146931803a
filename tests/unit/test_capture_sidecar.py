"""The capture sidecar (capture/sidecar.py): tailing files that only grow, de-duplication, the
pinned artifact's rows left out (and counted as a process that did not load them), bounded
batches, backoff, the last flush at SIGTERM; and the hook (capture/hook.py) it installs,
with the stand-in torch, as a serving process would run it."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tunefleet.capture import sidecar
from tunefleet.capture.sidecar import Collector, SendError, Settings, Sidecar, Tail
from tunefleet.contracts.capture_upload import AUDIENCE, PATH, Reply, Upload

ROOT = Path(__file__).resolve().parents[2]
FAKE_TORCH = ROOT / "tests" / "unit" / "data" / "fake_torch"
RESULTS = "Validator,PT_VERSION,2.11.0+standin\nGemmTunableOp_BFloat16_NN,nn_64_64_64_ld_64_64_64,Default,0.1\n"
HIT = "GemmTunableOp_BFloat16_NN,nn_64_64_64_ld_64_64_64"
MISS = [f"GemmTunableOp_BFloat16_TN,tn_{n}_64_64_ld_64_64_{n}" for n in (8, 16, 32, 48)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def car(tmp_path: Path, send: Any, **settings: Any) -> tuple[Sidecar, Path, Clock]:
    results = tmp_path / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "tunableop_results0.csv").write_text(RESULTS)
    misses = tmp_path / "misses"
    misses.mkdir(exist_ok=True)
    clock = Clock()
    s = Sidecar(misses, results, send, Settings(**{"interval_s": 10.0, **settings}), clock)
    return s, misses, clock


def test_tail_returns_complete_new_lines_once_and_starts_over_on_a_shorter_file(
    tmp_path: Path,
) -> None:
    f = tmp_path / "u0.csv"
    f.write_text("a,b\nc,")
    t = Tail()
    assert t.read(f) == "a,b\n"
    assert t.read(f) == ""
    with f.open("a") as out:
        out.write("d\n")
    assert t.read(f) == "c,d\n"
    f.write_text("e,f\n")  # replaced by a shorter file
    assert t.read(f) == "e,f\n"
    assert t.read(tmp_path / "missing.csv") == ""


def test_rows_are_deduplicated_across_files_and_the_artifacts_rows_are_left_out(
    tmp_path: Path,
) -> None:
    sent: list[Upload] = []
    s, misses, _ = car(tmp_path, lambda u: sent.append(u) or Reply(len(u.rows), len(u.rows)))
    (misses / "tunableop_untuned0.csv").write_text(f"{MISS[0]}\n{HIT}\n")
    (misses / "tunableop_untuned1.csv").write_text(f"{MISS[0]}\n{MISS[1]}\nnot a row\n")
    s.scan()
    assert s.flush_once()
    (u,) = sent
    assert u.rows == (MISS[0], MISS[1])
    assert u.not_loaded == 1  # HIT is in the artifact: that process did not load it
    assert u.dropped == 0
    # Nothing new, nothing sent; a new row goes at the next interval.
    s.scan()
    assert not s.flush_once()
    with (misses / "tunableop_untuned0.csv").open("a") as f:
        f.write(f"{MISS[0]}\n{MISS[2]}\n")
    s.scan()
    assert not s.flush_once()  # not before the interval
    s.clock.t = 10.0  # type: ignore[attr-defined]
    assert s.flush_once()
    assert sent[-1].rows == (MISS[2],)


def test_batches_are_bounded_and_a_backlog_drains_faster(tmp_path: Path) -> None:
    sent: list[Upload] = []
    s, misses, clock = car(tmp_path, lambda u: sent.append(u) or Reply(len(u.rows), 0), max_rows=2)
    (misses / "tunableop_untuned0.csv").write_text("".join(f"{m}\n" for m in MISS))
    s.scan()
    assert s.flush_once() and sent[-1].rows == tuple(MISS[:2])
    clock.t = 2.5  # a quarter interval while rows are pending
    assert s.flush_once() and sent[-1].rows == tuple(MISS[2:])
    c = Collector(set())
    c.add_text("".join(f"{m}\n" for m in MISS), "x")
    assert len(c.batch(100, 200)) == 1  # bytes bound the batch too


def test_a_failed_upload_keeps_its_rows_and_backs_off_and_a_refused_one_is_dropped(
    tmp_path: Path,
) -> None:
    calls: list[Upload] = []
    errors = [SendError("503 busy", retry_after=30.0), SendError("cannot reach")]

    def send(u: Upload) -> Reply:
        calls.append(u)
        if errors:
            raise errors.pop(0)
        return Reply(len(u.rows), len(u.rows))

    s, misses, clock = car(tmp_path, send)
    (misses / "tunableop_untuned0.csv").write_text(f"{MISS[0]}\n")
    s.scan()
    assert not s.flush_once() and s.next_send >= 30.0  # the operator's Retry-After
    clock.t = 40.0
    assert not s.flush_once() and s.next_send > 40.0 + 10.0  # backoff
    clock.t = 1000.0
    assert s.flush_once()
    assert [u.rows for u in calls] == [(MISS[0],)] * 3

    def refuse(u: Upload) -> Reply:
        raise SendError("400 not an OpSig,ParamSig row", drop=True)

    s2, misses2, _ = car(tmp_path / "b", refuse)
    (misses2 / "tunableop_untuned0.csv").write_text(f"{MISS[1]}\n")
    s2.scan()
    assert not s2.flush_once()
    assert not s2.collector.pending and s2.collector.dropped == 1


def test_the_last_flush_at_sigterm_sends_what_was_recorded_just_before(tmp_path: Path) -> None:
    sent: list[Upload] = []
    s, misses, _ = car(tmp_path, lambda u: sent.append(u) or Reply(len(u.rows), 0), final_s=2.0)
    s.clock = time.monotonic  # type: ignore[assignment]
    s.next_send = time.monotonic() + 3600  # the interval is far off
    (misses / "tunableop_untuned0.csv").write_text(f"{MISS[3]}\n")
    assert s.final_flush() == 0
    assert [u.rows for u in sent] == [(MISS[3],)]


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Handler.seen.append((self.path, self.headers["Authorization"], json.loads(body)))
        reply = Reply(accepted=1, new=1).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_cli_uploads_with_its_token_and_flushes_at_sigterm(tmp_path: Path) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    misses = tmp_path / "misses"
    misses.mkdir()
    (misses / "tunableop_untuned0.csv").write_text(f"{MISS[0]}\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "tunefleet.capture.sidecar", "run", "--dir", str(misses),
            "--url", f"http://127.0.0.1:{server.server_port}", "--token", str(token),
            "--interval", "3600", "--poll", "0.1",
        ],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not _Handler.seen and time.monotonic() < deadline:
            time.sleep(0.1)
        (misses / "tunableop_untuned0.csv").write_text(f"{MISS[0]}\n{MISS[1]}\n")
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        server.shutdown()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    first, last = _Handler.seen[0], _Handler.seen[-1]
    assert first[0] == PATH and first[1] == "Bearer tok-123"
    assert first[2]["rows"] == [MISS[0]]
    assert last[2]["rows"] == [MISS[1]]  # sent by the last flush, the interval far off
    assert "stopped: 2 GEMM(s) sent" in err
    assert AUDIENCE  # the token the kubelet projects is for this audience only


# --- the hook, with the stand-in torch ---------------------------------------------------------


def _serve(tmp_path: Path, env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    hook = tmp_path / "hook"
    sidecar.install_hook(hook)
    (tmp_path / "results0.csv").write_text(RESULTS)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "FAKE_TORCH_"))}
    full.update(
        PYTHONPATH=f"{hook}:{FAKE_TORCH}",
        PYTORCH_TUNABLEOP_ENABLED="1",
        PYTORCH_TUNABLEOP_TUNING="0",
        PYTORCH_TUNABLEOP_RECORD_UNTUNED="1",
        PYTORCH_TUNABLEOP_FILENAME=str(tmp_path / "results%d.csv"),
        PYTORCH_TUNABLEOP_UNTUNED_FILENAME=str(tmp_path / "untuned.csv"),
    )
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=60
    )


GEMMS = """
import torch
a = torch.rand(64, 64, dtype=torch.bfloat16, device="cuda")
torch.mm(a, torch.rand(64, 64, dtype=torch.bfloat16, device="cuda"))  # the artifact's
torch.mm(torch.rand(128, 64, dtype=torch.bfloat16, device="cuda"), a)  # a miss
print(len(torch.cuda.tunable.get_results()))
"""


def test_the_hook_loads_the_results_at_cuda_init_so_only_misses_are_recorded(
    tmp_path: Path,
) -> None:
    done = _serve(tmp_path, {}, GEMMS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    assert "loaded TunableOp results from" in done.stderr
    assert (tmp_path / "untuned0.csv").read_text().splitlines() == [
        "GemmTunableOp_BFloat16_NN,nn_64_128_64_ld_64_64_64"
    ]


def test_without_the_hook_record_untuned_records_every_gemm_as_torch_does(
    tmp_path: Path,
) -> None:
    done = _serve(tmp_path, {"PYTHONPATH": str(FAKE_TORCH)}, GEMMS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    assert len((tmp_path / "untuned0.csv").read_text().splitlines()) == 2


def test_the_hook_does_nothing_unless_recording_and_runs_the_images_own_sitecustomize(
    tmp_path: Path,
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    script = "import os, sys; print(os.environ.get('THEIRS'), [type(f).__name__ for f in sys.meta_path][0])"
    on = _serve(tmp_path, {"PYTHONPATH": f"{tmp_path / 'hook'}:{theirs}:{FAKE_TORCH}"}, script)
    assert on.stdout.split() == ["ran", "TorchFinder"], on.stderr
    off = _serve(
        tmp_path,
        {
            "PYTHONPATH": f"{tmp_path / 'hook'}:{theirs}:{FAKE_TORCH}",
            "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
        },
        script,
    )
    assert off.stdout.split()[0] == "ran" and "TorchFinder" not in off.stdout


def test_a_failing_load_is_one_line_and_never_an_error_in_the_serving_process(
    tmp_path: Path,
) -> None:
    done = _serve(tmp_path, {"PYTORCH_TUNABLEOP_FILENAME": str(tmp_path / "absent%d.csv")}, GEMMS)
    assert done.returncode == 0, done.stderr
    assert "did not load" in done.stderr and "serves untuned" in done.stderr
    no_lazy = "import sys, types\nt = types.ModuleType('torch')\nsys.modules['torch'] = t\nfrom tunefleet.capture import hook\nhook.after_torch(t)\n"
    done = _serve(tmp_path, {"PYTHONPATH": f"{ROOT / 'operator'}"}, no_lazy)
    assert done.returncode == 0 and "no torch.cuda._lazy_call" in done.stderr


@pytest.mark.parametrize(
    ("name", "ordinal", "expected"),
    [
        ("/r/tunableop_results%d.csv", 2, "/r/tunableop_results2.csv"),
        ("/r/results.csv", 1, "/r/results1.csv"),
        ("results", 3, "results3"),
    ],
)
def test_the_hook_names_the_results_file_as_torch_does(
    name: str, ordinal: int, expected: str
) -> None:
    from tunefleet.capture.hook import ordinal_name

    assert ordinal_name(name, ordinal) == expected
