"""tools/planted_bugs.py stays usable: every bug's line is still in its file exactly once (so a
refactor cannot silently retire a bug), and one bug run end to end is caught."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("planted_bugs", ROOT / "tools" / "planted_bugs.py")
planted_bugs = importlib.util.module_from_spec(spec)
sys.modules["planted_bugs"] = planted_bugs  # dataclasses look their module up there
spec.loader.exec_module(planted_bugs)


@pytest.mark.parametrize("bug", planted_bugs.BUGS, ids=lambda b: b.name)
def test_every_planted_bug_still_applies(bug):
    assert (ROOT / bug.path).read_text(encoding="utf-8").count(bug.line) == 1, bug.name


def test_a_planted_bug_is_caught_end_to_end(capsys):
    """The harness copies the repository, plants the bug and runs pytest in the copy: a tree
    builder that links each node to the node before its parent fails the tree tests."""
    assert planted_bugs.main(["--bug", "parent_off_by_one", "--tests", "tests/test_tree.py::test_draft_tree_of_topk_1_is_a_chain"]) == 0
    out = capsys.readouterr().out
    assert "parent_off_by_one" in out and "caught by" in out and "test_tree::" in out
