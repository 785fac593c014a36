"""Every lesson runs top to bottom in this one process (torch and the models warm once), from
the repository or from inside lessons/, in the lessons' CI mode, its figures and traces in a
temporary folder; its "check yourself" cells are the assertions."""
import runpy
import sys
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"


@pytest.mark.parametrize("lesson", sorted(LESSONS.glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_lesson_runs_and_its_checks_hold(lesson, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTRACE_LESSON_CI", "1")
    monkeypatch.setenv("SPECTRACE_LESSON_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("SPECTRACE_UPDATE_LESSONS", raising=False)
    monkeypatch.syspath_prepend(str(LESSONS))
    sys.modules.pop("_lib", None)  # re-read with this test's environment
    # where a reader starts one: the repository (python lessons/NN_x.py) for even lessons, inside
    # lessons/ (where Jupyter starts) for odd ones
    monkeypatch.chdir(LESSONS if int(lesson.stem[:2]) % 2 else LESSONS.parent)
    runpy.run_path(str(lesson), run_name="__main__")
    assert any(tmp_path.iterdir()), "a lesson leaves its traces and figures in SPECTRACE_LESSON_OUT"
