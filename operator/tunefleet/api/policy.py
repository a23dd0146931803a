"""What a TuningProfile's pod template may ask for: the operator's profile policy (the chart's
`profilePolicy`, passed as TUNEFLEET_PROFILE_POLICY).

tunefleet makes the tuning pods with its own rights, so whoever may write a TuningProfile could
otherwise get a pod the namespace would not let them make themselves (a hostPath volume, a
privileged runtime class, another ServiceAccount's identity). The policy says what the
operator makes on a profile's behalf; a profile that asks for more gets no Job and a Ready
condition (reason TemplateRefused) naming the field and the chart value that would allow it.

The default volume types are those of the Pod Security Standards' restricted profile: no
hostPath, no nfs (a PersistentVolume reaches NFS for the namespaces it is bound to).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tunefleet.api import TuningProfileSpec
from tunefleet.api.pod_template import VOLUME_TYPES

ANY = "*"
RESTRICTED_VOLUME_TYPES = (
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
    "persistentVolumeClaim", "projected", "secret",
)  # fmt: skip
VALUE = "profilePolicy"  # the chart value the policy comes from


@dataclass(frozen=True)
class ProfilePolicy:
    allowed_volume_types: tuple[str, ...] = RESTRICTED_VOLUME_TYPES
    # Names, or "*" for any.
    allowed_runtime_classes: tuple[str, ...] = (ANY,)
    allowed_priority_classes: tuple[str, ...] = (ANY,)
    allowed_service_accounts: tuple[str, ...] = (ANY,)

    @classmethod
    def from_json(cls, raw: str) -> ProfilePolicy:
        """The chart's profilePolicy as JSON ("" for the defaults); anything else is a
        configuration error that stops the operator at start-up, with what to fix."""
        if not raw.strip():
            return cls()
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"TUNEFLEET_PROFILE_POLICY is not JSON ({e}): fix {VALUE}") from None
        if not isinstance(data, dict):
            raise ValueError(f"TUNEFLEET_PROFILE_POLICY must be a JSON object: fix {VALUE}")
        fields = {
            "allowedVolumeTypes": "allowed_volume_types",
            "allowedRuntimeClasses": "allowed_runtime_classes",
            "allowedPriorityClasses": "allowed_priority_classes",
            "allowedServiceAccounts": "allowed_service_accounts",
        }
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{VALUE} has unknown field(s) {', '.join(unknown)}")
        given: dict[str, Any] = {}
        for key, attr in fields.items():
            if key not in data or data[key] is None:
                continue
            value = data[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{VALUE}.{key} must be a list of strings, not {value!r}")
            given[attr] = tuple(value)
        bad = sorted(set(given.get("allowed_volume_types", ())) - set(VOLUME_TYPES))
        if bad:
            raise ValueError(
                f"{VALUE}.allowedVolumeTypes: {', '.join(bad)} not among the volume types a "
                f"TuningProfile can name ({', '.join(VOLUME_TYPES)})"
            )
        return cls(**given)


def _listed(values: Iterable[str]) -> str:
    return ", ".join(values) or "none"


def _name_refusal(field: str, name: str | None, allowed: tuple[str, ...], value: str) -> str:
    if not name or ANY in allowed or name in allowed:
        return ""
    return (
        f"spec.template.spec.{field} {name!r} is not allowed by the operator's profile policy "
        f"(chart value {VALUE}.{value}: {_listed(allowed)}): add it there, or drop the field"
    )


def refusals(spec: TuningProfileSpec, policy: ProfilePolicy) -> list[str]:
    """What of spec.template the policy refuses, each naming the field and the chart value
    that allows it; [] when nothing is refused (no template: nothing to refuse)."""
    template = spec.template
    if template is None or template.spec is None:
        return []
    s = template.spec
    out = []
    for volume in s.volumes or []:
        if volume.type not in policy.allowed_volume_types:
            out.append(
                f"spec.template.spec.volumes[{volume.name}]: {volume.type} volumes are not "
                f"allowed by the operator's profile policy (chart value "
                f"{VALUE}.allowedVolumeTypes: {_listed(policy.allowed_volume_types)}): add "
                f"{volume.type} there, or use another volume type (a persistentVolumeClaim "
                "reaches any PersistentVolume)"
            )
    for field, name, allowed, value in (
        ("runtimeClassName", s.runtime_class_name, policy.allowed_runtime_classes,
         "allowedRuntimeClasses"),
        ("priorityClassName", s.priority_class_name, policy.allowed_priority_classes,
         "allowedPriorityClasses"),
        ("serviceAccountName", s.service_account_name, policy.allowed_service_accounts,
         "allowedServiceAccounts"),
    ):  # fmt: skip
        refused = _name_refusal(field, name, allowed, value)
        if refused:
            out.append(refused)
    return out
