"""Graphviz figures: the DOT has one node per tree node (plus the bonus) and one edge per
parent link, the accepted path is marked, and rendering gives a valid SVG."""
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from spectrace.cli import main
from spectrace.core.trace_reader import TraceFile
from spectrace.viz import graph

TRACE = Path(__file__).with_name("data") / "walkthrough.jsonl"


def _dot(i):
    trace = TraceFile(TRACE)
    rec = trace.step(i)
    return rec, graph.step_graph(rec, trace.token_text).source


@pytest.mark.parametrize("i", range(6))
def test_dot_has_the_trees_nodes_and_edges_and_marks_the_accepted_path(i):
    rec, dot = _dot(i)
    n = len(rec["verify"]["tokens"])  # root + draft nodes
    nodes = re.findall(r"^\s*n(\d+) \[", dot, re.M)
    edges = re.findall(r"^\s*n(\d+) -> n(\d+)(.*)$", dot, re.M)
    assert sorted(map(int, nodes)) == list(range(n + 1))  # and the bonus, node n
    assert len(edges) == n  # every node but the root has one parent
    parents = rec["draft"]["parents"]
    draft_edges = {(int(a), int(b)) for a, b, _ in edges if int(b) < n}
    assert draft_edges == {(p, j + 1) for j, p in enumerate(parents)}
    accepted = rec["accept"]["accept_nodes"]
    bold = {(int(a), int(b)) for a, b, attrs in edges if "penwidth=2.5" in attrs}
    assert bold == set(zip(accepted, accepted[1:]))  # the accepted path, root to last correct node
    bonus = [(int(a), int(b)) for a, b, attrs in edges if "dashed" in attrs]
    assert bonus == [(accepted[-1], n)]


def test_render_writes_a_valid_svg_and_png(tmp_path, capsys):
    rec = TraceFile(TRACE).step(2)
    out = tmp_path / "tree.svg"
    assert main(["render", str(TRACE), "--step", str(rec["step"]), "--request", str(rec["request"]), "-o",
                 str(out)]) == 0
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    texts = "".join(root.itertext())
    assert f"accept_len {rec['accept_len']}" in texts
    png = tmp_path / "tree.png"
    assert main(["render", str(TRACE), "--step", str(rec["step"]), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_render_all_writes_one_figure_per_step(tmp_path):
    trace = TraceFile(TRACE)
    assert main(["render", str(TRACE), "--all", "--request", "1", "-o", str(tmp_path / "t.dot")]) == 0
    want = {f"t-step{m.step}-req1.dot" for m in trace.index if m.request == 1}
    assert {f.name for f in tmp_path.iterdir()} == want


@pytest.mark.parametrize("args, message", [
    (["--step", "9999"], "no step 9999"),
    (["--step", "0", "-o", "x.pdf"], "must end in .svg, .png or .dot"),
    ([], "needs --step"),
])
def test_render_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    if "-o" not in args:
        args = [*args, "-o", str(tmp_path / "x.svg")]
    assert main(["render", str(TRACE), *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_without_a_renderer_the_error_says_how_to_get_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(graph.shutil, "which", lambda name, path=None: None)  # nowhere: scripts dir nor PATH
    assert main(["render", str(TRACE), "--step", "0", "-o", str(tmp_path / "x.svg")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "graphviz-pure" in err
    assert main(["render", str(TRACE), "--step", "0", "-o", str(tmp_path / "x.dot")]) == 0  # DOT needs none


@pytest.mark.parametrize("out", ["/proc/spectrace-t.svg", "DIR/t.png"])
def test_render_where_it_cannot_write_says_so_not_what_graphviz_warns(tmp_path, capsys, out):
    """The write is tried before Graphviz runs: its first stderr line was a font warning."""
    if out.startswith("DIR"):  # a directory where the file should be
        (tmp_path / "t.png").mkdir()
        out = str(tmp_path / "t.png")
    assert main(["render", str(TRACE), "--step", "0", "-o", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spectrace: error: cannot write {out}: ") and len(err.strip().splitlines()) == 1
