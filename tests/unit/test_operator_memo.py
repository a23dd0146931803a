"""How the Operator reaches kopf's handlers: __main__ puts it in kopf's root memo, and kopf hands
that memo to the startup and cleanup handlers and a shallow copy of it to each admission. Run
through kopf's own machinery (its activity runner, its admission entry point), no cluster: what
a kopf upgrade could change under us. kopf's private modules are used on purpose, for that."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import kopf
from kopf._cogs.structs import references
from kopf._core.actions import lifecycles
from kopf._core.engines import activities, admission, indexing
from kopf._core.intents import causes
from kopf._core.reactor import inventory

from testbed.builders.profiles import CFG
from testbed.builders.wrappers import make_pod
from tests.support.fake_kube import FakeKube
from tunefleet.handlers import startup  # registers ours (pod.py's too) with kopf's registry
from tunefleet.handlers.startup import Operator


class _StandIn:
    """What kopf's startup and cleanup handlers hand their work to."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self, settings: Any, logger: Any) -> None:
        self.calls.append("start")

    async def stop(self) -> None:
        self.calls.append("stop")


def _activity(activity: causes.Activity, memo: kopf.Memo) -> None:
    asyncio.run(
        activities.run_activity(
            lifecycle=lifecycles.all_at_once,
            registry=kopf.get_default_registry(),
            settings=kopf.OperatorSettings(),
            activity=activity,
            indices=indexing.OperatorIndexers().indices,
            memo=memo,  # type: ignore[arg-type]
        )
    )


def test_kopf_hands_the_root_memo_to_the_startup_and_cleanup_handlers() -> None:
    assert startup.operator_startup and startup.operator_cleanup  # registered at import
    operator = _StandIn()
    memo = kopf.Memo(operator=operator)
    _activity(causes.Activity.STARTUP, memo)
    _activity(causes.Activity.CLEANUP, memo)
    assert operator.calls == ["start", "stop"]


def test_each_admission_gets_a_copy_of_the_root_memo_with_the_one_operator() -> None:
    """kopf copies the root memo (copy.copy) per object: what __main__ put there before
    kopf.run is in every copy, and it is the same Operator, not a copy of it."""
    operator = _StandIn()
    root = kopf.Memo(operator=operator)
    memories = inventory.ResourceMemories()
    pod = make_pod().namespace("ml").obj()
    memo = asyncio.run(memories.recall_memo(pod, memobase=root, ephemeral=True))  # type: ignore[arg-type]
    assert memo is not root and isinstance(memo, kopf.Memo)
    assert memo.operator is operator


def test_kopf_runs_pod_mutate_with_the_operator_it_was_handed() -> None:
    """An AdmissionReview through kopf's entry point reaches the Operator's client: a profile
    the cache does not hold is asked of the API server through it."""
    api = FakeKube()
    root = kopf.Memo(operator=Operator(api, replace(CFG, namespaces=("ml",))))
    insights = references.Insights()
    insights.webhook_resources.add(
        references.Resource(group="", version="v1", plural="pods", namespaced=True)
    )
    pod = make_pod().generate_name("m-").namespace("ml").profile("x").container("server").obj()
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "userInfo": {"username": "someone"},
            "namespace": "ml",
            "object": pod,
        },
    }
    response = asyncio.run(
        admission.serve_admission_request(
            review,  # type: ignore[arg-type]
            settings=kopf.OperatorSettings(),
            registry=kopf.get_default_registry(),
            insights=insights,
            memories=inventory.ResourceMemories(),
            memobase=root,  # type: ignore[arg-type]
            indices=indexing.OperatorIndexers().indices,
        )
    )
    assert response["response"]["allowed"] is True
    assert ("TuningProfile", "get", "ml/x") in api.calls
