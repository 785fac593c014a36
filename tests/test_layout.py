"""The code's shape, checked from its syntax: short phase methods in the engines, no long function
in core or fast, no long file, imports that point down, backends installed by a call (not by an
import), one list of the algorithms, no comment pointing outside the repository.
`pytest tests/test_layout.py -s` prints the longest functions."""
import ast
import re
from pathlib import Path

import pytest

from spectrace.algos import ALGOS

PACKAGE = Path(__file__).resolve().parents[1] / "spectrace"
ENGINE_LIMIT, CORE_LIMIT = 45, 70  # lines from `def` to the function's end, docstring included
FILE_LIMIT = 405  # lines of any module: the longest today plus about 3%
# each of the fast engine's two classes (the host loop, the device runner): today's size plus 10%
FAST_CLASS_LINES, FAST_CLASS_ATTRIBUTES = 148, 16
LINE_WIDTH = 100  # characters of a line in core/ and fast/


def modules(under: Path = PACKAGE):
    for path in sorted(under.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def functions(tree: ast.AST):
    """(name, lines) of every function but Triton kernels (@triton.jit: one GPU program, read as one)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                not any("jit" in ast.unparse(d) for d in node.decorator_list):
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


APP = ("spectrace.cli", "spectrace.run", "spectrace.engines", "spectrace.measure",
       "spectrace.rejudge", "spectrace.loading")


@pytest.mark.parametrize("layer, above", [
    ("core", ("spectrace.zoo", "spectrace.viz", "spectrace.kernels", "spectrace.fast", "spectrace.compat", *APP)),
    ("viz", ("spectrace.zoo", "torch", *APP)),
    ("compat", ("spectrace.zoo", "spectrace.viz", "spectrace.fast", *APP)),
    ("kernels", ("spectrace.zoo", "spectrace.viz", "spectrace.fast", "spectrace.compat", *APP)),
    ("fast", ("spectrace.zoo", "spectrace.viz", "spectrace.compat", *APP)),
])
def test_imports_point_down(layer, above):
    for path, tree in modules(PACKAGE / layer):
        bad = sorted(m for m in imported(tree) if m.startswith(above))
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_the_fast_engine_has_cores_shape(capsys):
    """fast/ mirrors core/: no function over ENGINE_LIMIT lines anywhere in it, and each of the
    engine's two classes, FastEngine (the host loop) and StepRunner (the device half), a class a
    reader holds in mind (its lines, the attributes it sets)."""
    fast = [(path.relative_to(PACKAGE), name, n) for path, tree in modules(PACKAGE / "fast")
            for name, n in functions(tree)]
    longest = max(fast, key=lambda f: f[2])
    assert longest[2] <= ENGINE_LIMIT, f"{longest[0]}: {longest[1]} is {longest[2]} lines"
    for file, name in (("engine.py", "FastEngine"), ("runner.py", "StepRunner")):
        (_, tree), = [m for m in modules(PACKAGE / "fast") if m[0].name == file]
        cls, = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name]
        attributes = {t.attr for t in ast.walk(cls) if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)
                      and isinstance(t.value, ast.Name) and t.value.id == "self"}
        with capsys.disabled():
            print(f"\n{name}: {cls.end_lineno - cls.lineno + 1} lines, {len(attributes)} attributes")
        assert cls.end_lineno - cls.lineno + 1 <= FAST_CLASS_LINES, name
        assert len(attributes) <= FAST_CLASS_ATTRIBUTES, (name, sorted(attributes))
    with capsys.disabled():
        print(f"longest in fast: {longest[0]}:{longest[1]} ({longest[2]})")


def test_core_and_fast_fit_lines_of_100_characters():
    for layer in ("core", "fast"):
        for path in (PACKAGE / layer).rglob("*.py"):
            widest = max(map(len, path.read_text(encoding="utf-8").splitlines()), default=0)
            assert widest <= LINE_WIDTH, f"{path.relative_to(PACKAGE)} has a line of {widest} characters"


def test_no_module_is_long():
    for path in PACKAGE.rglob("*.py"):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= FILE_LIMIT, f"{path.relative_to(PACKAGE)} is {lines} lines"


def test_backends_are_installed_by_a_call():
    """No module writes into another's table when imported: the Triton twins are registered by
    kernels/backend.py's install(), which the engines call when a run asks for them."""
    for path, tree in modules():
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            assert not any(isinstance(t, (ast.Subscript, ast.Attribute)) for t in targets), \
                f"{path.relative_to(PACKAGE)}:{node.lineno} registers into a table at import"


def test_one_module_lists_the_algorithms():
    """A literal naming most algorithms (a copy of the list) appears in spectrace/algos.py only.
    Tables keyed by checkpoint format (formats.FORMATS, the training kinds) share some names with
    algorithms but list formats: NEXTN and MTP share one, STANDALONE's is a plain LM."""
    names = set(ALGOS)
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                elts = node.keys if isinstance(node, ast.Dict) else node.elts
                found = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
                assert len(found) < 0.8 * len(names) or path.name == "algos.py", \
                    f"{path.relative_to(PACKAGE)}:{node.lineno} lists {sorted(found)}"


def test_nothing_speaks_of_how_it_was_made():
    """Code, tests, lessons and docs say what a thing is, not which issue, seed or old error it came
    from (a seed is cited by its title and section, as the lessons cite them)."""
    pattern = re.compile("|".join(["[Tt]he seed.s ", "[Tt]he seed (says|is)", "[Tt]he " + "issue",
                                   r"\(was a [A-Za-z]+" + "Error"]))
    root = PACKAGE.parent
    for folder in ("spectrace", "tests", "lessons", "docs"):
        for path in (root / folder).rglob("*"):
            if path.suffix in (".py", ".md") and "_out" not in path.parts:
                found = pattern.search(path.read_text(encoding="utf-8"))
                assert found is None, f"{path.relative_to(root)}: {found.group(0)!r}"


def test_comments_point_inside_the_repository():
    """Upstream code is cited by project, file and function, never by a document that is not here."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8").lower()
        for pointer in ("the seeds", "the seed ", "the seed's", "reference/"):
            assert pointer not in text, f"{path.relative_to(PACKAGE)} mentions {pointer!r}"
