"""Plant one-line bugs in a copy of the repository, one at a time, and show which lessons and
tests catch each: a course whose checks pass whatever the engine does teaches nothing.

    python tools/planted_bugs.py                  every bug against the lessons and the core tests
    python tools/planted_bugs.py --bug NAME ... [--tests PATH ...]

Each bug is a line of the explicit engine as someone might have written it wrongly. For each,
the repository is copied (without .git and the virtual environment), the line replaced, and
pytest run in the copy over the lessons (as scripts) and the core tests (TESTS), with the copy
first on the import path. Prints a row per bug with what failed, and exits 1 if any bug passed
everything. Run it before a release (about 1.5 minutes a bug on two cores);
tests/test_planted_bugs.py checks every bug still applies, and runs one end to end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_lessons.py::test_lesson_runs_as_a_script", "tests/test_tree.py", "tests/test_acceptance.py",
         "tests/test_engine.py", "tests/test_kv.py", "tests/test_sampling.py", "tests/test_eagle.py"]


@dataclass(frozen=True)
class Bug:
    name: str
    path: str
    line: str  # the correct line, exactly once in the file
    planted: str  # what replaces it
    what: str


BUGS = [
    Bug("eagle2_ranks_by_q", "spectrace/core/tree.py",
        "topk_cs_p, topk_cs_index = torch.topk(expand_scores.flatten(1), topk, dim=-1)",
        "topk_cs_p, topk_cs_index = torch.topk(topk_p.reshape(bs, -1), topk, dim=-1)",
        "EAGLE-2 keeps the K children with the best own q, not the best path score"),
    Bug("accept_len_without_bonus", "spectrace/core/acceptance/__init__.py",
        "return len(self.correct_drafts) + 1",
        "return len(self.correct_drafts)",
        "accept_len leaves out the bonus"),
    Bug("kv_keeps_one_rejected", "spectrace/core/kv.py",
        "after = start + len(keep)",
        "after = start + len(keep) + 1",
        "COMMIT (SGLang) / rollback (vLLM) keeps one slot too many"),
    Bug("rejection_p_q_swapped", "spectrace/core/acceptance/rejection.py",
        "ok = coin * q < p",
        "ok = coin * p < q",
        "rejection sampling accepts with min(1, q/p)"),
    Bug("bonus_from_p_after_reject", "spectrace/core/acceptance/rejection.py",
        "dist = torch.relu(target_probs[row] - torch.nan_to_num(draft_probs[row]))",
        "dist = target_probs[row]",
        "after a rejection the bonus is drawn from p, not from the residual relu(p - q)"),
    Bug("parent_off_by_one", "spectrace/core/tree.py",
        "            return parent_position + 1",
        "            return parent_position",
        "build_tree links each node to the node before its parent"),
    Bug("greedy_reads_own_row", "spectrace/core/acceptance/greedy.py",
        "ok = candidates[cur] == target_predict[parent]",
        "ok = candidates[cur] == target_predict[cur]",
        "greedy compares a draft with the target's argmax after itself, not after its parent"),
    Bug("target_only_prob_acc_kept", "spectrace/core/acceptance/target_only.py",
        "row, prob_acc, coin = cur, F32(0), F32(randoms.coins[cur])",
        "row, prob_acc, coin = cur, prob_acc, F32(randoms.coins[cur])",
        "target_only carries the siblings' accumulated p into the next level"),
    Bug("per_position_counts_the_last", "spectrace/core/metrics.py",
        "            self.accepted_per_pos[i] += 1",
        "            self.accepted_per_pos[n_correct - 1] += 1",
        "vLLM's per-position counter credits every accepted draft to the last position (its sum stays right)"),
    Bug("fast_greedy_walk_one_level_short", "spectrace/kernels/acceptance/greedy.py",
        "    tl.store(accept_token_num + b, num_accepted)",
        "    tl.store(accept_token_num + b, tl.maximum(num_accepted - 1, 0))",
        "the fast engine's greedy walk stops one level short of the path it found"),
]


def plant(root: Path, bug: Bug) -> None:
    """Replace the bug's line in `root`'s copy of its file (the line must be there once)."""
    path = root / bug.path
    text = path.read_text(encoding="utf-8")
    if text.count(bug.line) != 1:
        raise SystemExit(f"{bug.name}: the line is in {bug.path} {text.count(bug.line)} times, not once")
    path.write_text(text.replace(bug.line, bug.planted), encoding="utf-8")


def copy_repository(dest: Path) -> Path:
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", "runs", "_out", ".hypothesis", "*.egg-info")
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def failures(root: Path, tests: list[str]) -> list[str]:
    """The test ids that fail (or error) in `root`, its spectrace first on the import path."""
    report = root / "report.xml"
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1",
           "SPECTRACE_LESSONS_EVERY_FORM": "1"}  # every lesson as a script, not the suite's half
    workers = ["-n", "2" if len(tests) > 1 else "0"]
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, "--junitxml",
                    str(report), *tests], cwd=root, env=env, capture_output=True, text=True)
    failed = []
    for case in ET.parse(report).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname').split('.')[-1]}::{case.get('name')}")
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bug", nargs="+", choices=[b.name for b in BUGS], help="these bugs only")
    ap.add_argument("--tests", nargs="+", default=TESTS, help="pytest targets, relative to the repository")
    args = ap.parse_args(argv)
    uncaught = 0
    for bug in [b for b in BUGS if not args.bug or b.name in args.bug]:
        with tempfile.TemporaryDirectory() as tmp:
            root = copy_repository(Path(tmp) / "spectrace")
            plant(root, bug)
            failed = failures(root, args.tests)
        uncaught += not failed
        print(f"{bug.name} ({bug.what}): " + (f"caught by {len(failed)}: " + ", ".join(failed) if failed
                                                else "NOT CAUGHT"), flush=True)
    return 1 if uncaught else 0


if __name__ == "__main__":
    sys.exit(main())
