"""Which GPU models of its profile a model pod can land on, as it is deployed (pure).

The pod says it with a nodeSelector on the profile's GPU label key, or with a required node
affinity (`requiredDuringSchedulingIgnoredDuringExecution`): its terms are ORed, the
expressions within a term ANDed, so the models a pod can land on are the union over its terms
of what each term's expressions on the key allow:

- nodeSelector key=M: M (untuned with model_not_tuned if the profile does not tune M);
- every term `In [M]`, M tuned: M, served as a nodeSelector would be, nothing added;
- terms `In` several models, or `NotIn`/`Exists`, or a term without the key beside one that
  names it: the tuned models they allow, and maybe others: the artifact is picked at the node;
- `In` only models the profile does not tune (or `NotIn` all it tunes): untuned
  (model_not_tuned);
- nothing about the key: unknown, as before: a one-model profile pins its model (a
  nodeSelector is added), a profile of several starts the pod untuned (no_model_selector).

A pinned nodeSelector is added only when the pod says nothing about the GPU model: a pod whose
affinity names the key has made its own choice, and narrowing it to one model would strand
replicas that fit elsewhere. Where the pod can land on several models (or on one, and on
others), the artifact is chosen where it lands: the webhook mounts every candidate with the
node map and the init container picks by its node (builders/placement.py), never by guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reach:
    """Where a pod can land, in the terms of its profile's GPU models."""

    models: tuple[str, ...]  # the profile's models it can land on, in the profile's order
    elsewhere: bool  # it can also land on a node of another model, or without the label
    said: bool  # the pod constrains the key (nodeSelector, or an affinity term naming it)
    selector: str | None = None  # the nodeSelector's value, when it has the key
    others: tuple[str, ...] = ()  # values the pod names `In` that the profile does not tune

    @property
    def exact(self) -> str | None:
        """The one model the pod lands on, when that is known at admission."""
        return self.models[0] if len(self.models) == 1 and not self.elsewhere else None


def _matches(expr: dict[str, Any], value: str) -> bool:
    """A node selector requirement on a node whose label has `value`."""
    op, values = expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return True
    if op in ("Gt", "Lt") and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False  # DoesNotExist, or an operator the API server would have refused


def _term(term: dict[str, Any], key: str, models: list[str]) -> tuple[list[str], bool, list[str]]:
    """(the profile's models the term allows, whether it allows others, the untuned values it
    names `In`)."""
    exprs = [e for e in term.get("matchExpressions") or [] if e.get("key") == key]
    if not term.get("matchExpressions") and not term.get("matchFields"):
        return [], False, []  # an empty term matches no node
    if not exprs:
        return list(models), True, []  # says nothing of the GPU model
    allowed = [m for m in models if all(_matches(e, m) for e in exprs)]
    ins = [set(map(str, e.get("values") or [])) for e in exprs if e.get("operator") == "In"]
    if not ins:
        # NotIn, Exists, DoesNotExist, Gt, Lt: open sets of values (or no label at all).
        return allowed, True, []
    named = set.intersection(*ins)
    others = sorted(v for v in named if v not in models and all(_matches(e, v) for e in exprs))
    return allowed, bool(others), others


def _required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def _ordered(models: list[str], found: Iterable[str]) -> tuple[str, ...]:
    got = set(found)
    return tuple(m for m in models if m in got)


def reach(pod: dict[str, Any], key: str, models: list[str]) -> Reach:
    """Where `pod` can land among `models` (the profile's, on label `key`)."""
    selected = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(key)
    if selected is not None:
        value = str(selected)
        tuned = value in models
        return Reach((value,) if tuned else (), not tuned, True, value, () if tuned else (value,))
    terms = _required_terms(pod)
    named = any(e.get("key") == key for t in terms for e in t.get("matchExpressions") or [])
    if not named:
        return Reach((), True, False)
    allowed: set[str] = set()
    elsewhere = False
    others: set[str] = set()
    for term in terms:
        t_models, t_else, t_others = _term(term, key, models)
        allowed.update(t_models)
        elsewhere = elsewhere or t_else
        others.update(t_others)
    return Reach(_ordered(models, allowed), elsewhere, True, None, tuple(sorted(others)))
