"""The house rules of the code's layout, read from the source (no imports run):

- the operator imports only tuner_job's public format layer (tuner_job.FORMAT_LAYER);
- that layer imports nothing but the standard library and itself (it runs in users' images);
- no import circle among tunefleet's modules, lazy imports inside functions included, nor
  anywhere in the tree (tuner_job, bench, testbed, tests, hack, scripts);
- no circle among tunefleet's folders either (each module counted as its folder's, a module
  directly in the package as its own): the folders stack in layers (docs/operator.md's map);
- at most 8 modules directly in operator/tunefleet/: the rest live in rooms named by what
  they do (docs/operator.md's map);
- nothing outside tests/ imports from tests/ (what the demo and the benchmarks share with the
  e2e tests is testbed/); artifacts/ never imports plugin/ (the kubectl plugin is a client of
  the product, not a library of it);
- builders/ build manifests: they never import admission, status or reconcile code;
- runtime/ is the controller machinery (API client, reflector, work queue, leader election,
  heap): it imports nothing of tunefleet outside runtime/, so the domain can change beneath it;
- kopf is the webhook's server and the startup's, nothing else: the rest speaks the project's
  own error words (runtime/client.Temporary, Permanent);
- no module keeps the Operator (handlers/startup.py): __main__ makes it and hands it to kopf's
  memo, where kopf's handlers read it; the reflectors' handlers are bound to it;
- the reconciler's engine (controller.py) is handed the reconcile it runs: it imports no function
  of reconciler/reconcile.py, nor the module;
- no test module imports another, nor a conftest.py: shared fakes live in tests/support/,
  builders in testbed/builders/ (nothing under tests/ builds a test object; no function of a test
  module returns an apiVersion/kind literal);
- no product function (operator, tuner) is longer than 60 lines: a longer one does several
  jobs, and each job wants its own name;
- no product function takes more than 6 parameters (self aside): past that, some of them
  travel together and want a value object's name (tuner_job's ArtifactId, RunFacts);
- the benchmarks (bench/) keep the same two rules: they run for an hour against a live
  cluster, so they are read far more often than they are run (bench_scale's Options).
- bench/ and the testbed build their Kubernetes objects with testbed/builders/ too: no function of
  theirs outside it returns or builds an apiVersion/kind literal.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import tuner_job

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "tunefleet"
TUNER = ROOT / "tuner_job"
BENCH = ROOT / "bench"
TESTS = ROOT / "tests"


def module_name(path: Path, base: Path, package: str) -> str:
    rel = path.relative_to(base).with_suffix("")
    parts = [package, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _in_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(path: Path, module: str) -> Iterator[str]:
    """Every module `path` imports (absolute names), wherever the import statement stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if _in_type_checking(node, parents):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            yield prefix
            for alias in node.names:
                yield f"{prefix}.{alias.name}"


def graph(base: Path, package: str) -> dict[str, set[str]]:
    mods = {module_name(p, base, package): p for p in base.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        out[name] = {m for m in imports(path, name) if m in mods and m != name}
    return out


def test_the_operator_imports_only_the_public_format_layer_of_tuner_job() -> None:
    allowed = {f"tuner_job.{m}" for m in tuner_job.FORMAT_LAYER}
    bad = []
    for path in OPERATOR.rglob("*.py"):
        name = module_name(path, OPERATOR, "tunefleet")
        for imported in imports(path, name):
            if not imported.startswith("tuner_job") or imported == "tuner_job":
                continue  # the package itself (bootstrap copies it) has no code to share
            top = ".".join(imported.split(".")[:2])
            if top == "tuner_job.__version__":
                continue
            leaf = imported.rsplit(".", 1)[-1]
            if top not in allowed or leaf.startswith("_") or "._" in imported:
                bad.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not bad, "\n".join(bad)


def test_the_format_layer_is_stdlib_only() -> None:
    bad = []
    stdlib = sys.stdlib_module_names
    for m in tuner_job.FORMAT_LAYER:
        path = TUNER / f"{m}.py"
        for imported in imports(path, f"tuner_job.{m}"):
            top = imported.split(".")[0]
            if top == "tuner_job":
                mod = imported.split(".")[1] if "." in imported else ""
                if mod and mod not in tuner_job.FORMAT_LAYER and mod != "__version__":
                    bad.append(f"tuner_job/{m}.py imports {imported} (not the format layer)")
            elif top not in stdlib and top != "__future__":
                bad.append(f"tuner_job/{m}.py imports {imported} (not the standard library)")
    assert not bad, "\n".join(bad)


def _cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            # A package importing its own submodules (re-exports) is not a circle.
            if m.startswith(n + "."):
                continue
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if state.get(m) is None:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if state.get(n) is None:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_circle_in_tunefleet() -> None:
    g = graph(OPERATOR, "tunefleet")
    # A submodule's import of its own package's __init__ is how Python loads it, not a circle.
    for name, deps in g.items():
        deps -= {p for p in deps if name.startswith(p + ".")}
    circle = _cycle(g)
    assert circle is None, " -> ".join(circle or [])


def folder_of(module: str) -> str:
    """tunefleet.<folder>.<...> as tunefleet.<folder>; a module directly in the package (naming,
    kube, config) is a node of its own."""
    return ".".join(module.split(".")[:2])


def folder_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph `g` with each module collapsed to its folder. The package itself
    (tunefleet/__init__.py: the version and the API group's names) is where every module is
    loaded from, not a folder of the layers."""
    out: dict[str, set[str]] = {}
    for name, deps in g.items():
        here = folder_of(name)
        out.setdefault(here, set()).update(
            folder_of(d) for d in deps if folder_of(d) not in (here, "tunefleet")
        )
    out.pop("tunefleet", None)
    return out


def arrows(g: dict[str, set[str]], circle: list[str]) -> list[str]:
    """The module imports behind each arrow of a folder circle, to say which to move."""
    return [
        f"{name} imports {dep}"
        for a, b in pairwise(circle)
        for name, deps in sorted(g.items())
        if folder_of(name) == a
        for dep in sorted(deps)
        if folder_of(dep) == b
    ]


def test_no_import_circle_among_tunefleets_folders() -> None:
    g = graph(OPERATOR, "tunefleet")
    circle = _cycle(folder_graph(g))
    assert circle is None, " -> ".join(circle or []) + "\n" + "\n".join(arrows(g, circle or []))


def test_the_folder_rule_catches_a_circle_through_folders() -> None:
    g = {
        "tunefleet.api.profile_status": {
            "tunefleet.contracts.artifact_record",
            "tunefleet.api.base",
        },
        "tunefleet.contracts.admission_record": {"tunefleet.naming", "tunefleet"},
        "tunefleet.contracts.artifact_record": set(),
        "tunefleet.naming": {"tunefleet.api.base"},
        "tunefleet.api.base": set(),
    }
    folders = folder_graph(g)
    assert folders["tunefleet.api"] == {"tunefleet.contracts"}  # within a folder: no arrow
    circle = _cycle(folders)
    assert circle == ["tunefleet.api", "tunefleet.contracts", "tunefleet.naming", "tunefleet.api"]
    assert (
        arrows(g, circle)[0]
        == "tunefleet.api.profile_status imports tunefleet.contracts.artifact_record"
    )
    del g["tunefleet.contracts.admission_record"]
    assert _cycle(folder_graph(g)) is None


PACKAGES = {
    "tunefleet": OPERATOR,
    "tuner_job": TUNER,
    "bench": BENCH,
    "testbed": ROOT / "testbed",
    "tests": TESTS,
    "hack": ROOT / "hack",
    "scripts": ROOT / "scripts",
}


def tree_graph() -> dict[str, set[str]]:
    """Every Python module of the repository and what it imports of the others."""
    g: dict[str, set[str]] = {}
    for package, base in PACKAGES.items():
        if base.is_dir():
            for path in base.rglob("*.py"):
                name = module_name(path, base, package)
                g[name] = set(imports(path, name))
    return {
        name: {m for m in deps if m in g and m != name and not name.startswith(m + ".")}
        for name, deps in g.items()
    }


def test_no_import_circle_anywhere_in_the_tree() -> None:
    circle = _cycle(tree_graph())
    assert circle is None, " -> ".join(circle or [])


def test_the_tree_rule_catches_a_circle_across_folders() -> None:
    g = {"bench.suite": {"testbed.cluster"}, "testbed.cluster": {"bench.suite"}}
    assert _cycle(g) == ["bench.suite", "testbed.cluster", "bench.suite"]


MAX_TOP_MODULES = 8


def test_at_most_8_modules_directly_in_the_operator_package() -> None:
    top = sorted(p.name for p in OPERATOR.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"put each in the folder of what it does: {top}"


def outside_imports_of_tests(g: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} imports {dep}"
        for name, deps in g.items()
        if name.split(".")[0] != "tests"
        for dep in deps
        if dep.split(".")[0] == "tests"
    )


def test_nothing_outside_tests_imports_from_tests() -> None:
    bad = outside_imports_of_tests(tree_graph())
    assert not bad, "move what both need to testbed/:\n" + "\n".join(bad)
    assert outside_imports_of_tests({"bench.suite": {"tests.support.poll"}}) == [
        "bench.suite imports tests.support.poll"
    ]


def test_artifacts_never_imports_the_kubectl_plugin() -> None:
    g = graph(OPERATOR, "tunefleet")
    bad = sorted(
        f"{name} imports {dep}"
        for name, deps in g.items()
        if name.startswith("tunefleet.artifacts")
        for dep in deps
        if dep.startswith("tunefleet.plugin")
    )
    assert not bad, "\n".join(bad)


def test_no_import_circle_in_tuner_job() -> None:
    g = graph(TUNER, "tuner_job")
    for name, deps in g.items():
        deps -= {p for p in deps if name.startswith(p + ".") or p == "tuner_job"}
    circle = _cycle(g)
    assert circle is None, " -> ".join(circle or [])


def test_builders_build_manifests_only() -> None:
    """builders/ may use names, the API types, settings and the storage seam; never the
    admission, status or reconcile code that decides what to build."""
    forbidden = ("tunefleet.webhook", "tunefleet.reconciler.status", "tunefleet.reconciler.reconcile",
                 "tunefleet.reconciler.observe", "tunefleet.reconciler.controller", "tunefleet.handlers")  # fmt: skip
    bad = []
    for path in (OPERATOR / "builders").rglob("*.py"):
        name = module_name(path, OPERATOR, "tunefleet")
        for imported in imports(path, name):
            if imported.startswith(forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not bad, "\n".join(bad)


def imports_of_test_modules(tests: Path) -> list[str]:
    """Each module named test_* that a file under `tests` imports (tests/unit/data, test data,
    excepted)."""
    bad = []
    for path in sorted(tests.rglob("*.py")):
        if path.relative_to(tests).parts[:2] == ("unit", "data"):
            continue
        found = set()
        for imported in imports(path, module_name(path, tests, "tests")):
            parts = imported.split(".")
            if parts[0] != "tests":
                continue
            for i, part in enumerate(parts[1:], start=1):
                if part.startswith("test_"):
                    found.add(".".join(parts[: i + 1]))
                    break
        bad += [f"{path.relative_to(tests.parent)} imports {m}" for m in sorted(found)]
    return bad


def test_no_module_imports_a_conftest() -> None:
    """conftest.py is pytest's to load (twice, under another name, if a test imports it too);
    what tests share beside fixtures lives in tests/support/."""
    bad = sorted(
        f"{name} imports {dep}"
        for name, deps in tree_graph().items()
        for dep in deps
        if dep.rsplit(".", 1)[-1] == "conftest"
    )
    assert not bad, "\n".join(bad)


def test_no_test_module_imports_another() -> None:
    """A builder or fake two test modules share lives in tests/support/ (tests/README.md),
    where a newcomer finds it, not in one of the test modules."""
    bad = imports_of_test_modules(TESTS)
    assert not bad, "\n".join(bad)


RUNTIME = "tunefleet.runtime"


MACHINERY = (RUNTIME, "tunefleet.informers")


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def runtime_breaches(g: dict[str, set[str]]) -> list[str]:
    """Imports by the machinery (runtime/, informers/) of tunefleet modules outside it (the
    package itself included: its __init__ holds the domain's API group)."""
    return sorted(
        f"{name} imports {dep}"
        for name, deps in g.items()
        if any(_in(name, m) for m in MACHINERY)
        for dep in deps
        if dep.startswith("tunefleet") and not any(_in(dep, m) for m in MACHINERY)
    )


def test_the_machinery_imports_nothing_of_the_domain() -> None:
    g = graph(OPERATOR, "tunefleet")
    for m in MACHINERY:
        assert any(n.startswith(m + ".") for n in g), f"{m} is gone?"
    breaches = runtime_breaches(g)
    assert not breaches, "\n".join(breaches)


def test_the_machinery_rule_catches_a_domain_import() -> None:
    g = {
        "tunefleet.runtime.client": {"tunefleet.runtime.heap"},
        "tunefleet.runtime.reflector": {"tunefleet.naming", "tunefleet.runtime.client"},
        "tunefleet.informers.view_cache": {
            "tunefleet.runtime.heap",
            "tunefleet.informers.view_parts",
        },
        "tunefleet.informers.view_parts": {"tunefleet.watched.kinds"},
        "tunefleet.reconciler.reconcile": {"tunefleet.runtime.client"},
    }
    assert runtime_breaches(g) == [
        "tunefleet.informers.view_parts imports tunefleet.watched.kinds",
        "tunefleet.runtime.reflector imports tunefleet.naming",
    ]


# kopf runs the process (__main__), its startup and cleanup, and serves the webhook (the
# mutating handler and its server); no other module may need it.
KOPF_ALLOWED = {
    "tunefleet.__main__",
    "tunefleet.handlers.startup",
    "tunefleet.handlers.on_pod",
    "tunefleet.webhook.server",
}


def test_kopf_is_confined_to_the_startup_and_the_webhook() -> None:
    bad = []
    for path in OPERATOR.rglob("*.py"):
        name = module_name(path, OPERATOR, "tunefleet")
        if name in KOPF_ALLOWED:
            continue
        if any(m == "kopf" or m.startswith("kopf.") for m in imports(path, name)):
            bad.append(f"{path.relative_to(ROOT)} imports kopf")
    assert not bad, "\n".join(bad)


MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 6
Function = ast.FunctionDef | ast.AsyncFunctionDef


def product_paths() -> list[Path]:
    return sorted([*OPERATOR.rglob("*.py"), *TUNER.rglob("*.py")])


def bench_paths() -> list[Path]:
    return sorted(BENCH.rglob("*.py"))


def over(paths: list[Path], measure: Callable[[Function], int], limit: int) -> list[str]:
    """Each function in `paths` whose measure is over `limit`, as path:line name: measure."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, Function) and measure(node) > limit:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {measure(node)}")
    return out


def lines(node: Function) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def parameters(node: Function) -> int:
    a = node.args
    names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    if names[:1] in (["self"], ["cls"]):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def test_no_product_function_is_over_60_lines() -> None:
    found = over(product_paths(), lines, MAX_FUNCTION_LINES)
    assert not found, "split at its seams (lines):\n" + "\n".join(found)
    # The rule can fail: the longest function there is over a lower limit.
    assert over(product_paths(), lines, 40)


def test_no_product_function_takes_more_than_6_parameters() -> None:
    found = over(product_paths(), parameters, MAX_PARAMETERS)
    note = "give the parameters that travel together a value object:\n"
    assert not found, note + "\n".join(found)
    # The rule can fail: some function takes more than a lower limit.
    assert over(product_paths(), parameters, 3)


# --- one Operator, reached through kopf's memo ------------------------------------------------

# handlers/startup.py's Operator owns the process: __main__ makes it and hands it to kopf's memo;
# kopf's handlers read it there, the reflectors' handlers are bound to it. No module keeps one.
OWNER = "Operator"


def operator_globals(source: str, where: str) -> list[str]:
    """Module-level Operators (an assignment named OPERATOR, or of an Operator(...) made at
    import), `global OPERATOR`, and imports or module attribute reads of an OPERATOR."""
    found = []
    tree = ast.parse(source)
    for names, made in module_assignments(tree):
        found += [f"{where}: {n} = {OWNER}(...)" for n in names if made == OWNER]
        found += [f"{where}: {n}" for n in names if n == "OPERATOR" and made != OWNER]
    for node in ast.walk(tree):
        if isinstance(node, ast.Global) and "OPERATOR" in node.names:
            found.append(f"{where}: global OPERATOR")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{where}: imports OPERATOR" for a in node.names if a.name == "OPERATOR"]
        elif isinstance(node, ast.Attribute) and node.attr == "OPERATOR":
            found.append(f"{where}: reads {ast.unparse(node)}")
    return found


def test_no_module_keeps_the_operator() -> None:
    found = []
    for path in sorted(OPERATOR.rglob("*.py")):
        found += operator_globals(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], found


def test_the_operator_global_rule_catches_one() -> None:
    assert operator_globals("OPERATOR = Operator()\n", "m") == ["m: OPERATOR = Operator(...)"]
    assert operator_globals("ONE: Operator = startup.Operator()\n", "m") == [
        "m: ONE = Operator(...)"
    ]
    assert operator_globals("OPERATOR = None\n", "m") == ["m: OPERATOR"]
    assert operator_globals("from tunefleet.handlers.startup import OPERATOR\n", "m") == [
        "m: imports OPERATOR"
    ]
    assert operator_globals("x = startup.OPERATOR.cache\n", "m") == ["m: reads startup.OPERATOR"]
    assert operator_globals("def f():\n    global OPERATOR\n", "m") == ["m: global OPERATOR"]
    # Made inside a function (as __main__ does) and handed on: allowed.
    assert operator_globals("def main():\n    run(memo=Memo(operator=Operator()))\n", "m") == []


# The engine (reconciler/controller.py) is handed the reconcile it runs; it may import the
# reconcile's value types (Around, Outcome), no function of it, nor the module itself.
RECONCILE = "tunefleet.reconciler.reconcile"


def reconcile_functions_imported(engine: str, reconcile: str, where: str) -> list[str]:
    """What `engine` (a module of tunefleet/reconciler/) imports of the reconcile module
    (`reconcile`'s source): the module itself, or any function defined at its top level."""
    tree = ast.parse(reconcile).body
    functions = {n.name for n in tree if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    found = []
    for node in ast.walk(ast.parse(engine)):
        if isinstance(node, ast.Import):
            found += [f"{where}: imports {a.name}" for a in node.names if a.name == RECONCILE]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative to tunefleet.reconciler, where the engine lives
                base = ["tunefleet", "reconciler"][: 3 - node.level]
                module = ".".join([*base, *([module] if module else [])])
            for alias in node.names:
                whole = f"{module}.{alias.name}"
                if whole == RECONCILE or (module == RECONCILE and alias.name in functions):
                    found.append(f"{where}: imports {whole}")
    return found


def test_the_controller_imports_no_reconcile_function() -> None:
    reconciler = OPERATOR / "reconciler"
    reconcile = (reconciler / "reconcile.py").read_text()
    assert "def sync_profile(" in reconcile  # what the rule is about is still there
    engine = (reconciler / "controller.py").read_text()
    assert reconcile_functions_imported(engine, reconcile, "controller.py") == []


def test_the_reconcile_function_rule_catches_one() -> None:
    reconcile = "class Outcome: ...\ndef sync_profile(p): ...\ndef requeue_after(s): ...\n"
    ok = f"from {RECONCILE} import Outcome\n"
    assert reconcile_functions_imported(ok, reconcile, "c") == []
    bad = f"from {RECONCILE} import Outcome, sync_profile\n"
    assert reconcile_functions_imported(bad, reconcile, "c") == [
        f"c: imports {RECONCILE}.sync_profile"
    ]
    assert reconcile_functions_imported(
        "from tunefleet.reconciler import reconcile\n", reconcile, "c"
    )
    assert reconcile_functions_imported(f"import {RECONCILE} as r\n", reconcile, "c")
    assert reconcile_functions_imported("from .reconcile import requeue_after\n", reconcile, "c")
    assert reconcile_functions_imported("from . import reconcile\n", reconcile, "c")
    lazy = f"def f():\n    from {RECONCILE} import sync_profile\n"
    assert reconcile_functions_imported(lazy, reconcile, "c")


# --- one client object ------------------------------------------------------------------------

# What a process talks to the API server through: made once (handlers/startup.py's Operator owns
# the operator's), handed to what needs it, never a module's own.
CLIENT_TYPES = {"Kube", "Client", "ApiClient", "WatchApi", "_Poster"}
CLIENT_NAMES = {"_api", "_fence", "_events", "_poster", "_client", "_kube"}


def module_assignments(tree: ast.Module) -> Iterator[tuple[list[str], str]]:
    """Each module-level assignment: the names it binds, and what it calls to make the value
    (the called name's last part, "" when the value is not a call)."""
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        fn = value.func if isinstance(value, ast.Call) else None
        made = fn.attr if isinstance(fn, ast.Attribute) else str(getattr(fn, "id", ""))
        yield [t.id for t in targets if isinstance(t, ast.Name)], made


def client_globals(source: str, where: str) -> list[str]:
    """Module-level clients, fences and Event posters, and `global` statements over them."""
    found = []
    tree = ast.parse(source)
    for names, made in module_assignments(tree):
        if made in CLIENT_TYPES or made.endswith("V1Api") or made == "CustomObjectsApi":
            found += [f"{where}: {n} = {made}(...)" for n in names]
        found += [f"{where}: {n}" for n in names if n in CLIENT_NAMES]
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [f"{where}: global {n}" for n in node.names if n in CLIENT_NAMES]
    return found


def test_no_module_level_client_fence_or_poster_in_the_operator() -> None:
    found = []
    for path in sorted(OPERATOR.rglob("*.py")):
        found += client_globals(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], found


def test_the_client_global_rule_catches_one() -> None:
    assert client_globals("_api = None\n", "m") == ["m: _api"]
    assert client_globals("CLIENT = kube.Kube()\n", "m") == ["m: CLIENT = Kube(...)"]
    assert client_globals("core = kubernetes.client.CoreV1Api(x)\n", "m") == [
        "m: core = CoreV1Api(...)"
    ]
    assert client_globals("def f():\n    global _fence\n", "m") == ["m: global _fence"]


# Modules whose functions talk to an API server, by the names tests import them under.
CLIENT_MODULES = {"kube", "client", "cluster_mod", "kubernetes", "cluster"}


def client_patches(source: str, where: str) -> list[str]:
    """monkeypatch.setattr calls that replace a function of a client module (constants, in
    UPPER_CASE, may be set: they are not how a test talks to a fake API)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setattr"
            and ast.unparse(node.func.value) == "monkeypatch"
            and node.args
        ):
            continue
        target = ast.unparse(node.args[0])
        name = (
            node.args[1].value
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
            else ""
        )
        if isinstance(node.args[0], ast.Constant):  # "module.attribute"
            target, _, name = str(node.args[0].value).rpartition(".")
        module = target.rsplit(".", 1)[-1]
        if module in CLIENT_MODULES and not str(name).isupper():
            found.append(f"{where}:{node.lineno}: monkeypatch.setattr({target}, {name!r})")
    return found


def test_no_test_patches_a_client_function() -> None:
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        found += client_patches(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], found


def test_the_client_patch_rule_catches_one() -> None:
    assert client_patches('monkeypatch.setattr(kube, "read", f)\n', "t")
    assert client_patches('monkeypatch.setattr("tunefleet.kube.job_events", f)\n', "t")
    assert client_patches('monkeypatch.setattr(cluster_mod, "connect", f)\n', "t")
    assert not client_patches('monkeypatch.setattr(client, "MIN_WRITE_SECONDS", 0.05)\n', "t")


def test_lists_are_paged_by_the_one_paginator() -> None:
    """runtime/client.pages follows continue tokens; nothing else in the operator does."""
    found = [
        str(path.relative_to(ROOT))
        for path in sorted(OPERATOR.rglob("*.py"))
        if path.name != "client.py" and '.get("continue")' in path.read_text()
    ]
    assert found == [], found


# The client's writes, by method name (kube.Kube's own and the generated clients').
WRITES = {
    "create_owned", "patch_owned", "delete_owned", "replace_profile_status",
    "remove_profile_finalizer", "post_event_soon", "create_config_map", "patch_config_map",
    # The stores' writes (storage/store.py: Store, Swappable, Board), by their verbs.
    "put", "put_if_absent", "put_file_if_absent", "delete", "create", "replace_if", "post",
    "unpost",
}  # fmt: skip
GENERATED_WRITE = ("create_namespaced_", "patch_namespaced_", "delete_namespaced_", "replace_")
# What a reconcile runs through (sync_profile's gather and decide steps); its writes are
# reconciler/apply.py's alone.
RECONCILE_PATH = [
    "reconciler", "capture/step.py", "capture/loop.py", "capture/keys.py", "serving",
    "informers", "fleet",
]  # fmt: skip


def writes_in(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name in WRITES or name.startswith(GENERATED_WRITE):
                found.append(f"{where}:{node.lineno}: {name}")
    return found


def test_only_the_apply_step_writes_on_a_reconciles_path() -> None:
    found = []
    for part in RECONCILE_PATH:
        base = OPERATOR / part
        for path in sorted([base] if base.is_file() else base.rglob("*.py")):
            if path.name != "apply.py":
                found += writes_in(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], found


def test_the_write_rule_catches_one() -> None:
    assert writes_in("s.client.create_owned(job)\n", "m") == ["m:1: create_owned"]
    assert writes_in("core.patch_namespaced_config_map(n, ns, b)\n", "m")
    assert writes_in("client.read('ConfigMap', ns, n)\n", "m") == []


def test_status_is_built_as_the_typed_model_only() -> None:
    """reconciler/status.py builds api/profile_status.TuningProfileStatus and its parts; no function
    there returns a status as a dict (the write serialises the model, once)."""
    path = OPERATOR / "reconciler" / "status.py"
    found = [
        f"{node.name}: {ast.unparse(node.returns)}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and node.returns is not None
        and "dict[str, Any]" in ast.unparse(node.returns)
    ]
    assert found == [], found


# What builds a test object: a dict literal with one of an API object's or a status entry's
# keys, or a profile spec's (gpu beside image, workload or storage), a model parsed from a
# literal, or one of the product's records made in place. Judged
# by what a function does, not by its name, so a renamed builder is still caught.
BUILT_KEYS = {"metadata", "apiVersion", "gpuModel"}
BUILT_TYPES = {"JobSpec", "ArtifactRecord", "JobObservation", "Child"}
SPEC_KEYS = {"image", "workload", "storage"}


def _builds(fn: ast.FunctionDef) -> str:
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if keys & BUILT_KEYS:
                return f"a dict with {sorted(keys & BUILT_KEYS)}"
            if "gpu" in keys and keys & SPEC_KEYS:
                return "a profile spec"
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in BUILT_TYPES:
                return name
            if name == "model_validate" and node.args and isinstance(node.args[0], ast.Dict):
                return "a model parsed from a literal"
    return ""


def parsed_test_modules(tests: Path) -> Iterator[tuple[Path, ast.Module]]:
    """The test modules (and conftests) outside tests/support/ and test data, parsed."""
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        if rel.parts[0] != "support" and "data" not in rel.parts:
            yield rel, ast.parse(path.read_text())


def parsed_test_code(tests: Path) -> Iterator[tuple[Path, ast.Module]]:
    """Every module under `tests` but test data and the fakes of tests/support/ (fake_*.py:
    they answer as the API server does, with the objects they were given or made), parsed."""
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        if "data" not in rel.parts and not (
            rel.parts[0] == "support" and rel.name.startswith("fake_")
        ):
            yield rel, ast.parse(path.read_text())


def local_builders(tests: Path) -> list[str]:
    """Functions under `tests` (module level or in a class, fixtures included; tests/support/
    too, its fakes aside) that build a test object: their home is testbed/builders/."""
    out = []
    for rel, tree in parsed_test_code(tests):
        fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            fns += [n for n in cls.body if isinstance(n, ast.FunctionDef)]
        for fn in fns:
            if fn.name.startswith("test"):
                continue
            why = _builds(fn)
            if why:
                out.append(f"{rel}:{fn.lineno} {fn.name} builds {why}")
    return out


def test_no_test_object_builder_outside_testbed_builders() -> None:
    found = local_builders(TESTS)
    assert not found, "build it with testbed/builders/ (wrappers.py):\n" + "\n".join(found)
    # The home is what the rule exempts by not reading it: it holds the builders.
    assert local_builders(ROOT / "testbed")


def test_the_builder_rule_catches_a_local_builder(tmp_path: Path) -> None:
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_x.py").write_text(
        "def pod_of_mine(name):\n    return {'metadata': {'name': name}}\n"
        "class T:\n    def spec(self):\n        return S.model_validate({'image': 'x'})\n"
    )
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "w.py").write_text("def make():\n    return {'metadata': {}}\n")
    (tmp_path / "support" / "fake_api.py").write_text("def read():\n    return {'metadata': {}}\n")
    found = [
        f.split(" ")[0].split(":")[0] + " " + f.split(" ")[1] for f in local_builders(tmp_path)
    ]
    assert found == ["support/w.py make", "unit/test_x.py pod_of_mine", "unit/test_x.py spec"]


MANIFEST_KEYS = {"apiVersion", "kind"}


def _returned(fn: Function | ast.Lambda) -> Iterator[ast.expr]:
    """What `fn` itself returns (its nested functions' returns are theirs)."""
    if isinstance(fn, ast.Lambda):
        yield fn.body
        return
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            yield node.value
        if not isinstance(node, Function | ast.Lambda | ast.ClassDef):
            todo += ast.iter_child_nodes(node)


def manifest_literals(tests: Path) -> list[str]:
    """Functions in test modules (tests/**/test_*.py; nested ones and lambdas too) that return
    a dict literal with an object's apiVersion or kind: a manifest built in place."""
    out: list[tuple[Path, int, str]] = []
    for path in sorted(tests.rglob("test_*.py")):
        rel = path.relative_to(tests)
        if "data" in rel.parts:
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, Function | ast.Lambda):
                continue
            for value in _returned(fn):
                keys = {k.value for k in getattr(value, "keys", []) if isinstance(k, ast.Constant)}
                if isinstance(value, ast.Dict) and keys & MANIFEST_KEYS:
                    out.append((rel, value.lineno, getattr(fn, "name", "lambda")))
    return [f"{rel}:{line} {name}" for rel, line, name in sorted(out)]


def test_no_test_module_returns_a_manifest_literal() -> None:
    found = manifest_literals(TESTS)
    assert not found, "build it with testbed/builders/wrappers.py:\n" + "\n".join(found)


def test_the_manifest_literal_rule_catches_one(tmp_path: Path) -> None:
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "test_x.py").write_text(
        "def test_a():\n    def pod(name):\n        doc = {'kind': 'Pod'}\n"
        "        return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name}}\n"
        "    return None\n"
        "def cm():\n    return {'kind': 'ConfigMap'}\n"
        "f = lambda: {'apiVersion': 'v1'}\n"
        "def fine():\n    return make_pod('x').obj()\n"
    )
    (tmp_path / "e2e" / "helpers.py").write_text("def cm():\n    return {'kind': 'ConfigMap'}\n")
    assert [f.split(" ")[1] for f in manifest_literals(tmp_path)] == ["pod", "cm", "lambda"]


GENERATED_METHOD = re.compile(
    r"^(read|create|patch|replace|delete|list)_(namespaced_\w+|\w+_for_all_namespaces|"
    r"cluster_custom_object|node|namespace)$"
)


def local_fake_apis(tests: Path) -> list[str]:
    """Classes in test modules outside tests/support/ (nested ones too) that stand in for a
    generated API client: one of its methods by name."""
    out = []
    for rel, tree in parsed_test_modules(tests):
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            fakes = [
                f.name
                for f in cls.body
                if isinstance(f, ast.FunctionDef) and GENERATED_METHOD.match(f.name)
            ]
            if fakes:
                out.append(f"{rel}:{cls.lineno} {cls.name} fakes {fakes}")
    return out


def test_every_fake_api_a_unit_test_talks_to_lives_in_tests_support() -> None:
    found = local_fake_apis(TESTS)
    assert not found, "use tests/support/fake_kube.py (FakeKube, Generated):\n" + "\n".join(found)


def test_the_fake_api_rule_catches_a_local_stand_in(tmp_path: Path) -> None:
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_x.py").write_text(
        "def test_a():\n    class Batch:\n        def read_namespaced_job(self, n, ns):\n"
        "            return None\n"
    )
    assert [f.split(" ")[1] for f in local_fake_apis(tmp_path)] == ["Batch"]


# --- the reconcile's pure steps -----------------------------------------------------------------

# decide.plan, status.compute and announce work on values: they reach neither the API server
# nor a store, so nothing they import may.
PURE_STEPS = ["reconciler/decide.py", "reconciler/status.py", "reconciler/announce.py"]
IO_MODULES = ("tunefleet.kube", "tunefleet.runtime", "tunefleet.storage")


def io_imports(path: Path) -> list[str]:
    module = "tunefleet.reconciler." + path.stem
    return [f"{path.name}: {m}" for m in imports(path, module) if m.startswith(IO_MODULES)]


def test_the_pure_steps_import_neither_kube_nor_storage() -> None:
    found = [line for part in PURE_STEPS for line in io_imports(OPERATOR / part)]
    assert found == [], found


def test_the_pure_step_rule_catches_one(tmp_path: Path) -> None:
    bad = tmp_path / "decide.py"
    bad.write_text("from tunefleet.storage.store import Store\n")
    assert io_imports(bad)


def test_no_bench_function_is_over_60_lines() -> None:
    found = over(bench_paths(), lines, MAX_FUNCTION_LINES)
    assert not found, "split at its seams (lines):\n" + "\n".join(found)
    # The rule can fail: the paths are the benchmarks, the longest of them over a lower limit.
    assert BENCH / "suite.py" in bench_paths()
    assert over(bench_paths(), lines, 40)


def test_no_bench_function_takes_more_than_6_parameters() -> None:
    found = over(bench_paths(), parameters, MAX_PARAMETERS)
    note = "give the parameters that travel together a value object:\n"
    assert not found, note + "\n".join(found)
    assert over(bench_paths(), parameters, 5)


# The benchmarks and the testbed build their Kubernetes objects as the tests do, with
# testbed/builders/: an object literal (an apiVersion, or a kind beside metadata) is written there
# alone. A kind without metadata is a reference's or a cache entry's (roleRef, subjects,
# spec.artifacts.caches), not an object.
TESTBED = ROOT / "testbed"


def _object_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Dict):
        keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
    elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict":
        keys = {k.arg for k in node.keywords}
    else:
        return False
    return "apiVersion" in keys or {"kind", "metadata"} <= keys


def object_literals(roots: list[Path], home: Path) -> list[str]:
    """Functions (nested ones and lambdas too) of the modules under `roots`, those under `home`
    aside, that return or build an object literal, as folder/path:line name."""
    out = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.is_relative_to(home):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
            for node in (n for n in ast.walk(tree) if _object_literal(n)):
                fn: ast.AST = node
                while fn in parents and not isinstance(fn, Function | ast.Lambda):
                    fn = parents[fn]
                if isinstance(fn, Function | ast.Lambda):
                    name = getattr(fn, "name", "lambda")
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {name}")
    return sorted(out)


def test_no_bench_or_testbed_function_builds_an_object_literal() -> None:
    found = object_literals([BENCH, TESTBED], TESTBED / "builders")
    note = "build it with testbed/builders/ (wrappers.py, objects.py):\n"
    assert not found, note + "\n".join(found)
    # The rule can fail: the home it leaves aside holds such literals.
    assert object_literals([TESTBED], ROOT / "nowhere")


def test_the_object_literal_rule_catches_one(tmp_path: Path) -> None:
    for folder in ("bench", "testbed/builders"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "bench" / "b.py").write_text(
        "def ns(name):\n    return {'apiVersion': 'v1', 'kind': 'Namespace'}\n"
        "def run():\n    def pod():\n        doc = {'kind': 'Pod', 'metadata': {}}\n"
        "        return doc\n    return pod\n"
        "f = lambda: dict(apiVersion='v1')\n"
        "def fine():\n    return make_pod('x').obj()\n"
    )
    (tmp_path / "testbed" / "t.py").write_text(
        "def spec():\n    return {'caches': [{'kind': 'vllm'}], 'roleRef': {'kind': 'Role'}}\n"
        "class R:\n    def secret(self):\n        return {'apiVersion': 'v1', 'kind': 'Secret'}\n"
    )
    (tmp_path / "testbed" / "builders" / "objects.py").write_text(
        "def manifest():\n    return {'apiVersion': 'v1'}\n"
    )
    roots = [tmp_path / "bench", tmp_path / "testbed"]
    found = [
        f.split(":")[0] + " " + f.split(" ")[1]
        for f in object_literals(roots, roots[1] / "builders")
    ]
    assert found == ["bench/b.py ns", "bench/b.py pod", "bench/b.py lambda", "testbed/t.py secret"]


# The two-cluster e2e tests take one fixture object (TwoClusters) and what is theirs alone, not
# each of the clusters, operators, namespaces and store settings it bundles.
TWO_CLUSTERS = TESTS / "e2e" / "test_two_clusters.py"
MAX_TEST_FIXTURES = 4


def crowded_tests(path: Path, limit: int) -> list[str]:
    """Test functions of `path` taking more than `limit` parameters (their fixtures)."""
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {parameters(node)}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, Function) and node.name.startswith("test")
        and parameters(node) > limit
    ]  # fmt: skip


def test_each_two_cluster_test_takes_at_most_4_fixtures() -> None:
    found = crowded_tests(TWO_CLUSTERS, MAX_TEST_FIXTURES)
    assert not found, "bundle them in the TwoClusters fixture:\n" + "\n".join(found)
    # The rule can fail: some test there takes more than one.
    assert crowded_tests(TWO_CLUSTERS, 1)


def test_no_two_operator_modules_share_a_basename() -> None:
    """A module's name says which module it is: no two in operator/tunefleet share a basename
    (`__init__.py` and `__main__.py` aside), so a path in a message, a traceback or a review
    names one file."""
    seen: dict[str, list[str]] = {}
    for path in sorted(OPERATOR.rglob("*.py")):
        if path.name.startswith("__") and path.name.endswith("__.py"):
            continue
        seen.setdefault(path.name, []).append(str(path.relative_to(OPERATOR)))
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, f"modules sharing a basename: {shared}"
