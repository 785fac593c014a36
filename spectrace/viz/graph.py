"""Graphviz figures of a step's draft tree, for instructors and lessons.

Nodes carry the token, the draft's q and the target's p, filled by fate (the TUI's colours);
the accepted path is drawn bold and the bonus token hangs under its last node with a dashed edge.
DOT comes from the `graphviz` package; images come from the system `dot` when there is one, else
from PyPI's `graphviz-pure` (a self-contained port of Graphviz's `dot`).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import graphviz

from spectrace.errors import SpectraceError
from spectrace.viz.steptree import ViewNode, step_tree
from spectrace.viz.tokens import LABEL_LIMIT, shown

# fate -> (fill, border): the TUI uses the borders as text colours
FATE_COLORS = {
    "root": ("#e0e0e0", "#616161"),
    "correct": ("#c8e6c9", "#2e7d32"),
    "rejected": ("#ffcdd2", "#c62828"),
    "unreached": ("#f5f5f5", "#9e9e9e"),
    "bonus": ("#bbdefb", "#1565c0"),
}
RENDERERS = ("dot", "graphviz-pure")


def _label(n: ViewNode) -> str:
    token = shown(n.text, limit=LABEL_LIMIT).replace("\\", "\\\\")  # DOT reads backslashes as escapes
    lines = [f'"{token}"', f"#{n.index}  id {n.token}"]
    if n.q is not None:
        lines.append(f"q {n.q:.3f}  p {n.p:.3f}" if n.p is not None else f"q {n.q:.3f}")
    elif n.fate == "bonus":
        lines.append("bonus" + (f"  p {n.p:.3f}" if n.p is not None else ""))
    return "\\n".join(lines)


def step_graph(rec: dict, token_text) -> graphviz.Digraph:
    """The DOT graph of one step record: one node per tree node plus the bonus."""
    nodes = step_tree(rec, token_text)
    accepted = set(rec["accept"]["accept_nodes"])
    g = graphviz.Digraph(name=f"step{rec['step']}_request{rec['request']}")
    g.attr(rankdir="TB", fontname="Helvetica", labelloc="t",
           label=f"step {rec['step']}, request {rec['request']}: accept_len {rec['accept_len']} "
                 f"({len(rec['correct_drafts'])} correct + bonus)")
    g.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10")
    for n in nodes:
        fill, border = FATE_COLORS[n.fate]
        style = "rounded,filled,dashed" if n.fate == "unreached" else "rounded,filled"
        g.node(f"n{n.index}", _label(n), fillcolor=fill, color=border, style=style,
               penwidth="2" if n.index in accepted or n.fate == "bonus" else "1")
    for n in nodes:
        if n.parent is None:
            continue
        if n.fate == "bonus":
            g.edge(f"n{n.parent}", f"n{n.index}", color=FATE_COLORS["bonus"][1], style="dashed", penwidth="2")
        elif n.index in accepted:
            g.edge(f"n{n.parent}", f"n{n.index}", color=FATE_COLORS["correct"][1], penwidth="2.5")
        else:
            g.edge(f"n{n.parent}", f"n{n.index}", color="#9e9e9e")
    return g


def renderer() -> str:
    """Path of a Graphviz `dot` binary, or a one-line error saying how to get one. Looked up as
    Python finds its own tools: first in this environment's scripts directory (where pip put
    graphviz-pure; a venv called by path, pipx and `uv tool` do not put it on PATH), then on PATH."""
    scripts = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    for name in RENDERERS:
        for folder in scripts:
            found = shutil.which(name, path=folder)
            if found:
                return found
    for name in RENDERERS:
        found = shutil.which(name)
        if found:
            return found
    raise SpectraceError("no Graphviz renderer found: install Graphviz (`apt install graphviz`, "
                         "`brew install graphviz`) or `pip install graphviz-pure`; or write -o FILE.dot")


def write_figure(g: graphviz.Digraph, out: str | Path) -> Path:
    """Write the graph as .dot source, or render it to .svg / .png."""
    out = Path(out)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("dot", "svg", "png"):
        raise SpectraceError(f"-o {out}: the figure must end in .svg, .png or .dot")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "dot":
            out.write_text(g.source, encoding="utf-8")
            return out
        with open(out, "ab"):  # writable? Graphviz's own message would be its first warning, not this
            pass
    except OSError as e:
        raise SpectraceError(f"cannot write {out}: {e.strerror}") from None
    dpi = ["-Gdpi=150"] if fmt == "png" else []  # a figure sharp enough for slides
    proc = subprocess.run([renderer(), f"-T{fmt}", *dpi, "-o", str(out)], input=g.source.encode("utf-8"),
                          capture_output=True)
    if proc.returncode != 0:
        if out.exists() and out.stat().st_size == 0:  # leave no empty figure behind
            out.unlink()
        msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SpectraceError(f"Graphviz failed to render {out}: {msg[0] if msg else 'exit code ' + str(proc.returncode)}")
    return out
