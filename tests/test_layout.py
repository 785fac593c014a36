"""The code's shape, checked from its syntax: short phase methods in the engine, no long function
in core, imports that point down, one list of the algorithms, no comment pointing outside the
repository. `pytest tests/test_layout.py -s` prints the longest functions."""
import ast
from pathlib import Path

import pytest

from spectrace.algos import ALGOS

PACKAGE = Path(__file__).resolve().parents[1] / "spectrace"
ENGINE_LIMIT, CORE_LIMIT = 45, 70  # lines from `def` to the function's end, docstring included


def modules(under: Path = PACKAGE):
    for path in sorted(under.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


def test_engine_phases_are_short_and_core_has_no_long_function(capsys):
    (_, engine), = [m for m in modules() if m[0] == PACKAGE / "core" / "engine.py"]
    longest = max(functions(engine), key=lambda f: f[1])
    assert longest[1] <= ENGINE_LIMIT, f"core/engine.py: {longest[0]} is {longest[1]} lines"
    core = [(path.relative_to(PACKAGE), name, n) for path, tree in modules(PACKAGE / "core")
            for name, n in functions(tree)]
    core.sort(key=lambda f: -f[2])
    with capsys.disabled():
        print(f"\nlongest in core/engine.py: {longest[0]} ({longest[1]} lines); longest in core: "
              + ", ".join(f"{p}:{name} ({n})" for p, name, n in core[:5]))
    assert core[0][2] <= CORE_LIMIT, f"{core[0][0]}: {core[0][1]} is {core[0][2]} lines"


def imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer, above", [
    ("core", ("spectrace.zoo", "spectrace.cli", "spectrace.viz", "spectrace.run")),
    ("viz", ("spectrace.zoo", "spectrace.cli", "spectrace.run", "torch")),
    ("compat", ("spectrace.zoo", "spectrace.cli", "spectrace.viz", "spectrace.run")),
])
def test_imports_point_down(layer, above):
    for path, tree in modules(PACKAGE / layer):
        bad = sorted(m for m in imported(tree) if m.startswith(above))
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_one_module_lists_the_algorithms():
    """A literal naming most algorithms (a copy of the list) appears in spectrace/algos.py only.
    Tables keyed by checkpoint format (run.HEAD_LOADERS, the training kinds) share some names with
    algorithms but list formats: NEXTN and MTP share one, STANDALONE's is a plain LM."""
    names = set(ALGOS)
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                elts = node.keys if isinstance(node, ast.Dict) else node.elts
                found = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
                assert len(found) < 0.8 * len(names) or path.name == "algos.py", \
                    f"{path.relative_to(PACKAGE)}:{node.lineno} lists {sorted(found)}"


def test_comments_point_inside_the_repository():
    """Upstream code is cited by project, file and function, never by a document that is not here."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8").lower()
        for pointer in ("the seeds", "the seed ", "reference/"):
            assert pointer not in text, f"{path.relative_to(PACKAGE)} mentions {pointer!r}"
