"""What the webhook writes on a model pod it admits, and what others read of it.

Written by the webhook (webhook/admission.py) at admission; read by the reconciler (pods the
webhook never saw: no admission label) and by `kubectl tunefleet why` (the decision code picks
the fix from its table; the reason is for people). A pod admitted by a version before the
decision annotation reads as code `unknown` with its reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# Set by the webhook on every labelled pod it admits: pods without it were created while the
# webhook was unreachable (`kubectl get pods -l 'tunefleet.io/profile,!tunefleet.io/admission'`).
ADMISSION_LABEL = "tunefleet.io/admission"
# The annotations the webhook writes on a model pod it admits: its decision, the artifact it
# pinned, and warnings.
DECISION_ANNOTATION = "tunefleet.io/decision"  # a code of Code
STATUS_ANNOTATION = "tunefleet.io/status"  # "injected" or "untuned: <reason>", for people
ARTIFACT_URI_ANNOTATION = "tunefleet.io/artifact-uri"
# Also on the artifact's ConfigMap (builders/artifact.py), where delivery reads it back.
ARTIFACT_SHA_ANNOTATION = "tunefleet.io/artifact-sha256"
POD_MODEL_ANNOTATION = "tunefleet.io/gpu-model"
ARTIFACT_CONFIG_MAP_ANNOTATION = "tunefleet.io/artifact-configmap"
# The image volume (repository@digest) a pod mounts its artifact from (oci:// stores).
ARTIFACT_VOLUME_ANNOTATION = "tunefleet.io/artifact-volume"
# "unsigned: <why>": an oci:// volume image mounted under signing policy Optional without a
# valid signature (artifacts/volumes.py); absent when it was signed, or not mounted.
ARTIFACT_SIGNATURE_ANNOTATION = "tunefleet.io/artifact-signature"
IMAGE_WARNING_ANNOTATION = "tunefleet.io/image-warning"
# A pod whose GPU model is picked where it lands (webhook/reach.py): the models offered,
# JSON {model: sha256 of its pinned artifact, or "" where it starts untuned}.
CANDIDATES_ANNOTATION = "tunefleet.io/gpu-model-candidates"


class Code(StrEnum):
    """Why the webhook admitted a pod as it did (also the `code` label of the metric)."""

    NONE = "none"  # injected, nothing to say
    NO_PROFILE = "no_profile"  # the pod names a TuningProfile that does not exist
    INVALID_PROFILE = "invalid_profile"  # the profile's spec does not parse
    NO_MODEL_SELECTOR = "no_model_selector"  # several models, and the pod selects none
    MODEL_NOT_TUNED = "model_not_tuned"  # the pod selects a model the profile does not tune
    NO_ARTIFACT = "no_artifact"  # the profile has no artifact for the model yet
    DEFAULT_ONLY = "default_only"  # nothing beat Default: not switched on unless asked
    PARTITION_MISMATCH = "partition_mismatch"  # tuned on a whole GPU, the pod a partition (or...)
    PARTITION_UNKNOWN = "partition_unknown"  # the pod's GPU partition cannot be told (DRA)
    IMAGE_MISMATCH = "image_mismatch"  # injected, but a container runs another image
    CONFIG_MAP_REPLACED = "config_map_replaced"  # its ConfigMap is gone or not the one made
    # Injected from the store: the artifact's ConfigMap is gone or not the one made, so the
    # fetch init container reads the same artifact from the store (verified) meanwhile.
    STORE_FALLBACK = "store_fallback"
    ERROR = "error"  # the webhook failed: admitted unchanged
    NOT_WATCHED = "not_watched"  # a namespace this release does not watch: left to its own
    # Decided before: an earlier webhook entry of ours (one per replica, charts' webhook.yaml)
    # injected the pod or said why not, or a copied pod spec carries an injection: unchanged.
    ALREADY_ADMITTED = "already_admitted"
    UNKNOWN = "unknown"  # read from a pod without a code (an older version admitted it)


INJECTED, UNTUNED = "injected", "untuned"


@dataclass(frozen=True)
class Admission:
    outcome: str  # INJECTED or UNTUNED
    code: Code = Code.NONE
    reason: str = ""  # why it starts untuned, in words
    uri: str = ""  # the artifact pinned at admission (injected only)
    sha256: str = ""
    gpu_model: str = ""
    image_warning: str = ""
    config_map: str = ""  # the ConfigMap the artifact is mounted from ("": fetched)
    image_volume: str = ""  # the image (repository@digest) it is mounted from, oci:// stores
    unsigned: str = ""  # why that image was mounted without a valid signature (Optional)
    # Picked where the pod lands: {model: pinned sha256, or "" where it starts untuned}. The
    # model picked is in the fetch init container's outcome (contracts/fetch_outcome.py).
    candidates: dict[str, str] = field(default_factory=dict)

    @property
    def delivery(self) -> str:
        """How the pod gets its artifact: ConfigMap or ImageVolume (mounted), else Store (its
        fetch init container downloads and verifies it)."""
        if self.config_map:
            return "ConfigMap"
        return "ImageVolume" if self.image_volume else "Store"

    def write(self, pod: dict[str, Any]) -> None:
        """Mark `pod` (in place): the label every admitted pod gets, and the annotations."""
        meta = pod.setdefault("metadata", {})
        meta.setdefault("labels", {})[ADMISSION_LABEL] = self.outcome
        anns = meta.setdefault("annotations", {})
        anns[DECISION_ANNOTATION] = str(self.code)
        anns[STATUS_ANNOTATION] = (
            INJECTED if self.outcome == INJECTED else f"{UNTUNED}: {self.reason}"
        )
        for key, value in (
            (ARTIFACT_URI_ANNOTATION, self.uri),
            (ARTIFACT_SHA_ANNOTATION, self.sha256),
            (POD_MODEL_ANNOTATION, self.gpu_model),
            (IMAGE_WARNING_ANNOTATION, self.image_warning[:1000]),
            (ARTIFACT_CONFIG_MAP_ANNOTATION, self.config_map),
            (ARTIFACT_VOLUME_ANNOTATION, self.image_volume),
            (ARTIFACT_SIGNATURE_ANNOTATION, f"unsigned: {self.unsigned}"[:1000]
             if self.unsigned else ""),
        ):  # fmt: skip
            if value:
                anns[key] = value
        if self.candidates:
            anns[CANDIDATES_ANNOTATION] = json.dumps(
                self.candidates, separators=(",", ":"), sort_keys=True
            )

    @classmethod
    def read(cls, pod: dict[str, Any]) -> Admission | None:
        """What the webhook wrote; None for a pod it never admitted."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        anns = meta.get("annotations") or {}
        status = str(anns.get(STATUS_ANNOTATION) or "")
        outcome = labels.get(ADMISSION_LABEL)
        if outcome is None and status:
            # Admitted by a version that set the annotation only.
            outcome = UNTUNED if status.startswith(UNTUNED) else INJECTED
        if outcome not in (INJECTED, UNTUNED):
            return None
        raw = str(anns.get(DECISION_ANNOTATION) or "")
        code = Code(raw) if raw in Code._value2member_map_ else Code.UNKNOWN
        if not raw and outcome == INJECTED and not status.startswith(UNTUNED):
            code = Code.NONE
        untuned = outcome == UNTUNED or status.startswith(UNTUNED)
        return cls(
            outcome=UNTUNED if untuned else INJECTED,
            code=code,
            reason=status.removeprefix(f"{UNTUNED}:").strip() if untuned else "",
            uri=str(anns.get(ARTIFACT_URI_ANNOTATION) or ""),
            sha256=str(anns.get(ARTIFACT_SHA_ANNOTATION) or ""),
            gpu_model=str(anns.get(POD_MODEL_ANNOTATION) or ""),
            image_warning=str(anns.get(IMAGE_WARNING_ANNOTATION) or ""),
            config_map=str(anns.get(ARTIFACT_CONFIG_MAP_ANNOTATION) or ""),
            image_volume=str(anns.get(ARTIFACT_VOLUME_ANNOTATION) or ""),
            unsigned=str(anns.get(ARTIFACT_SIGNATURE_ANNOTATION) or "").removeprefix("unsigned: "),
            candidates=_candidates(anns.get(CANDIDATES_ANNOTATION)),
        )


def _candidates(raw: object) -> dict[str, str]:
    try:
        found = json.loads(str(raw)) if raw else {}
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v or "") for k, v in found.items()}
