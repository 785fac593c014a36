"""The walkthrough: a Textual app that replays a trace step by step and phase by phase.

    left/right  step          [ / ]  phase          up/down  node          r  next request
    space       play / pause  g      export this step's Graphviz figure     ?  help    q  quit

The panels' contents come from `panels.py` and `kv_panel.py`; this module holds the cursor (request, step, phase,
node) and the layout. Records are read from the trace lazily, one step at a time.
"""
from __future__ import annotations

import functools

from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from spectrace.errors import SpectraceError
from spectrace.progress import on_a_terminal
from spectrace.core.trace import MALFORMED, TraceError, malformed
from spectrace.core.trace_reader import TraceFile
from spectrace.viz import graph
from spectrace.viz.steptree import ViewNode, dropped_candidates, step_tree
from spectrace.viz.tokens import LABEL_LIMIT, shown
from spectrace.viz.tui import panels
from spectrace.viz.tui.kv_panel import kv_panel

HELP = """[b]spectrace walkthrough[/b]

A step is one round of speculative decoding. Its phases:
  [cyan]DRAFT d[/cyan]   the drafter grows the tree level by level (q: draft probability, s: path score)
  [cyan]VERIFY[/cyan]    one target forward over every node with the tree mask (p: target probability)
  [cyan]ACCEPT[/cyan]    the rule walks from the root: [green]✓ correct[/green], [red]✗ rejected[/red], · never reached,
            and the [blue]★ bonus[/blue] token the target adds after the last correct node
  [cyan]COMMIT[/cyan]    the target KV keeps the accepted path; the rest is released
  [cyan]EXTEND[/cyan]    the drafter catches up on the accepted tokens

Keys:  left/right step   [ ] phase   up/down node   r request   space play/pause
       g export this step as a Graphviz figure   ? this help   q quit

accept_len = correct drafts + 1 bonus;  α = correct / proposed;
τ = completion tokens / verify passes (SGLang's accept length: it counts the prefill's token).
Press any key to close."""


class HelpScreen(ModalScreen):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 96; max-width: 100%; height: auto; border: round $accent; padding: 0 1;
                          background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP)

    closing = False

    def on_key(self, event) -> None:
        event.stop()
        if not self.closing:  # keys in a burst: the first closes the help, the rest find it closing
            self.closing = True
            self.dismiss()


class Panel(VerticalScroll, can_focus=False):
    """A titled, scrollable box around one Static."""

    def __init__(self, title: str, id: str):
        super().__init__(id=id)
        self.border_title = title
        self.body = Static()

    def compose(self) -> ComposeResult:
        yield self.body

    def show(self, renderable, title: str | None = None) -> None:
        self.body.update(renderable)
        if title is not None:
            self.border_title = title


def guarded(handler):
    """A handler that meets a record the viewer cannot show (corrupted, or a field of another
    shape: an edited or a foreign trace) says why in the inspector instead of ending the app."""
    @functools.wraps(handler)
    def run(self, *args):
        if self.trace is None:  # a run still making its trace: nothing to move through yet
            return None
        try:
            return handler(self, *args)
        except (TraceError, *MALFORMED) as e:
            if not isinstance(e, TraceError):
                e = malformed(self.trace.path, self.trace.index[self.by_request[self.request][self.position]].where, e)
            self.query_one("#inspector", Panel).show(Text(str(e), style="bold red"), "cannot show this step")
    return run


class Walkthrough(App):
    TITLE = "spectrace"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #title { height: 1; background: $primary-background; color: $text; padding: 0 1; }
    #phases { height: 1; padding: 0 1; }
    #timeline { height: 3; border: round $secondary; padding: 0 1; }
    #middle { height: 3fr; }
    #bottom { height: 2fr; }
    #tree, #inspector, #stream, #kv { border: round $secondary; padding: 0 1; width: 1fr; }
    #metrics { height: 4; border: round $secondary; padding: 0 1; }
    Panel { scrollbar-size-vertical: 1; }
    /* a small terminal (80x24): the tree first; the step strip goes, the tokens and KV shrink */
    .compact #timeline { display: none; }
    .compact #middle { height: 1fr; }
    .compact #bottom { height: 6; }
    .compact #tree { width: 3fr; }
    .compact #inspector { width: 2fr; }
    """
    COMPACT_ROWS = 26  # a terminal this high or lower (80x24, 80x25) shows the compact layout
    BINDINGS = [
        Binding("left", "step(-1)", "step", priority=True),
        Binding("right", "step(1)", "step", show=False, priority=True),
        Binding("left_square_bracket", "phase(-1)", "phase", priority=True),
        Binding("right_square_bracket", "phase(1)", "phase", show=False, priority=True),
        Binding("up", "node(-1)", "node", priority=True),
        Binding("down", "node(1)", "node", show=False, priority=True),
        Binding("r", "request", "request"),
        Binding("space", "play", "play"),
        Binding("g", "export", "figure"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", show=False, priority=True),  # as in every terminal program (Textual copies)
    ]

    def __init__(self, trace: TraceFile | None, export_dir: Path | None = None):
        """trace: None while a run is still making it (live.py); `take` gives it later."""
        super().__init__()
        self.trace: TraceFile | None = None
        self.export_dir = export_dir
        self._timer = None
        if trace is not None:
            self.take(trace)

    def take(self, trace: TraceFile) -> None:
        """Show `trace` from its first step (its first request's), DRAFT 1."""
        self.trace = trace
        self.algo = trace.header.get("config", {}).get("algo", "?")
        self.requests = sorted({m.request for m in trace.index})
        self.by_request = {r: [i for i, m in enumerate(trace.index) if m.request == r] for r in self.requests}
        self.request = self.requests[0]
        self.position = 0  # index into the request's steps
        self.phase_name = "DRAFT 1"  # the step from its start: drafting, then the verdict (_clamp fixes it)
        self.node = 1
        self.export_dir = self.export_dir or Path(trace.path).parent

    # ---- state ---------------------------------------------------------------------------
    @property
    def record(self) -> dict:
        return self.trace.step(self.by_request[self.request][self.position])

    @property
    def phases(self) -> list[str]:
        return panels.phases_of(self.record, self.algo)

    @property
    def nodes(self) -> list[ViewNode]:
        return step_tree(self.record, self.trace.token_text)

    def _clamp(self) -> None:
        """Keep the phase and node valid after the step changed."""
        phases = self.phases
        if self.phase_name not in phases:  # a step that drafted fewer levels (or none)
            drafts = [p for p in phases if p.startswith("DRAFT")]
            self.phase_name = (drafts[-1] if self.phase_name.startswith("DRAFT") and drafts else "VERIFY")
        shown = panels.visible_nodes(self.nodes, self.phase_name)
        if self.node not in shown:
            self.node = shown[1] if len(shown) > 1 else shown[0]

    # ---- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Static(id="phases")
        yield Panel("steps: accept_len", "timeline")
        with Horizontal(id="middle"):
            yield Panel("draft tree", "tree")
            yield Panel("node", "inspector")
        with Horizontal(id="bottom"):
            yield Panel("tokens", "stream")
            yield Panel("KV cache", "kv")
        yield Panel("metrics", "metrics")
        yield Footer()

    def on_mount(self) -> None:
        if self.trace is not None:
            self.opened()

    @guarded
    def opened(self, notices: bool = True) -> None:
        """The first screen of the trace, and what the reader should know of it."""
        self._clamp()
        self.refresh_panels()
        for notice in self.trace.notices if notices else ():
            self.notify(notice, title="trace", timeout=6)
        rejudged = self.trace.header.get("rejudged")
        if isinstance(rejudged, dict):  # spectrace rejudge: say what the verdicts are
            self.notify(shown(f"re-judged from {rejudged.get('from')}: {rejudged.get('step_local')}"),
                        title="re-judged trace", timeout=10)

    def on_resize(self, event) -> None:
        self.screen.set_class(event.size.height <= self.COMPACT_ROWS, "compact")

    @guarded
    def refresh_panels(self) -> None:
        cfg = self.trace.header.get("config", {})
        steps = self.by_request[self.request]
        rec, nodes = self.record, self.nodes  # a corrupted line deep in the file surfaces when visited
        self.query_one("#title", Static).update(self.title_bar(cfg, rec, len(steps)))
        self.query_one("#phases", Static).update(self.phase_bar())
        width = max(10, self.size.width - 6)
        self.query_one("#timeline", Panel).show(panels.timeline(self.trace, self.request, self.position, width))
        dropped = dropped_candidates(rec, self.trace.token_text)
        tree = self.query_one("#tree", Panel)
        tree.show(panels.tree_panel(nodes, self.phase_name, self.node, dropped), f"draft tree · {self.phase_name}")
        tree.scroll_to(y=self.tree_top(nodes, dropped, tree.scrollable_content_region.height), animate=False)
        self.query_one("#inspector", Panel).show(
            panels.inspector_panel(self.trace, rec, nodes, self.phase_name, self.node), f"node {self.node}")
        self.query_one("#stream", Panel).show(panels.stream_panel(self.trace, self.request, self.position,
                                                                  self.phase_name))
        self.query_one("#kv", Panel).show(kv_panel(rec, self.phase_name), f"KV cache · {self.phase_name}")
        metrics = panels.running_metrics(self.trace, self.request, self.position)
        if rec.get("adaptive"):  # first: the panel shows two lines, the rest scrolls
            metrics = panels.adaptive_text(rec["adaptive"]).append("\n").append_text(metrics)
        self.query_one("#metrics", Panel).show(metrics)
        self.query_one("#stream", Panel).scroll_end(animate=False)

    def tree_lines(self, nodes: list[ViewNode], dropped) -> list[int]:
        """The tree panel's lines to keep in view: the selection's first; from ACCEPT on, the accepted
        path's and the bonus's."""
        walked = panels.after(self.phase_name, "ACCEPT")
        path = [n.index for n in nodes if walked and n.fate in ("correct", "bonus")]
        return [panels.tree_line(nodes, self.phase_name, i, dropped) for i in [self.node] + path]

    def tree_top(self, nodes: list[ViewNode], dropped, height: int) -> int:
        """The tree panel's first line in view: the selection always, centred where it can be, with
        the accepted path and bonus where they fit."""
        seen = self.tree_lines(nodes, dropped)
        line = seen[0]
        top = max(0, max(seen) - height + 1, min(min(seen), line - height // 2))
        return min(max(top, line - height + 1), line)

    def title_bar(self, cfg: dict, rec: dict, n_steps: int) -> Text:
        """What ran, where the cursor is, and this step's accept_len; without the leading
        'spectrace' where the terminal is narrow (80 columns)."""
        title = Text()
        what = shown(f"{self.algo} ({cfg.get('resolved_algorithm', '?')} {cfg.get('num_steps')},{cfg.get('topk')},"
                     f"{cfg.get('num_draft_tokens')} {rec['accept']['rule']})  ", limit=2 * LABEL_LIMIT)  # untrusted
        title.append(what, style="bold")
        if "rejudged" in self.trace.header:
            title.append("re-judged  ", style="bold magenta")
        title.append(f"request {self.request} ({self.requests.index(self.request) + 1}/{len(self.requests)})  ",
                     style="bold")
        title.append(f"step {rec['step']} ({self.position + 1}/{n_steps})  accept_len {rec['accept_len']}",
                     style="bold yellow")
        if len(title) + len("spectrace ") <= self.size.width - 2:
            title = Text("spectrace ", style="bold").append_text(title)
        return title

    def phase_bar(self) -> Text:
        """The step's phases, the current one lit; DRAFT d shortens to Dd where the full names
        would not fit (five draft levels at 80 columns)."""
        phases = self.phases
        full = len("phase ") + sum(len(p) + 2 for p in phases) <= self.size.width - 2
        bar = Text("phase ")
        for p in phases:
            label = p if full or not p.startswith("DRAFT") else "D" + p.split()[1]
            bar.append(f" {label} ", style="bold reverse cyan" if p == self.phase_name else "dim")
        return bar

    # ---- actions -------------------------------------------------------------------------
    def _to_outcome(self) -> None:
        """From ACCEPT on, where the selection and the accepted path with its bonus do not fit the tree
        panel together (a tall tree, a small terminal), the selection moves to where the walk ended:
        its last correct draft (the bonus hangs under it), else the first draft it refused."""
        nodes, tree = self.nodes, self.query_one("#tree", Panel)
        if not panels.after(self.phase_name, "ACCEPT"):
            return
        seen = self.tree_lines(nodes, ())  # (the faded candidates are drawn only while drafting)
        if max(seen) - min(seen) < tree.scrollable_content_region.height:
            return
        correct = sorted((n.depth, n.index) for n in nodes if n.fate == "correct")
        refused = [n.index for n in nodes if n.fate == "rejected"]
        self.node = correct[-1][1] if correct else refused[0] if refused else self.node

    @guarded
    def action_step(self, delta: int) -> None:
        self.position = max(0, min(self.position + delta, len(self.by_request[self.request]) - 1))
        self._clamp()
        self._to_outcome()
        self.refresh_panels()

    @guarded
    def action_phase(self, delta: int) -> None:
        phases = self.phases
        i = max(0, min(phases.index(self.phase_name) + delta, len(phases) - 1))
        walked = panels.after(self.phase_name, "ACCEPT")
        self.phase_name = phases[i]
        self._clamp()
        if not walked:  # the walk's outcome comes into view as ACCEPT opens; later phases keep the selection
            self._to_outcome()
        self.refresh_panels()

    @guarded
    def action_node(self, delta: int) -> None:
        shown = panels.visible_nodes(self.nodes, self.phase_name)
        i = shown.index(self.node) if self.node in shown else 0
        self.node = shown[max(0, min(i + delta, len(shown) - 1))]
        self.refresh_panels()

    @guarded
    def action_request(self) -> None:
        self.request = self.requests[(self.requests.index(self.request) + 1) % len(self.requests)]
        self.position = min(self.position, len(self.by_request[self.request]) - 1)
        self._clamp()
        self.refresh_panels()

    @guarded
    def _tick(self) -> None:
        """Play: the next phase, or the next step's first phase; stop at the end."""
        phases = self.phases
        if phases.index(self.phase_name) + 1 < len(phases):
            self.action_phase(1)
        elif self.position + 1 < len(self.by_request[self.request]):
            self.position += 1
            self.phase_name = self.phases[0]
            self._clamp()
            self.refresh_panels()
        else:
            self.action_play()

    def action_play(self) -> None:
        if self._timer is None:
            self._timer = self.set_interval(0.7, self._tick)
            self.notify("playing (space to pause)", timeout=2)
        else:
            self._timer.stop()
            self._timer = None

    def export_figure(self) -> Path:
        rec = self.record
        stem = Path(self.trace.path).stem
        out = self.export_dir / f"{stem}-step{rec['step']}-req{rec['request']}.svg"
        g = graph.step_graph(rec, self.trace.token_text)
        try:
            return graph.write_figure(g, out)
        except SpectraceError:  # no renderer: the DOT source still tells the story
            return graph.write_figure(g, out.with_suffix(".dot"))

    @guarded
    def action_export(self) -> None:
        try:
            path = self.export_figure()
        except SpectraceError as e:
            self.notify(str(e), severity="error", timeout=6)
            return
        self.notify(f"wrote {path}", title="figure", timeout=6)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


def check_opens(trace: TraceFile) -> None:
    """Raises TraceError where the walkthrough could not draw its first screen: no step, or a first
    step it cannot read (refused before the UI)."""
    if not trace.index:
        raise TraceError(f"trace {trace.path} holds no decode steps to replay")
    first = min(range(len(trace.index)), key=lambda i: (trace.index[i].request, i))  # where it opens
    trace.view(first, lambda rec: step_tree(rec, trace.token_text))


def replay(trace: TraceFile) -> None:
    """Open the walkthrough on an opened trace (raises TraceError / SpectraceError for bad input,
    SpectraceError without a terminal: Textual would wait for one forever)."""
    path = trace.path
    check_opens(trace)
    if not on_a_terminal():
        raise SpectraceError("the walkthrough needs a terminal on stdin, stdout and stderr (it draws through "
                             f"stderr); without one, draw a step with: spectrace render {path} --step N -o tree.svg")
    app = Walkthrough(trace)
    app.run()
    if app.return_code:  # Textual has drawn what went wrong; the command fails with it
        raise SpectraceError(f"the walkthrough stopped on an error (exit code {app.return_code})")
