"""Token text is untrusted (spectrace/viz/tokens.py): whatever a trace's tokens hold, what reaches
the walkthrough, the renderer and the summary is printable, carries no control or bidi character,
and two different tokens never look the same; the SVG stays well-formed XML."""
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spectrace.core.trace_reader import TraceFile
from spectrace.viz import graph
from spectrace.viz.tokens import BIDI_CONTROLS, shown

FIXTURE = Path(__file__).with_name("data") / "walkthrough.jsonl"
# a terminal's set-title sequence, ANSI colour, Rich markup, XML specials, bidi override, NUL,
# form feed, DEL, a C1 control, an unpaired surrogate, a line separator, and our own escapes
EVIL = ["\x1b]0;pwned\x07", "\x1b[31mred\x1b[0m", "[bold]x[/bold]", "<a href='&'>", "\u202eevil", "\x00",
        "\x0c", "\x7f", "\x85", "\ud800", "a\u2028b", "\\x1b", "↵", "\n", "tab\there"]


def unshown(text: str, newline: str = "↵") -> str:
    """The inverse of `shown`: proof that it loses nothing."""
    out, i = [], 0
    while i < len(text):
        if text.startswith(newline, i):
            out.append("\n")
            i += len(newline)
        elif text[i] == "\\":
            kind = text[i + 1]
            if kind == "\\":
                out.append("\\")
                i += 2
            else:
                width = {"x": 2, "u": 4, "U": 8}[kind]
                out.append(chr(int(text[i + 2:i + 2 + width], 16)))
                i += 2 + width
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def safe(text: str) -> bool:
    return all(c.isprintable() and ord(c) not in BIDI_CONTROLS for c in text)


@given(st.text(st.characters(exclude_categories=())))  # all of Unicode, unpaired surrogates included
def test_shown_text_is_printable_and_loses_nothing(text):
    out = shown(text)
    assert safe(out)
    assert unshown(out) == text  # so two different tokens are never shown alike
    assert safe(shown(text, newline="↵ ").replace("↵ ", ""))  # any newline marker keeps it
    assert shown(text, newline="\n").count("\n") == text.count("\n")  # a real line break, only where one was


def test_shown_examples():
    assert shown("\x1b]0;pwned\x07") == "\\x1b]0;pwned\\x07"
    assert shown("\u202eevil") == "\\u202eevil" and shown("\ud800") == "\\ud800"
    assert shown("def f():\n\treturn") == "def f():↵\\x09return"
    assert shown("↵") == "\\u21b5" and shown("\\x1b") == "\\\\x1b"  # our own marks, escaped
    assert shown("héllo 世界 [bold]") == "héllo 世界 [bold]"  # printable text as it is


@pytest.fixture(scope="module")
def evil_trace(tmp_path_factory) -> Path:
    """The walkthrough fixture with every token's text replaced by one of EVIL (written with ASCII
    escapes, as a JSON file may carry an unpaired surrogate)."""
    path = tmp_path_factory.mktemp("evil") / "evil.jsonl"
    lines = []
    for line in FIXTURE.read_text().splitlines():
        rec = json.loads(line)
        rec["tokens"] = {i: EVIL[int(i) % len(EVIL)] for i in rec.get("tokens", {})}
        if rec["kind"] == "header":
            rec["config"]["prompts"] = ["".join(EVIL) for _ in rec["config"].get("prompts", [])]
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_render_labels_and_svg_stay_well_formed(evil_trace, tmp_path):
    trace = TraceFile(evil_trace)
    for i in range(3):
        rec = trace.step(i)
        dot = graph.step_graph(rec, trace.token_text).source
        assert safe(dot.replace("\n", "").replace("\t", ""))
        svg = graph.write_figure(graph.step_graph(rec, trace.token_text), tmp_path / f"step{i}.svg")
        root = ET.parse(svg).getroot()  # well-formed XML
        nodes = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "node"]
        assert len(nodes) == len(rec["verify"]["tokens"]) + 1  # every tree node and the bonus


@pytest.mark.parametrize("keys", [(), ("right", "right", "right"), ("right",) * 6 + ("down", "enter")])
def test_the_walkthrough_shows_tokens_escaped(evil_trace, keys):
    from spectrace.viz.tui.snapshot import snapshot

    screen = snapshot(evil_trace, keys, size=(140, 45))
    assert safe(screen.replace("\n", ""))
    assert re.search(r"\\x1b", screen)  # the escape is shown, not sent


def test_the_summary_escapes_what_a_run_generated():
    from types import SimpleNamespace

    from spectrace.viz.text import run_summary

    req = SimpleNamespace(req_pool_idx=0, prompt_ids=[1], output_ids=[2, 3], finish_reason="length")
    metrics = {"completion_tokens": 2, "wall_s": 1.0, "tokens_per_s": 2.0}
    out = run_summary(SimpleNamespace(requests=[req], texts=["ok\x1b]0;pwned\x07\nnext line"], metrics=metrics,
                                      trace_path=None), "none")
    assert "\x1b" not in out and "\x07" not in out and "ok\\x1b]0;pwned\\x07\nnext line" in out


def test_the_bytes_a_terminal_gets_carry_no_escape_from_a_token(evil_trace):
    """Every panel of every phase, written to a terminal by Rich (truecolor): the only escapes are
    Rich's own colour codes; no OSC (the set-title sequence), no BEL, no token's colour code."""
    import io

    from rich.console import Console

    from spectrace.viz.steptree import step_tree
    from spectrace.viz.tui import panels

    trace = TraceFile(evil_trace)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=140)
    for i in range(4):
        rec = trace.step(i)
        nodes = step_tree(rec, trace.token_text)
        for phase in panels.phases_of(rec, trace.header["config"]["algo"]):
            for selected in range(len(nodes)):
                console.print(panels.tree_panel(nodes, phase, selected))
                console.print(panels.inspector_panel(trace, rec, nodes, phase, selected))
            console.print(panels.stream_panel(trace, rec["request"], i, phase))
    written = out.getvalue()
    assert "\x1b]" not in written and "\x07" not in written and "\x1b[31mred" not in written
    assert "\\x1b]0;pwned\\x07" in written  # shown, escaped
    assert not set(re.sub(r"\x1b\[[0-9;]*m", "", written)) & {chr(c) for c in range(0x20) if c != 0x0a}
