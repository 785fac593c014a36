"""Lossless sampling on trees with topk > 1 (--acceptance tree_rejection): recursive rejection
sampling over siblings drawn without replacement (Jeon et al. 2024, "Recursive Speculative
Decoding"), the multi-draft form of SpecInfer's rule. SGLang's engine refuses rejection
sampling on trees; this rule lifts that.

The drafter samples the tree (tree.draft_tree with generators): the children x_1, x_2, ... of a
node are draws without replacement from the draft's q after the node, in draw order. At the
current node, with p the target's distribution after it:

    p' = p, q' = q
    for each child x in draw order:   accept x  iff  coin * q'(x) < p'(x)   (prob. min(1, p'/q'))
                                      else  p' = relu(p' - q') / sum         (the residual)
                                            q'(x) = 0;  q' = q' / sum        (x cannot be drawn again)
    no child accepted -> bonus ~ p';  a leaf or full depth -> bonus ~ p after it

Each try is the chain rule of rejection.py against (p', q'), the distribution the next draw
really came from, so every emitted token is a sample of p. With one child this is chain
rejection sampling; each further sibling is one more chance before the residual.

The tree's shape. A sampled tree cannot be ranked by its draws' q as EAGLE-2 ranks top-k
trees: keeping a node for what it drew selects on the draw and biases the output. What a
node's j-th draw is worth is instead measured on the request's earlier steps (`SiblingStats`):
r_j = P(the j-th draw is accepted | the earlier ones were rejected), and the j-th draw is
on the accepted path with probability a_j = r_j * prod_{i<j} (1 - r_i). A node's path score
is the product of a over its path: the expected number of accepted drafts is the sum of those
scores, so the draft loop's top n-1 by path score is the best tree under that estimate
(Sequoia's acceptance vector, measured online rather than offline).

What the seed simplifies: EAGLE's own sampling path (SafeAILab `evaluate_posterior`) keeps
the top-k tree and tries each sibling with q = 1 (accept iff coin <= p'(x), then p'(x) = 0).
That is lossless too, but a level accepts with only the target's mass on the draft's top k,
which at temperature 1 loses to a chain sampled from q (τ 1.76 against 1.99 on our models).
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance.greedy import AcceptResult
from spectrace.core.sampling import sample_from_prob, topk_pairs
from spectrace.core.tree import children


def tree_rejection_walk(candidates: list[int], next_token: list[int], next_sibling: list[int],
                        target_probs: torch.Tensor, draft_probs: torch.Tensor, gen: torch.Generator,
                        max_depth: int, trace_topk: int = 5) -> AcceptResult:
    """One request. target_probs (n, V): p after each node; draft_probs (n-1, V): the q node j+1
    was drawn from (its parent's). Coins come from the request's generator, one per try, then
    one for the bonus."""
    def coin() -> float:
        return float(torch.rand((), generator=gen, dtype=torch.float64))

    path, correct, decisions = [0], [], []
    row, rejected = 0, False
    p = target_probs[0].double()
    for _ in range(max_depth):
        cur = next_token[row]
        q = draft_probs[cur - 1].double() if cur != -1 else None
        while cur != -1:
            tok = candidates[cur]
            px, qx = float(p[tok]), float(q[tok])
            if qx == 0.0:  # not a draw (the path's q had fewer than topk tokens): nothing more to try
                cur = -1
                break
            u = coin()
            ok = u * qx < px
            decisions.append({"node": cur, "draft": tok, "accepted": ok, "coin": round(u, 6), "p": round(px, 6),
                              "q": round(qx, 6), "rule": "coin * q'(x) < p'(x)" if ok else
                              "coin * q'(x) >= p'(x): p' = relu(p' - q'), q'(x) = 0"})
            if ok:
                break
            rejected = True
            residual = torch.relu(p - q)
            if residual.sum() > 0:  # zero only when p' == q', where no draw is rejected
                p = residual / residual.sum()
            q = q.clone()
            q[tok] = 0.0
            if q.sum() == 0:
                cur = -1
                break
            q = q / q.sum()
            cur = next_sibling[cur]
        if cur == -1:
            break
        path.append(cur)
        correct.append(candidates[cur])
        row, rejected = cur, False
        p = target_probs[row].double()
    u = coin()
    bonus = sample_from_prob(p, u)
    bonus_from = {"dist": "residual" if rejected else "target", "node": row, "coin": round(u, 6),
                  "topk": topk_pairs(p.float(), trace_topk)}
    return AcceptResult(correct, bonus, path, decisions, bonus_from)


class SiblingStats:
    """One request's acceptance by sibling rank, over its earlier steps, with a prior of one
    acceptance in two tries per rank (so the first tree is a balanced guess)."""

    def __init__(self, topk: int):
        self.tried = torch.full((topk,), 2.0, dtype=torch.float64)
        self.accepted = torch.ones(topk, dtype=torch.float64)

    def observe(self, decisions: list[dict], next_token: list[int], next_sibling: list[int]) -> None:
        rank = {c: j for node in range(len(next_token))  # node -> its index among its parent's children
                for j, c in enumerate(children(node, next_token, next_sibling))}
        for d in decisions:
            self.tried[rank[d["node"]]] += 1
            self.accepted[rank[d["node"]]] += d["accepted"]

    def worth(self) -> torch.Tensor:
        """(K,) a_j = r_j * prod_{i<j} (1 - r_i), made non-increasing (a later draw is only
        tried after the earlier ones)."""
        r = self.accepted / self.tried
        reach = torch.cumprod(torch.cat([torch.ones(1, dtype=r.dtype), 1 - r[:-1]]), 0)
        return torch.cummin(r * reach, 0).values.float()
