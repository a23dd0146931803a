"""The report's text: each write and deletion with its reason, then the totals and what is
kept, by reason; sizes and ages in units a reader takes in at a glance.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from .common import UNITS, store_uri
from .plan import Delete, Plan, Rules, Write


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def age_text(seconds: float) -> str:
    """An age, roughly (whole units, rounded down): 3d, 5h, 12m, 40s."""
    for unit, scale in UNITS:
        if seconds >= scale:
            return f"{seconds // scale:.0f}{unit}"
    return f"{max(seconds, 0.0):.0f}s"


def counted(n: int, what: str, many: str = "") -> str:
    return f"{n} {what if n == 1 else many or what + 's'}"


def delete_line(d: Delete, rules: Rules, *, applied: bool) -> str:
    verb = "deleted" if applied else "would delete"
    age = age_text(rules.now - d.newest)
    return (
        f"{verb} {d.kind} {d.where} ({counted(len(d.keys), 'object')}, {size_text(d.size)}, "
        f"newest written {age} ago): {d.reason}"
    )


def left_line(d: Delete) -> str:
    return f"left {d.kind} {d.where}: written again since gc read it, so no longer {d.reason}"


def write_line(w: Write, *, applied: bool) -> str:
    verb = "wrote" if applied else "would write"
    return f"{verb} compacted library entry {w.where}/{w.key.rsplit('/', 1)[-1]} ({w.gemms} GEMMs)"


def report_lines(plan: Plan, *, applied: bool, verbose: bool = False) -> Iterator[str]:
    """What a dry run would do (an applied run reports each step as it is done)."""
    if not applied:
        for w in plan.writes:
            yield write_line(w, applied=False)
        for d in plan.deletes:
            yield delete_line(d, plan.rules, applied=False)
            if verbose:
                yield from (f"  {plan.location.uri(k)}" for k in d.keys)
    yield from (f"note: {n}" for n in plan.notes)
    yield from totals_lines(plan, applied=applied)


def totals_lines(plan: Plan, *, applied: bool) -> Iterator[str]:
    objects = sum(len(d.keys) for d in plan.deletes)
    size = sum(d.size for d in plan.deletes)
    by_kind: Counter[str] = Counter()
    for d in plan.deletes:
        by_kind[d.kind] += len(d.keys)
    verb = "deleted" if applied else "would delete"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
    entries = counted(len(plan.writes), "compacted library entry", "compacted library entries")
    yield (
        f"total: listed {counted(plan.listed, 'object')} ({size_text(plan.listed_bytes)}) under "
        f"{store_uri(plan.location)}; read {counted(plan.profiles, 'profile')}, "
        f"{plan.using_store} naming this store; read {counted(plan.fleet_listed, 'fleet object')}"
    )
    yield (
        f"total: {verb} {counted(objects, 'object')} ({size_text(size)})"
        f"{': ' + kinds if kinds else ''}; {'wrote' if applied else 'would write'} {entries}; "
        f"kept {counted(sum(plan.kept.values()), 'object')}:"
    )
    for why, n in sorted(plan.kept.items(), key=lambda kv: (-kv[1], kv[0])):
        if n:
            yield f"  kept {n}: {why}"
