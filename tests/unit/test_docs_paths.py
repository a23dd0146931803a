"""The files the operator's words name exist, read from the source (no imports run):

- a docstring or comment of operator/tunefleet that names a module file (`foo.py`,
  `watched/kinds.py`) names one that is in the repository: next to it, in operator/tunefleet,
  at the repository's root, in tuner_job/, or under some folder of operator/tunefleet. A file
  moved or removed leaves such words behind (four did: `watch.py`, `gather.py`), and the next
  reader looks for it in vain;
- docs/operator.md's map follows the tree: every `x/y.py` path it names exists, every folder
  and module of operator/tunefleet has its row, and each module is named in its folder's.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "tunefleet"
MAP = ROOT / "docs" / "operator.md"
# Where the repository's Python lives (tests/unit/test_layering.py's PACKAGES, and examples).
TREES = ("operator", "tuner_job", "bench", "testbed", "tests", "hack", "scripts", "examples")
# Files of other projects, named by the path they have there: the hook is installed as
# Python's sitecustomize.py, and reads what vLLM's modules log.
FOREIGN = ("sitecustomize.py", "vllm/")

FILE = re.compile(r"(?<![\w./-])(?:[\w.-]+/)*[\w-]+\.py\b")


def words(source: str) -> Iterator[tuple[int, str]]:
    """Each docstring and comment of a module's source, with the line it starts on."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        if isinstance(node, documented) and node.body and isinstance(node.body[0], ast.Expr):
            doc = node.body[0].value
            if isinstance(doc, ast.Constant) and isinstance(doc.value, str):
                yield doc.lineno, doc.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def repository_files(root: Path) -> set[str]:
    """Every Python file of the repository, by its path from the root."""
    return {
        p.relative_to(root).as_posix()
        for tree in TREES
        if (root / tree).is_dir()
        for p in (root / tree).rglob("*.py")
    }


def resolves(name: str, here: Path, root: Path, files: set[str]) -> bool:
    """`name` (as the words spell it) is a file next to `here`, in operator/tunefleet, at the
    root or in tuner_job/, or, those failing, a file of the repository whose path ends so."""
    if name.startswith(FOREIGN):
        return True
    for base in (here, root / "operator" / "tunefleet", root, root / "tuner_job"):
        if (base / name).is_file():
            return True
    return any(f == name or f.endswith("/" + name) for f in files)


def missing_files(root: Path) -> list[str]:
    files = repository_files(root)
    bad = []
    for path in sorted((root / "operator" / "tunefleet").rglob("*.py")):
        for line, text in words(path.read_text(encoding="utf-8")):
            for name in FILE.findall(text):
                if not resolves(name, path.parent, root, files):
                    bad.append(f"{path.relative_to(root)}:{line} names {name}")
    return bad


def test_the_operators_docstrings_and_comments_name_files_that_exist() -> None:
    bad = missing_files(ROOT)
    assert not bad, "name the file as it is now:\n" + "\n".join(bad)


def test_the_file_rule_catches_a_removed_file(tmp_path: Path) -> None:
    pkg = tmp_path / "operator" / "tunefleet"
    (pkg / "watched").mkdir(parents=True)
    (pkg / "watched" / "kinds.py").write_text('"""The kinds."""\n')
    (pkg / "naming.py").write_text(
        '"""Names; the watch (watch.py) selects by them."""\n\n'
        "# watched/kinds.py, kinds.py and sitecustomize.py are fine\n"
        "X = 1  # but gather.py is gone\n"
    )
    assert missing_files(tmp_path) == [
        "operator/tunefleet/naming.py:1 names watch.py",
        "operator/tunefleet/naming.py:4 names gather.py",
    ]


# --- docs/operator.md's map ---------------------------------------------------------------------

ROW = re.compile(r"^\| `([^`]+)` \|(.*)\|\s*$", re.M)


def map_rows(text: str) -> dict[str, str]:
    """The map's rows: the folder or module a row is of (`capture/`, `naming.py`), and what it
    says."""
    return {key: what for key, what in ROW.findall(text)}


def test_every_path_the_operator_doc_names_exists() -> None:
    text = MAP.read_text(encoding="utf-8")
    bad = sorted(
        {
            name
            for name in FILE.findall(text)
            if "/" in name and not (OPERATOR / name).is_file() and not (ROOT / name).is_file()
        }
    )
    assert not bad, f"{MAP.relative_to(ROOT)} names files that are not there: {bad}"


def unmapped(package: Path, rows: dict[str, str]) -> list[str]:
    """Folders and modules of `package` that the map has no word for: a folder wants its row,
    a module its row or its name in its folder's row (its package's __init__.py and
    __main__.py aside)."""
    bad = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if len(rel.parts) == 1:
            if rel.name not in ("__init__.py",) and rel.name not in rows:
                bad.append(f"{rel.as_posix()}: no row")
            continue
        folder = rel.parent.as_posix() + "/"
        if folder not in rows:
            bad.append(f"{folder}: no row")
            continue
        if rel.name in ("__init__.py", "__main__.py") or rel.as_posix() in rows:
            continue
        if f"`{rel.name}`" not in rows[folder]:
            bad.append(f"{rel.as_posix()}: not named in the row of {folder}")
    return sorted(set(bad))


def test_the_operator_docs_map_has_every_folder_and_module() -> None:
    bad = unmapped(OPERATOR, map_rows(MAP.read_text(encoding="utf-8")))
    assert not bad, "docs/operator.md's map does not follow the tree:\n" + "\n".join(bad)


def test_the_map_rule_catches_a_module_left_out(tmp_path: Path) -> None:
    (tmp_path / "serving").mkdir()
    for name in ("serving/__init__.py", "serving/delivery.py", "serving/served.py", "kube.py"):
        (tmp_path / name).write_text("")
    rows = map_rows("| `serving/` | `delivery.py`: delivered artifacts |\n")
    assert unmapped(tmp_path, rows) == [
        "kube.py: no row",
        "serving/served.py: not named in the row of serving/",
    ]
