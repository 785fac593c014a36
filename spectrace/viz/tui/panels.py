"""What each panel of the walkthrough shows, as Rich renderables built from trace records.

Pure functions of (trace, step, phase, selected node): the Textual app only lays them out and
moves the cursor, and tests read them without a terminal. A step plays in phases:
    DRAFT d   the tree as the drafter has grown it down to depth d (tokens, q, path score)
    VERIFY    every node with the target's probability p of its token (one forward, tree mask)
    ACCEPT    the walk: fates (correct, rejected, unreached) and the bonus token
    COMMIT    the target's KV keeps the accepted path; the rest is released
    EXTEND    the drafter catches up on the accepted tokens (DRAFT_EXTEND)
The KV panel is kv_panel.py's.
"""
from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from spectrace.core.trace_reader import TraceFile
from spectrace.viz.graph import FATE_COLORS
from spectrace.viz.tokens import LABEL_LIMIT, shown
from spectrace.viz.steptree import Candidate, ViewNode, preorder

MARKS = {"root": "●", "correct": "✓", "rejected": "✗", "unreached": "·", "bonus": "★"}
DRAFTED = "cyan"
BLOCKS = "▁▂▃▄▅▆▇█"
STREAM_STEPS = 200  # steps of committed text the token stream shows before the current one


def phases_of(rec: dict, algo: str) -> list[str]:
    """DRAFT 1..the deepest level drafted (the draft loop's, where the trace has its candidates,
    though no node of the last levels made the tree), then the verify phases."""
    draft = rec.get("draft")
    depth = max(draft["depths"]) if draft and draft["depths"] else 0
    if draft and draft.get("candidates"):
        depth = max(depth, 1 + max(draft["candidates"]["levels"]))
    phases = [f"DRAFT {d}" for d in range(1, depth + 1)] + ["VERIFY", "ACCEPT", "COMMIT"]
    return phases + (["EXTEND"] if algo != "none" else [])


def after(phase: str, name: str) -> bool:
    """Whether the walkthrough's `phase` (e.g. "DRAFT 2") is at or past the phase `name`."""
    order = ["DRAFT", "VERIFY", "ACCEPT", "COMMIT", "EXTEND"]
    return order.index(phase.split()[0]) >= order.index(name)


def visible_nodes(nodes: list[ViewNode], phase: str) -> list[int]:
    """Node indices shown in `phase`, in tree (preorder) order."""
    if phase.startswith("DRAFT"):
        depth = int(phase.split()[1])
        keep = {n.index for n in nodes if n.fate != "bonus" and n.depth <= depth}
    elif phase == "VERIFY":
        keep = {n.index for n in nodes if n.fate != "bonus"}
    else:
        keep = {n.index for n in nodes}
    return [i for i in preorder(nodes) if i in keep]


def tok(text: str, limit: int | None = LABEL_LIMIT) -> str:
    return f'"{shown(text, limit=limit)}"'


def node_label(n: ViewNode, phase: str, selected: bool) -> Text:
    walked = after(phase, "ACCEPT")
    color = FATE_COLORS[n.fate][1] if walked or n.fate == "root" else DRAFTED
    t = Text()
    t.append(f"{MARKS[n.fate] if walked or n.fate == 'root' else '○'} ", style=color)
    t.append(tok(n.text), style=f"bold {color}")
    if n.q is not None:
        t.append(f"  q {n.q:.2f}  s {n.score:.3f}", style="dim")
    if n.p is not None and after(phase, "VERIFY"):
        t.append(f"  p {n.p:.2f}", style="")
    if n.fate == "bonus":
        t.append("  bonus", style=color)
    if selected:
        t.stylize("reverse")
    t.no_wrap, t.overflow = True, "ellipsis"  # one line a node: a narrow panel cuts the numbers, not the tree
    return t


def dropped_label(c: Candidate) -> Text:
    return Text(f"✂ {tok(c.text)}  q {c.q:.2f}  s {c.score:.3g}  dropped", style="dim strike", no_wrap=True,
                overflow="ellipsis")


def tree_line(nodes: list[ViewNode], phase: str, selected: int, dropped: list[Candidate] = ()) -> int:
    """The line of tree_panel's output the selected node is drawn on (the view scrolls to it)."""
    shown = set(visible_nodes(nodes, phase))
    order = [i for i in preorder(nodes) if i in shown]
    line = order.index(selected) if selected in order else 0
    if phase.startswith("DRAFT") and dropped:  # the cut's line first; a faded candidate is drawn after its parent
        depth = int(phase.split()[1])
        before = set(order[:line + 1])
        line += 1 + sum(c.depth <= depth and c.parent_node is not None and c.parent_node in before
                        and c.parent_node != selected for c in dropped)
    return line


def tree_panel(nodes: list[ViewNode], phase: str, selected: int, dropped: list[Candidate] = ()) -> Tree | Group:
    """The tree as far as `phase` has grown it. While drafting, the candidates the tree will not
    keep hang faded under their parents, with the path score the cut compared (`draft_cut`)."""
    shown = set(visible_nodes(nodes, phase))
    branches: dict[int, Tree] = {}
    root = Tree(node_label(nodes[0], phase, selected == 0), guide_style="grey50")
    branches[0] = root
    for i in preorder(nodes):
        if i == 0 or i not in shown:
            continue
        n = nodes[i]
        branches[i] = branches[n.parent].add(node_label(n, phase, selected == i))
    if not phase.startswith("DRAFT") or not dropped:
        return root
    depth, faded = int(phase.split()[1]), {}
    for c in dropped:  # parents come first: flat candidate order is level by level
        if c.depth > depth:
            continue
        parent = branches[c.parent_node] if c.parent_node is not None else faded.get(c.parent_candidate)
        if parent is not None:
            faded[c.index] = parent.add(dropped_label(c))
    return Group(draft_cut(nodes, dropped, depth), root)


def draft_cut(nodes: list[ViewNode], dropped: list[Candidate], depth: int) -> Text:
    """Why the faded candidates go: the tree keeps the n-1 best path scores over every level."""
    kept = [n for n in nodes if n.score is not None]
    scored = sum(1 for n in kept if n.depth == depth) + sum(1 for c in dropped if c.depth == depth)
    cut = min(n.score for n in kept)
    return Text(f"level {depth}: {scored} candidates scored. The tree keeps the {len(kept)} best path scores of "
                f"all levels (s >= {cut:.3g}); ✂ dropped.", style="dim")


def _topk_table(title_a: str, pairs_a: list, title_b: str, pairs_b: list, trace: TraceFile,
                mark: int | None) -> Group | Text:
    if not pairs_a and not pairs_b:
        return Text(f"{title_a}: top-k not recorded (--trace-level {trace.header['config'].get('trace_level')})",
                    style="dim")
    # The titles on a line of their own, the table under them: tokens give way (an ellipsis) in a
    # narrow panel, the numbers never do (a cut "0…" says nothing).
    sides = [pairs for pairs in (pairs_a, pairs_b) if pairs or pairs is pairs_a]
    table = Table(box=None, padding=(0, 1), show_edge=False, show_header=False)
    for _ in sides:
        table.add_column(no_wrap=True, overflow="ellipsis")
        table.add_column(justify="right", no_wrap=True, min_width=5)
    for k in range(max(len(pairs) for pairs in sides)):
        cells = []
        for pairs in sides:
            if k < len(pairs):
                t, p = pairs[k]
                style = "bold" if t == mark else ""
                cells += [Text(tok(trace.token_text(t)), style=style), f"{p:.3f}"]
            else:
                cells += ["", ""]
        table.add_row(*cells)
    return Group(Text(f"{title_a}  |  {title_b}" if title_b else title_a, style="dim"), table)


def inspector_panel(trace: TraceFile, rec: dict, nodes: list[ViewNode], phase: str, selected: int) -> Group:
    """The selected node: the rule's verdict first (once the walk ran), then its numbers, then the
    draft's and the target's top candidates after its parent side by side."""
    n = nodes[selected]
    verify, draft = rec["verify"], rec.get("draft")
    head = Text()
    head.append(tok(n.text, limit=None), style=f"bold {FATE_COLORS[n.fate][1]}")  # the one place it is whole
    head.append(f"  node {n.index}  id {n.token}  depth {n.depth}")
    if n.parent is not None:
        head.append(f"  parent {n.parent} {tok(nodes[n.parent].text)}", style="dim")
    parts = [head]
    if n.fate == "root":
        parts.append(Text("The root: the last committed token. Its target KV is written by this step's verify, "
                          "and its row's logits judge its children.", style="dim"))
        if draft and draft.get("proposer"):
            parts.append(proposer_text(trace, draft["proposer"]))
        if after(phase, "VERIFY"):
            parts.append(_topk_table("target p after the root", verify["target_topk"][0], "", [], trace,
                                     verify["target_predict"][0]))
        return Group(*parts)
    if n.fate == "bonus":
        parts.append(bonus_text(rec, n))
        src = rec["accept"].get("bonus_from")
        if src is not None:
            parts.append(_topk_table("bonus drawn from", src["topk"], "", [], trace, n.token))
        else:
            parts.append(_topk_table(f"target p after node {n.parent}", verify["target_topk"][n.parent], "", [], trace,
                                     n.token))
        return Group(*parts)
    if after(phase, "ACCEPT"):
        parts.append(decision_text(trace, rec, n, verify["target_predict"][n.parent]))
    numbers = Text(f"draft q {n.q:.4f}  path score {n.score:.4f}")
    draft_pairs = draft["draft_topk"][n.index - 1] if draft else []
    if not after(phase, "VERIFY"):
        parts += [numbers, _topk_table(f"draft q after node {n.parent}", draft_pairs, "", [], trace, n.token)]
        return Group(*parts)
    numbers.append(f"  target p {n.p:.4f}")  # p(token | parent), recorded for every node
    parts += [numbers, _topk_table("draft q", draft_pairs, "target p", verify["target_topk"][n.parent], trace,
                                   n.token)]
    return Group(*parts)


def proposer_text(trace: TraceFile, src: dict) -> Text:
    """Where a model-free draft came from: the n-gram that matched and its earlier occurrence
    (vLLM), or the trie matches and how much of the tree they filled (SGLang)."""
    if src["kind"] == "ngram_trie":
        t = Text(f"n-gram trie ({src['match_type']}): ")
        if not src["anchors"]:
            return t.append(f"no suffix of the context is in the trie; the tree is the root and "
                            f"{src['padding']} padding tokens (id 0)")
        t.append(tok("".join(trace.token_text(i) for i in src["matched"]), 2 * LABEL_LIMIT), style="bold magenta")
        return t.append(f" ({src['anchors'][0]} tokens, the longest of {len(src['anchors'])} matching suffixes) leads "
                        f"into the trie ({src['trie_nodes']} nodes); {src['from_trie']} drafts came from it, "
                        f"{src['padding']} are padding")
    t = Text("n-gram: the context's last ")
    t.append(f"{src['n']} tokens ", style="bold")
    t.append(tok("".join(trace.token_text(i) for i in src["matched"]), 2 * LABEL_LIMIT), style="bold magenta")
    t.append(f" also occur at position {src['match_start']} of {src['context_len']}; "
             f"the drafts copy what followed them there.")
    return t


RULE_TEXT = {
    "greedy": "greedy: accept iff draft == argmax p(· | parent)",
    "target_only": "target_only: accept iff coin <= prob_acc / threshold_acc or p >= threshold_single "
                   "(one coin per level; prob_acc sums the tried siblings' p)",
    "rejection": "rejection: accept iff coin * q < p, i.e. with probability min(1, p / q)",
    "vllm": "vllm: accept iff q > 0 and p / q >= u; a rejection emits a recovered token ~ relu(p - q)",
    "typical": "typical (Medusa): accept iff p > min(0.09, 0.3 * exp(-H(p))); the longest passing path wins, "
               "ties to the likelier",
    "tree_rejection": "tree_rejection: siblings were drawn from q without replacement; accept iff "
                      "coin * q'(x) < p'(x); a rejection sets p' = relu(p' - q') and drops x from q'",
}


def _arithmetic(rule: str, d: dict, trace: TraceFile, argmax: int) -> str:
    """The numbers of one decision, in the rule's own comparison."""
    ok = d["accepted"]
    if rule == "greedy" or "target_argmax" in d:
        t = d.get("target_argmax", argmax)
        return f"{tok(trace.token_text(d['draft']))} {'==' if ok else '!='} {tok(trace.token_text(t))}"
    if rule == "target_only":
        lhs = f"coin {d['coin']:.3f} {'<=' if d['coin'] <= d['prob_acc'] / d['threshold_acc'] else '>'} " \
              f"prob_acc {d['prob_acc']:.3f} / {d['threshold_acc']:g}"
        return f"{lhs};  p {d['p']:.3f} {'>=' if d['p'] >= d['threshold_single'] else '<'} {d['threshold_single']:g}"
    if rule in ("rejection", "tree_rejection"):
        m = "'" if rule == "tree_rejection" else ""  # the residual p', q' after rejected siblings
        return (f"coin {d['coin']:.3f} * q{m} {d['q']:.3f} = {d['coin'] * d['q']:.3f} {'<' if ok else '>='} "
                f"p{m} {d['p']:.3f}")
    if rule == "vllm":
        ratio = d["p"] / d["q"] if d["q"] > 0 else float("nan")
        return f"p {d['p']:.3f} / q {d['q']:.3f} = {ratio:.3f} {'>=' if ok else '<'} u {d['coin']:.3f}"
    if rule == "typical":
        return (f"p {d['p']:.3f} {'>' if d['passes'] else '<='} threshold {d['threshold']:.3f} "
                f"(entropy {d['entropy']:.2f})" + ("" if ok or not d["passes"] else "; another path won"))
    return ", ".join(f"{k} {d[k]}" for k in ("coin", "p", "q") if k in d)  # a rule this viewer does not know


def decision_text(trace: TraceFile, rec: dict, n: ViewNode, argmax: int) -> Text:
    """The acceptance arithmetic for one node, written out as the rule computes it."""
    rule = rec["accept"]["rule"]
    color = FATE_COLORS[n.fate][1]
    t = Text()
    t.append(RULE_TEXT.get(rule, f"rule {rule}") + "\n", style="bold")
    d = next((d for d in rec["accept"]["decisions"] if d["node"] == n.index), None)
    if d is not None:
        t.append("  " + _arithmetic(rule, d, trace, argmax) + "  ->  ")
    verdict = {"correct": "correct: on the accepted path",
               "rejected": "rejected: tried and refused",
               "unreached": "never reached: the walk stopped or took an earlier sibling"}[n.fate]
    t.append(verdict, style=f"bold {color}")
    return t


def bonus_text(rec: dict, n: ViewNode) -> Text:
    """Where the bonus came from: the target's argmax (greedy), p after the last accepted node,
    or the residual once drafts there were rejected."""
    src = rec["accept"].get("bonus_from")
    t = Text(f"bonus: the target's own token after node {n.parent}, the last node of the accepted path; "
             f"accept_len = {len(rec['correct_drafts'])} correct + 1 bonus = {rec['accept_len']}\n",
             style=FATE_COLORS["bonus"][1])
    if src is None:
        t.append("greedy: the argmax of p after that node", style="dim")
    elif src["dist"] == "target":
        t.append("sampled from p after that node" + (f" (coin {src['coin']:.3f})" if "coin" in src else ""), style="dim")
    elif src["dist"] == "typical":
        t.append(f"sampled from p after that node without the tokens below the typical threshold "
                 f"{src['threshold']:.3f} (coin {src['coin']:.3f})", style="dim")
    else:
        t.append("sampled from the residual: p with the rejected drafts' mass removed, relu(p - q), renormalised"
                 + (f" (coin {src['coin']:.3f})" if "coin" in src else ""), style="dim")
    return t


def stream_panel(trace: TraceFile, request: int, position: int, phase: str) -> Text:
    """The request's text: prompt tail, committed output before this step, then this step's
    accepted drafts (green) and bonus (blue) once the walk has run."""
    metas = [m for m in trace.index if m.request == request]
    prompts = trace.header.get("config", {}).get("prompts", [])
    prefill = next((p for p in trace.prefills if p["request"] == request), None)
    t = Text()
    if request < len(prompts):
        t.append(shown(prompts[request][-240:], newline="↵\n"), style="grey50")
    out = [prefill["first_token"]] if prefill else []
    for m in metas[max(0, position - STREAM_STEPS):position]:
        out += m.committed
    if position > STREAM_STEPS:  # a long run shows its recent past; the prompt is long gone by then
        t = Text("… ", style="grey50")
        out = out[1:]
    for tid in out:
        t.append(shown(trace.token_text(tid), "\n", LABEL_LIMIT))
    if position < len(metas) and after(phase, "ACCEPT"):
        m = metas[position]
        correct = m.committed[:max(0, m.accept_len - 1)]
        for tid in correct:
            t.append(shown(trace.token_text(tid), "\n", LABEL_LIMIT),
                     style=f"bold {FATE_COLORS['correct'][1]} on #1b3320")
        if len(m.committed) == m.accept_len:  # the bonus entered (not cut by EOS / the token limit)
            t.append(shown(trace.token_text(m.committed[-1]), "\n", LABEL_LIMIT),
                     style=f"bold {FATE_COLORS['bonus'][1]} on #172a3f")
    return t


def timeline(trace: TraceFile, request: int, position: int, width: int) -> Text:
    """accept_len of each step of the request as a bar, the current step marked."""
    metas = [m for m in trace.index if m.request == request]
    top = max([m.accept_len for m in metas] + [1])
    width = max(10, width)
    start = max(0, min(position - width // 2, len(metas) - width))
    t = Text()
    for k, m in enumerate(metas[start:start + width], start=start):
        bar = BLOCKS[min(len(BLOCKS) - 1, round((m.accept_len / top) * (len(BLOCKS) - 1)))]
        t.append(bar, style="reverse bold yellow" if k == position else "green")
    return t


def adaptive_text(a: dict) -> Text:
    """SGLang's adaptive steps at this step: the tier used, the EMA, and a switch if one fired."""
    t = Text(f"adaptive: this step drafted {a['num_steps']} of tiers {a['tiers']}   EMA of accepted drafts "
             f"{a['ema']:.2f} after {a['batch_count']} batches", style="bold")
    if a["switched_to"] is not None:
        t.append(f"   -> switch to {a['switched_to']} steps from the next step", style="bold magenta")
    return t


def running_metrics(trace: TraceFile, request: int, position: int) -> Text:
    """The request's steps so far: verify count, tokens a step (mean accept_len) beside SGLang's τ
    (completion_tokens / verify_ct, which also counts the prefill's token, so it reads higher on a
    short run), α, the speed-up estimate accept_len / (1 + r) with r = drafting time / verify
    time, and the acceptance rate at each draft position."""
    metas = [m for m in trace.index if m.request == request][:position + 1]
    cfg = trace.header.get("config", {})
    proposed_per_step = max(0, (cfg.get("num_draft_tokens") or 1) - 1)
    steps = len(metas)
    per_step = sum(m.accept_len for m in metas) / steps if steps else 0.0
    tau = (1 + sum(len(m.committed) for m in metas)) / steps if steps else 0.0  # + the prefill's token
    correct = sum(m.accept_len - 1 for m in metas)
    t = Text()
    t.append(f"verify_ct {steps}   accept_len/step {per_step:.2f}   τ {tau:.2f} (completion_tokens/verify_ct)",
             style="bold")
    if not proposed_per_step:
        return t
    t.append(f"\nα {correct / (steps * proposed_per_step):.2f}  ", style="bold")
    draft_ms = sum(m.timing.get("draft", 0) + m.timing.get("extend", 0) for m in metas)
    verify_ms = sum(m.timing.get("verify", 0) for m in metas)
    if verify_ms:
        r = draft_ms / verify_ms
        t.append(f"speed-up ≈ accept_len/(1+r) = {per_step / (1 + r):.2f}", style="bold")  # fits 80 columns
        t.append(f" (r = draft÷verify time = {r:.2f})", style="dim")
    depth = max((m.accept_len for m in metas), default=1) - 1
    rates = [sum(m.accept_len - 1 > k for m in metas) / steps for k in range(max(depth, 0))]
    if rates:
        t.append("\naccepted at position " + " ".join(f"{k + 1}:{r:.2f}" for k, r in enumerate(rates)))
    return t
