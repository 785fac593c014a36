"""The walkthrough: flows with Textual's Pilot, text snapshots at fixed sizes, bad traces.

The trace under test is tests/data/walkthrough.jsonl, a committed EAGLE run (tree 5, 4, 8; two
requests; sglang commit style) so that snapshots do not move when models are retrained. Refresh
it and the snapshots with `SPECTRACE_UPDATE_SNAPSHOTS=1 pytest tests/test_tui.py` after a change
of the trace format or of the panels, and read the diff.
"""
import asyncio
import io
import json
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from spectrace.cli import main
from spectrace.core.trace_reader import TraceFile
from spectrace.viz.steptree import step_tree
from spectrace.viz.tui import panels
from spectrace.viz.tui.kv_panel import kv_panel
from spectrace.viz.tui.app import HelpScreen, Walkthrough
from spectrace.viz.tui.snapshot import drive as snapshot_drive
from spectrace.viz.tui.snapshot import snapshot, text_and_svg

DATA = Path(__file__).with_name("data")
TRACE = DATA / "walkthrough.jsonl"
SNAPSHOTS = Path(__file__).with_name("snapshots")
UPDATE = os.environ.get("SPECTRACE_UPDATE_SNAPSHOTS") == "1"


def drive(keys, size=(100, 30), export_dir=None, trace=TRACE):
    return snapshot_drive(trace, keys, size, export_dir)


def test_opens_on_the_first_steps_drafting():
    """The step from its start: level 1 of the tree, no verdict yet; the walk comes three
    phases later (DRAFT 2, VERIFY, ACCEPT)."""
    app, text = drive([])
    assert (app.position, app.phase_name, app.node) == (0, "DRAFT 1", 1)
    assert app.record["step"] == TraceFile(TRACE).step(0)["step"]
    assert "draft tree · DRAFT 1" in text and "greedy: accept iff" not in text and "✓" not in text
    assert "τ 4.00 (completion_tokens/verify_ct)" in text and "accept_len/step 3.00" in text
    app, text = drive(["right_square_bracket"] * 3)
    assert app.phase_name == "ACCEPT" and "greedy: accept iff draft == argmax" in text


def test_steps_phases_and_nodes_move_and_the_inspector_follows():
    app, text = drive(["right", "right", "left"] + ["right_square_bracket"] * 4 + ["left_square_bracket", "down"])
    rec = app.record
    assert app.position == 1 and app.phase_name == "VERIFY"
    nodes = step_tree(rec, app.trace.token_text)
    shown = panels.visible_nodes(nodes, "VERIFY")
    assert app.node == shown[2]  # root, first node, then one down
    n = nodes[app.node]
    assert f"node {n.index}" in text and f"draft q {n.q:.4f}" in text  # the inspector reads that node
    assert "greedy: accept iff" not in text  # the walk has not run yet in VERIFY
    # phases clamp at both ends
    app, _ = drive(["left_square_bracket"] * 20)
    assert app.phase_name == "DRAFT 1"
    app, _ = drive(["right_square_bracket"] * 20)
    assert app.phase_name == "EXTEND"


def test_draft_phases_grow_the_tree_level_by_level():
    app, _ = drive(["left_square_bracket"] * 20)
    nodes = app.nodes
    seen = []
    for d in range(1, max(n.depth for n in nodes if n.fate != "bonus") + 1):
        shown = panels.visible_nodes(nodes, f"DRAFT {d}")
        assert all(nodes[i].depth <= d for i in shown)
        seen.append(len(shown))
    assert seen == sorted(seen) and seen[-1] == len(nodes) - 1  # everything but the bonus at the end


def test_every_draft_level_shows_with_the_dropped_candidates_faded(tmp_path):
    """With num_steps 5 the tree's nodes may stop at depth 3; the DRAFT phases still run 1..5, and
    each shows the candidates the tree did not keep, faded under their parents with their path
    scores, every one of them at or below the cut (organize_draft_results keeps the n-1 best)."""
    from spectrace.viz.steptree import dropped_candidates

    trace = tmp_path / "t.jsonl"
    assert main(["run", "--no-tui", "--algo", "eagle", "--num-steps", "5", "--topk", "4", "--max-new-tokens", "12",
                 "--trace", str(trace)]) == 0
    t = TraceFile(trace)
    console = Console(width=200, file=io.StringIO(), color_system=None)
    shallow = 0
    for i in range(len(t)):
        rec = t.step(i)
        c, draft = rec["draft"]["candidates"], rec["draft"]
        assert len(c["tokens"]) == 4 + 4 * 4 * 4  # K + (S-1)K^2
        kept = [(j, n) for j, n in enumerate(c["nodes"]) if n != -1]
        assert sorted(n for _, n in kept) == list(range(1, len(draft["tokens"]) + 1))
        for cand, node in kept:  # a kept candidate is its node: token, score, parent, depth
            assert c["tokens"][cand] == draft["tokens"][node - 1] and c["scores"][cand] == draft["scores"][node - 1]
            assert c["levels"][cand] + 1 == draft["depths"][node - 1]
            par = c["parents"][cand]
            assert draft["parents"][node - 1] == (0 if par == -1 else c["nodes"][par])
        dropped = dropped_candidates(rec, t.token_text)
        assert max(d.score for d in dropped) <= min(draft["scores"])
        assert panels.phases_of(rec, "eagle")[:5] == [f"DRAFT {d}" for d in range(1, 6)]
        shallow += max(draft["depths"]) < 5
        nodes = step_tree(rec, t.token_text)
        for d in range(1, 6):
            console.file = io.StringIO()
            console.print(panels.tree_panel(nodes, f"DRAFT {d}", 1, dropped))
            text = console.file.getvalue()
            assert text.count('✂ "') == sum(x.depth <= d for x in dropped)  # one line each
            assert f"level {d}: " in text
        console.file = io.StringIO()
        console.print(panels.tree_panel(nodes, "VERIFY", 1, dropped))
        assert "✂" not in console.file.getvalue()  # once drafted, the tree alone is verified
    assert shallow  # some step's tree stopped above the last level it drafted


def test_at_80x24_the_tree_comes_first_and_follows_the_selection(tmp_path):
    """A small terminal gets the compact layout (no step strip, the tree wider and taller), every
    node one line, and moving the selection down a 16-node tree scrolls the tree to it; at ACCEPT,
    every step's accepted path and bonus are in view with the selection (moved to where the walk
    ended when they do not fit together)."""
    trace = tmp_path / "t.jsonl"
    assert main(["run", "--no-tui", "--algo", "eagle", "--topk", "4", "--num-steps", "5", "--num-draft-tokens", "16",
                 "--max-new-tokens", "8", "--trace", str(trace)]) == 0

    async def go():
        app = Walkthrough(TraceFile(trace))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press(*["right_square_bracket"] * 9, *["down"] * 15)
            await pilot.pause()
            tree = app.query_one("#tree")
            line = panels.tree_line(app.nodes, app.phase_name, app.node)
            return (app.screen.has_class("compact"), app.node, tree.scroll_y, tree.scrollable_content_region.height,
                    line, tree.virtual_size.height)
    compact, node, top, height, line, lines = asyncio.run(go())
    assert compact and lines == 17  # the root, 15 drafts and the bonus, a line each
    assert line == lines - 1 and node != 0  # the selection went down to the tree's last line
    assert 0 < top <= line < top + height  # and the view scrolled to show it

    async def outcomes():  # ACCEPT, reached by phase and then by step: where the walk ended, and what is in view
        app = Walkthrough(TraceFile(trace))
        seen = []
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press(*["right_square_bracket"] * 6)
            for _ in range(len(app.by_request[app.request])):
                await pilot.pause()
                tree = app.query_one("#tree")
                path = [n.index for n in app.nodes if n.fate in ("correct", "bonus")]
                seen.append((app.phase_name, tree.scroll_y, tree.scrollable_content_region.height,
                             [panels.tree_line(app.nodes, app.phase_name, i) for i in [app.node] + path]))
                await pilot.press("right")
        return seen
    for phase, top, height, lines in asyncio.run(outcomes()):  # the selection first, then the path
        assert phase == "ACCEPT" and all(top <= line < top + height for line in lines), (top, height, lines)


def test_keys_in_a_burst_close_the_help_once():
    """A terminal delivers keys in bursts: several can reach the help before its dismissal has run.
    The first closes it; the rest must not pop the walkthrough's own screen (a ScreenStackError)."""
    from textual import events

    async def go():
        app = Walkthrough(TraceFile(TRACE))
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("question_mark")
            await pilot.pause()
            help_screen = app.screen
            for key in "abc":
                help_screen.on_key(events.Key(key, key))
            await pilot.pause()
            return app.is_running, app.screen
    running, screen = asyncio.run(go())
    assert running and not isinstance(screen, HelpScreen)


def test_request_switch_and_help_and_quit():
    app, text = drive(["r"])
    assert app.request == app.requests[1] and f"request {app.request} (2/2)" in text
    app, _ = drive(["question_mark"])
    assert isinstance(app.top_screen, HelpScreen)
    app, _ = drive(["question_mark", "x"])
    assert not isinstance(app.top_screen, HelpScreen)
    app, _ = drive(["q"])
    assert app.return_code in (0, None) and not app.is_running


def test_play_advances_phases_then_steps(monkeypatch):
    """Space plays (one phase per tick), space again pauses; waits for two ticks, not a fixed time."""
    async def go():
        app = Walkthrough(TraceFile(TRACE))
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("left_square_bracket", "left_square_bracket")
            before = (app.position, app.phases.index(app.phase_name))
            await pilot.press("space")
            for _ in range(100):  # up to 5 s on a loaded machine
                await pilot.pause(0.05)
                if (app.position, app.phases.index(app.phase_name)) >= (before[0], before[1] + 2):
                    break
            await pilot.press("space")
            after = (app.position, app.phases.index(app.phase_name))
            return before, after, app._timer
    before, after, timer = asyncio.run(go())
    assert after >= (before[0], before[1] + 2) and timer is None


def test_export_writes_this_steps_figure(tmp_path):
    app, _ = drive(["right", "g"], export_dir=tmp_path)
    rec = app.record
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [f"walkthrough-step{rec['step']}-req{rec['request']}.svg"]
    assert "<svg" in files[0].read_text()


def test_stream_highlights_accepted_drafts_and_bonus():
    trace = TraceFile(TRACE)
    meta = trace.index[0]
    text = panels.stream_panel(trace, meta.request, 0, "ACCEPT")
    plain = text.plain
    committed = "".join(trace.token_text(t) for t in meta.committed)
    assert plain.endswith(committed)
    assert panels.stream_panel(trace, meta.request, 0, "VERIFY").plain == plain[: len(plain) - len(committed)]


@pytest.mark.parametrize("name, keys, size", [
    ("first-step-100x30", [], (100, 30)),
    ("draft-level-2-100x30", ["right", "right", "left_square_bracket"] * 1 + ["left_square_bracket"] * 3 +
     ["right_square_bracket"], (100, 30)),
    ("commit-80x24", ["right"] + ["right_square_bracket"] * 5 + ["down", "down"], (80, 24)),
])
def test_snapshots(name, keys, size):
    _, text = drive(keys, size)
    path = SNAPSHOTS / f"{name}.txt"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"screen differs from {path}"


# ---- bad traces: one clear line, exit code 2; a truncated trace replays what it holds ------

def _lines():
    return TRACE.read_text(encoding="utf-8").splitlines(keepends=True)


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "no trace file"),
    (lambda p: p.write_text(""), "is empty"),
    (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00"), "not a spectrace trace"),
    (lambda p: p.write_text(_lines()[0][:40]), "not a spectrace trace"),
    (lambda p: p.write_text("".join(_lines()[:3]) + "{garbage\n" + "".join(_lines()[3:])), "corrupted at line 4"),
    (lambda p: p.write_text(json.dumps({**json.loads(_lines()[0]), "schema": "spectrace.trace/9"}) + "\n"),
     "spectrace.trace/9 is not readable"),
    (lambda p: p.write_text("".join(_lines()[:3])), "no decode steps"),
    # the first step, which the walkthrough would open on: refused before the UI opens
    (lambda p: p.write_text("".join(_lines()[:3]) + _lines()[3].replace('"accept_tokens": [', '"accept_tokens": ' +
                            "[" * 10000 + "]" * 10000 + ', "x": [', 1) + "".join(_lines()[4:])),
     "corrupted at line 4 (nested too deeply)"),
    (lambda p: p.write_text("".join(_lines()[:3]) + _lines()[3].replace('"bonus_token":', '"step": 0, "bonus_token":',
                                                                        1) + "".join(_lines()[4:])),
     "corrupted at line 4 (duplicate key 'step')"),
    (lambda p: p.write_text("".join(_lines()[:4]) + "".join(_lines()[3:])), "line 5: a second record of step"),
    (lambda p: p.write_text("".join(_lines()[:3]) + _lines()[3].replace('"parents": [0', '"parents": [1', 1)
                            + "".join(_lines()[4:])), "line 4: draft node 1's parent 1 is not an earlier node"),
])
def test_bad_traces_are_one_line_and_exit_2(tmp_path, capsys, make, message):
    path = tmp_path / "t.jsonl"
    make(path)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_truncated_trace_replays_up_to_its_last_complete_step(tmp_path):
    lines = _lines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:8]) + lines[8][: len(lines[8]) // 2], encoding="utf-8")
    trace = TraceFile(cut)
    assert any("torn line" in n for n in trace.notices)
    assert len(trace) == sum(1 for line in lines[:8] if line.startswith('{"kind": "step"'))

    async def go():
        app = Walkthrough(trace)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press(*["right"] * 50)
            await pilot.pause()  # let a loaded machine finish the moves and notifications
            return app.position, [n.message for n in app._notifications]
    position, notes = asyncio.run(go())
    assert position == len(app_steps := [m for m in trace.index if m.request == trace.index[0].request]) - 1
    assert any("torn line" in n for n in notes) and app_steps


def test_replay_and_render_need_no_torch(tmp_path):
    """A viewer machine needs neither model nor torch: block torch and drive the viewer code."""
    import subprocess
    import sys

    code = f"""
import sys, asyncio
sys.modules["torch"] = None  # any import of torch now fails
from spectrace.cli import main
from spectrace.core.trace_reader import TraceFile
from spectrace.viz.tui.app import Walkthrough
assert main(["render", {str(TRACE)!r}, "--step", "1", "-o", {str(tmp_path / 'f.svg')!r}]) == 0
async def go():
    app = Walkthrough(TraceFile({str(TRACE)!r}))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("right", "down", "left_square_bracket")
        return app.position
assert asyncio.run(go()) == 1
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("args, keys, shown", [
    (["--algo", "ngram", "--prompt-lookup-min", "1", "--prompt-lookup-max", "3"], ["up"], "n-gram: the context's last"),
    (["--algo", "ngram", "--ngram-style", "sglang"], ["up"], "n-gram trie (BFS)"),
    (["--algo", "medusa", "--acceptance", "typical", "--temperature", "1"], [], "typical (Medusa)"),
    (["--algo", "dflash", "--draft-model", "DFLASH"], [], "greedy: accept iff"),
    (["--algo", "eagle", "--speculative-adaptive"], [], "adaptive: this step drafted 3"),
    (["--algo", "eagle", "--acceptance", "tree_rejection", "--temperature", "1"], [], "siblings were drawn from q"),
    (["--algo", "eagle", "--trace-level", "steps"], [], "top-k not recorded (--trace-level steps)"),
])
def test_every_drafter_and_rule_walks_and_renders(tmp_path, capsys, dflash_dir, args, keys, shown):
    """A short run of each new drafter: the walkthrough shows what is particular to it on the
    first drafted step (at the root for n-gram, else on the first node); every panel of every
    step renders in every phase; every step renders as DOT."""
    from spectrace.viz.graph import step_graph

    trace = tmp_path / "t.jsonl"
    args = [str(dflash_dir) if a == "DFLASH" else a for a in args]
    assert main(["run", "--no-tui", "--max-new-tokens", "12", "--trace", str(trace), *args]) == 0
    t = TraceFile(trace)
    first = next(i for i, m in enumerate(t.index) if t.step(i)["draft"] is not None)
    _, text = drive(["right"] * first + keys + ["right_square_bracket"] * 20, size=(140, 45), trace=trace)  # walked
    assert shown in text
    algo = t.header["config"]["algo"]
    console = Console(width=100, file=io.StringIO())
    for i, meta in enumerate(t.index):
        rec = t.step(i)
        nodes = step_tree(rec, t.token_text)
        for phase in panels.phases_of(rec, algo):
            shown = panels.visible_nodes(nodes, phase)
            for node in {shown[0], shown[-1]}:  # the root and the last node shown
                console.print(panels.tree_panel(nodes, phase, node), panels.inspector_panel(t, rec, nodes, phase, node))
            console.print(panels.stream_panel(t, meta.request, i, phase), kv_panel(rec, phase))
        assert "digraph" in step_graph(rec, t.token_text).source


def test_snapshot_gives_the_screen_as_text_and_as_svg():
    """The lessons' helper: the same screen the Pilot flows read, and an SVG of it that parses."""
    import xml.etree.ElementTree as ET

    keys = ["right", "down"]
    text = snapshot(TRACE, keys, size=(100, 30))
    assert text == drive(keys)[1] and "phase" in text
    svg = snapshot(TRACE, keys, size=(100, 30), svg=True)
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and "phase" in "".join(root.itertext())
    both = text_and_svg(TRACE, keys, size=(100, 30))  # one drive, both forms (the lessons' screen())
    assert both[0] == text and "".join(ET.fromstring(both[1]).itertext()) == \
        "".join(root.itertext())


def test_ctrl_c_quits_like_any_terminal_program():
    app, _ = drive(["ctrl+c"])
    assert app.return_code in (0, None) and not app.is_running


def test_the_phase_bar_fits_80_columns_with_five_draft_levels():
    class FiveLevels(Walkthrough):
        phases = property(lambda self: [f"DRAFT {d}" for d in range(1, 6)] + ["VERIFY", "ACCEPT", "COMMIT", "EXTEND"])

    async def bar(size):
        app = FiveLevels(TraceFile(TRACE))
        async with app.run_test(size=size):
            return app.phase_bar().plain
    narrow, wide = asyncio.run(bar((80, 24))), asyncio.run(bar((120, 30)))
    assert len(narrow) <= 78 and " D5 " in narrow and " EXTEND " in narrow
    assert " DRAFT 5 " in wide


def test_long_token_text_is_shortened_where_drawn_and_whole_in_the_inspector(tmp_path):
    """A 100 KB token (a shared trace can hold one) makes short labels in the tree, the stream and
    the figure; the inspector, where one looks at a node, has all of it."""
    from spectrace.viz.graph import step_graph

    big = "x" * 100_000
    path = tmp_path / "long.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for line in _lines():
            rec = json.loads(line)
            if "834" in rec.get("tokens", {}):  # " The": node 1 of the first step
                rec["tokens"]["834"] = big
            f.write(json.dumps(rec) + "\n")
    app, text = drive([], size=(200, 30), trace=path)
    assert app.nodes[1].text == big and "…(+99960 chars)" in text and len(text) < 10_000
    rec, t = app.record, app.trace
    inspector = Console(width=100, file=io.StringIO(), record=True)
    inspector.print(panels.inspector_panel(t, rec, app.nodes, "DRAFT 1", 1))
    assert big in inspector.export_text().replace("\n", "").replace(" ", "x")  # wrapped, but whole
    dot = step_graph(rec, t.token_text).source
    assert "…(+99960 chars)" in dot and len(dot) < 5_000


def test_at_80x24_the_inspector_shows_every_number_whole():
    """The node inspector is 28 columns wide at 80x24: a token may give way to an ellipsis, a
    probability never does. Every node of the first step, at DRAFT and at VERIFY: each q and p of
    its top-k table is printed whole at the panel's width."""
    trace = TraceFile(TRACE)

    async def go():
        app = Walkthrough(trace)
        shown = []
        async with app.run_test(size=(80, 24)) as pilot:
            for phase_keys in ([], ["right_square_bracket"] * 2):
                await pilot.press(*phase_keys)
                for _ in range(len(app.nodes)):
                    await pilot.pause()
                    inspector = app.query_one("#inspector")
                    console = Console(width=inspector.scrollable_content_region.width, file=io.StringIO(),
                                      record=True)
                    console.print(panels.inspector_panel(trace, app.record, app.nodes, app.phase_name, app.node))
                    shown.append((app.phase_name, app.node, console.export_text()))
                    await pilot.press("down")
        return shown

    rec = trace.step(0)
    checked = 0
    for phase, node, text in asyncio.run(go()):
        if node == 0 or node > len(rec["draft"]["draft_topk"]):
            continue  # the root and the bonus: their tables are the target's
        pairs = rec["draft"]["draft_topk"][node - 1]
        assert pairs and all(f"{p:.3f}" in text for _, p in pairs), (phase, node, text)
        assert "0…" not in text and ".…" not in text
        checked += 1
    assert checked >= 2 * (len(rec["draft"]["tokens"]))


def test_the_summary_after_the_walkthrough_starts_on_a_cleared_row():
    """Back from the walkthrough's alternate screen the cursor is where the status line left it:
    the row is cleared before the run's summary prints, so the summary does not run on from
    "spectrace: opening the walkthrough"."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
    from startup_times import in_a_terminal

    *_, code, out = in_a_terminal(["run", "--algo", "eagle", "--topk", "4", "--max-new-tokens", "8",
                                   "--trace-level", "steps"], ("tree · DRAFT".encode(),))
    out = out if isinstance(out, bytes) else out.encode("utf-8", "surrogateescape")
    assert code == 0 and b"opening the walkthrough" in out
    after = out[out.rindex(b"\x1b[?1049l"):]
    cleared, summary = after.find(b"\r\x1b[K"), after.find(b"algo=eagle")
    assert 0 < cleared < summary, after[:200]
