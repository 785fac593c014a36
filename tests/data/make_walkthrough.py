"""Regenerate walkthrough.jsonl, the committed trace the TUI and Graphviz tests read:

    python tests/data/make_walkthrough.py && SPECTRACE_UPDATE_SNAPSHOTS=1 pytest tests/test_tui.py

An EAGLE run on the embedded models (tree 5, 4, 8; two requests; 24 tokens), with this machine's
paths in the header made relative.
"""
import json
from pathlib import Path

from spectrace.cli import main

OUT = Path(__file__).with_name("walkthrough.jsonl")
ROOT = str(Path(__file__).resolve().parents[2]) + "/"

assert main(["run", "--algo", "eagle", "--topk", "4", "--batch", "2", "--max-new-tokens", "24", "--no-tui",
             "--trace", str(OUT)]) == 0
lines = OUT.read_text(encoding="utf-8").splitlines(keepends=True)
header = json.loads(lines[0])
for key in ("target_model", "draft_model", "trace"):
    header["config"][key] = header["config"][key].replace(ROOT, "")
for m in header["models"].values():
    m["path"] = m["path"].replace(ROOT, "")
lines[0] = json.dumps(header, ensure_ascii=False) + "\n"
OUT.write_text("".join(lines), encoding="utf-8")
