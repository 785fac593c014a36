"""Every lesson runs top to bottom two ways, in the lessons' CI mode, its figures and traces in a
temporary folder, its "check yourself" cells the assertions: as a script from the repository
(`python lessons/NN_x.py`; in this one process, so torch and the models warm once), and as a
notebook (jupytext's conversion, executed by nbclient in a kernel started inside lessons/, where
Jupyter starts; one kernel per worker, its namespace cleared before each lesson), its figures
inline."""
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
ALL = sorted(LESSONS.glob("[0-9][0-9]_*.py"))


@pytest.fixture
def lesson_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTRACE_LESSON_CI", "1")
    monkeypatch.setenv("SPECTRACE_LESSON_OUT", str(tmp_path))
    monkeypatch.delenv("SPECTRACE_UPDATE_LESSONS", raising=False)
    return tmp_path


@pytest.mark.parametrize("lesson", ALL, ids=lambda p: p.stem)
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


@pytest.mark.parametrize("lesson", ALL, ids=lambda p: p.stem)
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
