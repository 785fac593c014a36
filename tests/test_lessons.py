"""Every lesson runs top to bottom, in the lessons' CI mode, its figures and traces in a temporary
folder, its "check yourself" cells the assertions, in one of its two forms: as a script from the
repository (`python lessons/NN_x.py`; in this one process, so torch and the models warm once), or
as a notebook (jupytext's conversion, executed by nbclient in a kernel started inside lessons/,
where Jupyter starts; one kernel per worker, its namespace cleared before each lesson), its figures
inline. The forms take turns (01 a script, 02 a notebook, ...): both forms are one code, which
test_a_lesson_is_one_code_in_both_forms proves, so each form's surroundings (working directory,
sys.path, matplotlib's backend, the kernel) are proven on half the lessons and every lesson's
code once. SPECTRACE_LESSONS_EVERY_FORM=1 runs every lesson in both forms (the planted-bug
harness runs every lesson as a script)."""
import ast
import builtins
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
ALL = sorted(LESSONS.glob("[0-9][0-9]_*.py"))
EVERY_FORM = os.environ.get("SPECTRACE_LESSONS_EVERY_FORM") == "1"
SCRIPTS = ALL if EVERY_FORM else ALL[0::2]
NOTEBOOKS = ALL if EVERY_FORM else ALL[1::2]


def bound_and_read(tree: ast.AST) -> tuple[set, set]:
    """The names a module binds anywhere (assignments, imports, definitions, arguments, loop and
    comprehension targets, `as` names) and the names it reads."""
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, read


@pytest.mark.parametrize("lesson", ALL, ids=lambda p: p.stem)
def test_a_lesson_is_one_code_in_both_forms(lesson):
    """The notebook is jupytext's reading of the script, cell for cell; and the lesson reads no name
    that only one form has (IPython's `display` or `get_ipython`, a script's `__file__`), no magic
    or shell line: what it reads it defines, imports, or takes from Python's builtins."""
    jupytext = pytest.importorskip("jupytext")
    code = "\n".join(c.source for c in jupytext.read(lesson).cells if c.cell_type == "code")
    assert not [line for line in code.splitlines() if line.lstrip().startswith(("%", "!"))]
    script = ast.parse(lesson.read_text(encoding="utf-8"))
    assert ast.dump(ast.parse(code)) == ast.dump(script), "the notebook's code is the script's"
    bound, read = bound_and_read(script)
    assert read - bound - set(dir(builtins)) == set()


@pytest.fixture
def lesson_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTRACE_LESSON_CI", "1")
    monkeypatch.setenv("SPECTRACE_LESSON_OUT", str(tmp_path))
    monkeypatch.delenv("SPECTRACE_UPDATE_LESSONS", raising=False)
    return tmp_path


@pytest.mark.parametrize("lesson", SCRIPTS, ids=lambda p: p.stem)
def test_lesson_runs_as_a_script(lesson, lesson_env, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.syspath_prepend(str(LESSONS))  # what `python lessons/NN_x.py` puts first on sys.path
    sys.modules.pop("_lib", None)  # re-read with this test's environment
    monkeypatch.chdir(LESSONS.parent)
    runpy.run_path(str(lesson), run_name="__main__")
    assert any(lesson_env.iterdir()), "a lesson leaves its traces and figures in SPECTRACE_LESSON_OUT"


def test_a_place_the_lessons_cannot_write_is_one_line_and_exit_2():
    lesson = ALL[0]
    done = subprocess.run([sys.executable, str(lesson)], capture_output=True, text=True, cwd=LESSONS.parent,
                          env={**os.environ, "SPECTRACE_LESSON_OUT": "/proc/forbidden/lessons", "MPLBACKEND": "Agg"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "lessons: cannot write to SPECTRACE_LESSON_OUT=/proc/forbidden/lessons: No such file or directory"]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One Jupyter kernel for this worker's notebooks, started inside lessons/ (as Jupyter starts
    there), in the lessons' CI mode; each notebook begins by clearing its namespace."""
    client = pytest.importorskip("jupyter_client.manager")
    env = {**os.environ, "SPECTRACE_LESSON_CI": "1", "SPECTRACE_LESSON_OUT": str(tmp_path_factory.mktemp("notebooks"))}
    for name in ("SPECTRACE_UPDATE_LESSONS", "MPLBACKEND"):
        env.pop(name, None)
    km, kc = client.start_new_kernel(kernel_name="python3", cwd=str(LESSONS), env=env)
    yield km
    kc.stop_channels()
    km.shutdown_kernel(now=True)


@pytest.mark.parametrize("lesson", NOTEBOOKS, ids=lambda p: p.stem)
def test_lesson_runs_as_a_notebook(lesson, kernel):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    from nbformat.v4 import new_code_cell

    notebook = jupytext.read(lesson)
    notebook.cells.insert(0, new_code_cell("%reset -f\nimport sys\nsys.modules.pop('_lib', None)"))
    nbclient.NotebookClient(notebook, km=kernel, timeout=300).execute()
    figures = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
               if {"image/png", "image/svg+xml"} & set(o.get("data", {}))]
    assert len(figures) >= (lesson.read_text().count("show(") > 0), "a lesson's figures show inline"
