"""One step's draft tree as a viewer shows it: the TUI and the Graphviz renderer both draw this.

Node 0 is the root (the last committed token, whose target KV the verify pass writes), nodes
1..n-1 are the drafts in tree order, and one more node is the bonus token, hung under the last
node of the accepted path. Each node carries its fate in the acceptance walk:
    root       the last committed token
    correct    a draft on the accepted path (its token is committed)
    rejected   a draft the walk tried against the target and refused
    unreached  a draft the walk never got to (an ancestor or an earlier sibling decided first)
    bonus      the target's own token after the last correct draft (accept_len = correct + 1)
No torch here: replay reads traces without a model.
"""
from __future__ import annotations

from dataclasses import dataclass

FATES = ("root", "correct", "rejected", "unreached", "bonus")


@dataclass
class ViewNode:
    index: int  # 0 = root, 1..n-1 drafts, n = bonus
    token: int
    text: str
    parent: int | None  # node index; None for the root
    depth: int
    fate: str
    q: float | None  # draft probability given the parent
    score: float | None  # path score: product of q from the root
    p: float | None  # target probability of this token after its parent
    row: int | None  # verify row whose logits scored this node's children (None for the bonus)


def target_prob(rec: dict, row: int, token: int) -> float | None:
    """Target probability of `token` at verify row `row`, if the trace kept it (top-k)."""
    for t, p in rec["verify"]["target_topk"][row]:
        if t == token:
            return p
    return None


def step_tree(rec: dict, token_text) -> list[ViewNode]:
    """The nodes of one step record, root first, bonus last."""
    draft = rec.get("draft")
    verify = rec["verify"]
    root_token = verify["tokens"][0]
    nodes = [ViewNode(0, root_token, token_text(root_token), None, 0, "root", None, None, None, 0)]
    if draft is not None:
        for j, tok in enumerate(draft["tokens"], start=1):
            nodes.append(ViewNode(
                index=j, token=tok, text=token_text(tok), parent=draft["parents"][j - 1],
                depth=draft["depths"][j - 1], fate=draft["fates"][j - 1], q=draft["q"][j - 1],
                score=draft["scores"][j - 1], p=verify["p_draft"][j - 1], row=j))
    last = rec["accept"]["accept_nodes"][-1]
    bonus = rec["bonus_token"]
    nodes.append(ViewNode(len(nodes), bonus, token_text(bonus), last, nodes[last].depth + 1, "bonus",
                          None, None, target_prob(rec, last, bonus), None))
    return nodes


@dataclass
class Candidate:
    """A candidate the EAGLE draft loop scored that the tree did not keep: organize_draft_results
    keeps the n-1 best path scores of all levels. Viewers show these faded while drafting."""
    index: int  # flat candidate index (level 0's K, then K*K per level)
    token: int
    text: str
    depth: int  # as a node's: 1 = a child of the root
    q: float
    score: float  # path score: what the cut compared
    parent_node: int | None  # the tree node it hangs under; None when its parent was dropped too
    parent_candidate: int  # the parent's flat candidate index, -1 for the root


def dropped_candidates(rec: dict, token_text) -> list[Candidate]:
    """The dropped candidates of a step, parents before children (empty for drafters without the
    draft loop, and for traces recorded before candidates were)."""
    c = (rec.get("draft") or {}).get("candidates")
    if not c:
        return []
    out = []
    for i, node in enumerate(c["nodes"]):
        if node != -1:
            continue
        par = c["parents"][i]
        parent_node = 0 if par == -1 else (c["nodes"][par] if c["nodes"][par] != -1 else None)
        out.append(Candidate(i, c["tokens"][i], token_text(c["tokens"][i]), c["levels"][i] + 1, c["q"][i],
                             c["scores"][i], parent_node, par))
    return out


def children(nodes: list[ViewNode]) -> dict[int, list[int]]:
    """Children of each node in node order (sibling order of the walk)."""
    out: dict[int, list[int]] = {n.index: [] for n in nodes}
    for n in nodes:
        if n.parent is not None:
            out[n.parent].append(n.index)
    return out


def preorder(nodes: list[ViewNode]) -> list[int]:
    """Node indices depth first, siblings in node order: the order a tree view lists them."""
    kids, out, stack = children(nodes), [], [0]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(reversed(kids[i]))
    return out
