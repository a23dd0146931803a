"""The machine probe: torch, the GPU, the profile's shapes and the identity, in a child process.

The tuner's own process never imports torch: a process that has run a GEMM (recording the
profile's shapes) or asked the device for its properties may hold a CUDA context on GPU 0, and
that memory would stay taken while the workers tune. So one short child (``_probe``) does all
of it and exits before anything is tuned:

1. torch imports, is a CUDA/ROCm build, sees the GPUs the profile asks for, has the offline API;
2. the profile's shapes pass the checks of this build (check_shapes), before any recording;
3. the shapes are recorded (torch writes the untuned rows into the record directory);
4. the identity and validators are read (identify), with the cuBLASLt algorithm count the
   tuning will use where this torch has one.

Its answer is a JSON file; an error is one line and an exit status, as from the tuner itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import Limits, Shape
from .files import atomic_write_bytes
from .gpu import EXIT_FAILED, TunerError, identify, import_torch, require_gpu, require_offline_api
from .record import check_shapes, record_shapes

PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass
class Machine:
    identity: dict[str, str]
    validators: dict[str, str]
    applied: dict[str, Any] = field(default_factory=dict)


def probe(
    work: Path,
    *,
    gpus: int,
    shapes: tuple[Shape, ...] = (),
    record_dir: Path | None = None,
    limits: Limits | None = None,
    python: str = sys.executable,
) -> Machine:
    """Run the probe child (see the module docstring); raise its TunerError here."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, answer_path = work / "probe-spec.json", work / "probe-answer.json"
    spec = {
        "gpus": gpus,
        "shapes": [asdict(s) for s in shapes],
        "recordDir": str(record_dir) if record_dir is not None else None,
        "limits": asdict(limits or Limits()),
        "answer": str(answer_path),
    }
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    answer_path.unlink(missing_ok=True)
    # Its stdout (torch's and the shapes' chatter) goes to our stderr: our stdout stays one line.
    done = subprocess.run(
        [python, str(PACKAGE_DIR), "_probe", "--spec", str(spec_path)],
        stdout=sys.stderr,
        check=False,
    )
    try:
        answer = json.loads(answer_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise TunerError(
            f"the probe of torch and the GPU failed (exit status {done.returncode}); see the "
            "log above"
        ) from None
    if answer.get("error"):
        raise TunerError(str(answer["error"]), int(answer.get("code", EXIT_FAILED)))
    return Machine(dict(answer["identity"]), dict(answer["validators"]), answer.get("applied", {}))


def probe_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    answer_path = Path(spec["answer"])
    try:
        doc: dict[str, Any] = _probe(spec)
        code = 0
    except TunerError as exc:
        doc, code = {"error": str(exc), "code": exc.exit_code}, exc.exit_code
    atomic_write_bytes(answer_path, json.dumps(doc).encode("utf-8"))
    return code


def _probe(spec: dict[str, Any]) -> dict[str, Any]:
    shapes = tuple(Shape(**s) for s in spec["shapes"])
    limits = Limits(**spec["limits"])
    torch = import_torch()
    require_gpu(torch, int(spec["gpus"]))
    require_offline_api(torch, int(spec["gpus"]))
    check_shapes(torch, shapes)  # before anything runs: a refusal costs no recording
    if shapes and spec.get("recordDir"):
        record_shapes(torch, shapes, Path(spec["recordDir"]))
    tunable = torch.cuda.tunable
    applied: dict[str, Any] = {}
    if hasattr(tunable, "set_cublaslt_requested_algo_count"):
        tunable.set_cublaslt_requested_algo_count(limits.cublaslt_algo_count)
        applied["cublasltAlgoCount"] = int(tunable.get_cublaslt_requested_algo_count())
    identity, validators = identify(torch)
    if "cublasltAlgoCount" in applied:
        # It decides which candidates exist: part of what an artifact was tuned with.
        identity["cublasltAlgoCount"] = str(applied["cublasltAlgoCount"])
    return {"identity": identity, "validators": validators, "applied": applied}
