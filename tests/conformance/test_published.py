"""Every results file tunefleet writes for a torch 2.11 CUDA identity loads in real torch 2.11,
and get_results() returns exactly the rows the manifest counts.

The files: the tuner's output (as write_output writes it), what publish stores, the GEMM
library as sync hands it to the tuner (library.csv), a sharded Job's shard outputs and the
artifact merge makes of them, a checkpoint's results, and each per-ordinal file fetch writes.
Real 2.11 accepts exactly its own validators (PT_VERSION 2.11.0), so the rows are what a CUDA
build of 2.11 tunes: Default only (its one candidate), in every parameter form it writes.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.torches import Torch
from tunefleet.artifacts.fetch import Pinned, Serving, fetch
from tunefleet.artifacts.library import Library, read_library
from tunefleet.artifacts.merge import MergeJob, merge
from tunefleet.artifacts.publish import Output, publish, publish_shard
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tuner_job.library import (
    CheckpointId,
    Settings,
    library_key,
    make_checkpoint,
    parse_checkpoint,
    partition,
)
from tuner_job.manifest import ArtifactId, ManifestExtra
from tuner_job.output import RunFacts, write_output
from tuner_job.results import (
    ResultRow,
    ResultsFile,
    UntunedRow,
    format_results,
    read_results,
)

VALIDATORS = {"PT_VERSION": "2.11.0"}
IDENTITY = {
    "gpuName": "NVIDIA H200",
    "arch": "sm_90",
    "computeCapability": "9.0",
    "cuda": "13.0",
    "cublas": "13.1.0",
    "multiProcessorCount": "132",
    "partition": "whole",
    "torch": "2.11.0+cu130",
}
SETTINGS = Settings(30, 100, 0, 0, -1, False, 1e-2, 1e-2, None)
NS, MODEL = "ml", "NVIDIA-H200"


def rows_211(n: int) -> list[ResultRow]:
    """Rows in every form torch 2.11 writes on CUDA (Default, measured times)."""
    forms = [
        ("GemmTunableOp_BFloat16_TN", "tn_{a}_{b}_4096_ld_4096_4096_{a}"),
        ("GemmTunableOp_float_NN", "nn_{a}_32_1_ld_0_1_{a}"),  # a leading dimension of 0
        ("GemmTunableOp_tf32_NT", "nt_{a}_{b}_64_ld_{a}_{b}_{a}"),
        ("GemmAndBiasTunableOp_Half_TN", "tn_{a}_{b}_768_ld_768_768_{a}"),
        ("GemmStridedBatchedTunableOp_BFloat16_NN", "nn_{a}_{b}_64_B_16_ld_{a}_64_{a}"),
        ("GemmTunableOp_double_TT", "tt_{a}_{b}_8_ld_8_{b}_{a}"),
        ("GemmTunableOp_c10::complex<float>_NN", "nn_{a}_{b}_16_ld_{a}_16_{a}"),
    ]
    out = []
    for i in range(n):
        op, fmt = forms[i % len(forms)]
        params = fmt.format(a=64 + 8 * i, b=32 + i % 5)
        out.append(ResultRow(op, params, "Default", f"{0.001 + i / 1000:.6g}"))
    return out


def tuner_output(out: Path, rows: list[ResultRow], **extra: object) -> None:
    results = ResultsFile(dict(VALIDATORS), rows)
    write_output(
        out,
        results,
        ArtifactId(
            namespace=NS,
            profile=str(extra.pop("profile", "llama")),
            revision="rev1",
            gpu_model=MODEL,
        ),
        RunFacts(
            recorded=len(rows),
            identity=dict(IDENTITY),
            seconds=1.0,
            extra=ManifestExtra(
                newly_tuned=len(rows),
                library_key=library_key(MODEL, VALIDATORS, IDENTITY),
                settings=SETTINGS.to_dict(),
                **extra,  # type: ignore[arg-type]
            ),
        ),
    )


def test_every_file_tunefleet_writes_for_a_211_cuda_identity_loads_in_real_211(
    torch211: Torch, tmp_path: Path
) -> None:
    store_dir = tmp_path / "store"
    uri = f"file://{store_dir}"
    rows = rows_211(120)
    files: dict[str, tuple[Path, int]] = {}  # name -> (path, GEMMs its manifest counts)

    tuner_output(tmp_path / "out", rows)
    files["tuner results.csv"] = (tmp_path / "out" / "results.csv", len(rows))
    pub = publish(Output(tmp_path / "out", uri, NS, "llama", MODEL))
    artifact = Path(parse_uri(pub.uri).bucket) / "results.csv"
    files["published results.csv"] = (artifact, pub.manifest.gemms)

    # A sharded Job: two shares, each published for merge, then the merged artifact.
    untuned = [UntunedRow(r.op, r.params) for r in rows_211(60)]
    shares = partition(untuned, 2)
    by_key = {r.key: r for r in rows_211(60)}
    for i, share in enumerate(shares):
        out = tmp_path / f"shard{i}"
        tuner_output(out, [by_key[u.key] for u in share], profile="sharded", shard=i, shards=2)
        publish_shard(Output(out, uri, NS, "sharded", MODEL), i, 2)
        files[f"shard {i} results.csv"] = (out / "results.csv", len(share))
    merged = merge(MergeJob(uri, ArtifactId(NS, "sharded", "rev1", MODEL), 2))
    files["merged results.csv"] = (Path(parse_uri(merged.uri).bucket) / "results.csv", 60)

    # The library as sync reads it and hands it to the tuner (two entries, merged).
    store = DirStore(parse_uri(uri))
    view = read_library(
        store,
        Library(parse_uri(uri), "namespace", NS, MODEL, library_key(MODEL, VALIDATORS, IDENTITY)),
        dict(VALIDATORS),
        SETTINGS,
    )
    assert view.entries == 2 and view.results is not None
    (tmp_path / "library.csv").write_text(format_results(view.results), encoding="utf-8")
    files["library.csv"] = (tmp_path / "library.csv", view.gemms)

    # A checkpoint's results, as sync uploads and a retried pod resumes them.
    ident = CheckpointId(NS, "llama", MODEL, "rev1", 0, 1)
    text = format_results(ResultsFile(dict(VALIDATORS), rows[:17]))
    resumed = parse_checkpoint(make_checkpoint(ident, text, "2026-01-01T00:00:00Z"), ident)
    (tmp_path / "checkpoint.csv").write_text(format_results(resumed), encoding="utf-8")
    files["checkpoint.csv"] = (tmp_path / "checkpoint.csv", 17)

    # What the fetch init container writes: one file per device ordinal.
    got = fetch(Pinned(pub.uri, pub.sha256, gpu_model=MODEL), tmp_path / "serve", Serving(3))
    for p in got.paths:
        files[f"fetched {p.name}"] = (p, pub.manifest.gemms)

    answers = torch211.read([p for p, _ in files.values()])
    for (name, (path, gemms)), answer in zip(files.items(), answers, strict=True):
        assert answer["loaded"], f"{name}: real 2.11 refused it: {answer['warnings']}"
        assert "error" not in answer, (name, answer["error"])
        ours = read_results(path)
        torch_rows = {(r[0], r[1]): (r[2], float(r[3])) for r in answer["rows"]}
        assert len(torch_rows) == gemms == ours.gemms, name
        assert torch_rows == {r.key: (r.solution, r.torch_ms) for r in ours.rows}, name


def test_a_rocm_identitys_file_is_refused_by_a_cuda_211_as_torch_would(
    torch211: Torch, tmp_path: Path
) -> None:
    """The other side: validators are per platform, and tunefleet keeps them as torch wrote
    them, so a CUDA 2.11 refuses a ROCm artifact whole (it must never be served there)."""
    rocm = {**VALIDATORS, "HIP_VERSION": "702", "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-"}
    results = ResultsFile(
        rocm, [ResultRow("GemmTunableOp_Half_TN", "tn_8_8_8_ld_8_8_8", "Gemm_Rocblas_-7", "0.1")]
    )
    path = tmp_path / "rocm.csv"
    path.write_text(format_results(results), encoding="utf-8")
    (answer,) = torch211.read([path])
    assert not answer["loaded"]
    assert any('"HIP_VERSION" is provided' in w for w in answer["warnings"]), answer
    assert answer["rows"] == [], "refused whole: not one of its GEMMs may be loaded"
