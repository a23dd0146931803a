"""`kubectl tunefleet retune`: ask the operator to retune a profile now from its captured
misses (contracts/retune.py's annotation), and say what it will find."""

from __future__ import annotations

from typing import Any

from tunefleet.contracts.retune import Retunes, new_nonce

from .errors import PluginError


def retune_request(profile: dict[str, Any], gpu_model: str = "") -> dict[str, Any]:
    """What the request asks and what status.capture holds now (the `-o json` form)."""
    meta = profile.get("metadata") or {}
    models = [str(m) for m in ((profile.get("spec") or {}).get("gpu") or {}).get("models") or []]
    if gpu_model and gpu_model not in models:
        raise PluginError(
            f"TuningProfile {meta.get('name')} does not tune {gpu_model}: pick one of "
            f"{', '.join(models) or '(none)'}"
        )
    entries = {
        str(e.get("gpuModel")): e
        for e in (profile.get("status") or {}).get("capture") or []
        if isinstance(e, dict)
    }
    asked = [gpu_model] if gpu_model else models
    capture = ((profile.get("spec") or {}).get("capture") or {}).get("enabled", False)
    return {
        "namespace": meta.get("namespace", ""),
        "name": meta.get("name", ""),
        "nonce": new_nonce(),
        "captureEnabled": bool(capture),
        "models": [
            {
                "gpuModel": m,
                "untuned": int((entries.get(m) or {}).get("untuned") or 0),
                "seen": int((entries.get(m) or {}).get("seen") or 0),
            }
            for m in asked
        ],
    }


def retune_patch(profile: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The annotation's merge patch: the report's nonce under each model it asks, every other
    model's request as the profile holds it (contracts/retune.py), so a retune of another
    model asked at the same time is kept."""
    models = [str(m) for m in ((profile.get("spec") or {}).get("gpu") or {}).get("models") or []]
    asked = [str(m["gpuModel"]) for m in report["models"]]
    return Retunes.read(profile).asking(report["nonce"], asked, models).patch()


def format_retune(report: dict[str, Any]) -> str:
    ns, name = report["namespace"], report["name"]
    lines = [f"Asked TuningProfile {ns}/{name} to retune (request {report['nonce']})."]
    for m in report["models"]:
        if m["untuned"]:
            lines.append(
                f"  {m['gpuModel']}: {m['untuned']} of {m['seen']} captured shape(s) untuned: "
                "a retune of them starts once the model's tuning is settled"
            )
        else:
            lines.append(
                f"  {m['gpuModel']}: no captured shape is untuned now ({m['seen']} seen): "
                "nothing to retune yet"
            )
    if not report["captureEnabled"]:
        lines.append(
            "  note: spec.capture.enabled is false: new pods record no misses; only what was "
            "captured before is retuned"
        )
    lines.append(f"Follow it with: kubectl tunefleet status -n {ns} {name}")
    return "\n".join(lines) + "\n"
