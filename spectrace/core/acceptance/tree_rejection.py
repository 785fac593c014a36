"""Lossless sampling on trees with topk > 1 (--acceptance tree_rejection): EAGLE's own sampling
path (SafeAILab `evaluate_posterior`), multi-draft speculative sampling as in SpecInfer.

SGLang's engine refuses rejection sampling on trees; this rule lifts that. The tree's siblings
are the draft's top-k, a deterministic set, so each is proposed with q = 1 (EAGLE issues #93,
#221). At the current node, with p the target's distribution after it:

    for each child x in sibling order:   accept x  iff  coin <= p(x)     (a fresh coin each)
                                         else p(x) = 0;  p = p / sum(p)  (rejected mass removed)
    no child accepted -> bonus ~ p (what is left); a leaf or full depth -> bonus ~ p after it

P(x_1) = p(x_1); P(x_2) = (1 - p(x_1)) * p(x_2) / (1 - p(x_1)) = p(x_2); and so on, and the
bonus takes the remaining mass: every emitted token is a sample of the target. Unlike
target_only, each try draws its own coin and renormalises (the two are equally lossless).
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance.greedy import AcceptResult
from spectrace.core.sampling import sample_from_prob, topk_pairs


def tree_rejection_walk(candidates: list[int], next_token: list[int], next_sibling: list[int],
                        target_probs: torch.Tensor, gen: torch.Generator, max_depth: int,
                        trace_topk: int = 5) -> AcceptResult:
    """One request; coins come from the request's generator, one per try, then one for the bonus."""
    def coin() -> float:
        return float(torch.rand((), generator=gen, dtype=torch.float64))

    path, correct, decisions = [0], [], []
    row = 0
    p = target_probs[0].double().clone()
    for _ in range(max_depth):
        cur = next_token[row]
        while cur != -1:
            tok = candidates[cur]
            u, px = coin(), float(p[tok])
            ok = u <= px
            decisions.append({"node": cur, "draft": tok, "accepted": ok, "coin": round(u, 6), "p": round(px, 6),
                              "q": 1.0, "rule": "coin <= p'(x)" if ok else "coin > p'(x): p'(x) = 0, renormalise"})
            if ok:
                break
            p[tok] = 0.0
            p = p / p.sum()
            cur = next_sibling[cur]
        if cur == -1:
            break
        path.append(cur)
        correct.append(candidates[cur])
        row = cur
        p = target_probs[row].double().clone()
    bonus = sample_from_prob(p, coin())
    rejected_some = any(not d["accepted"] for d in decisions if d["node"] in _children(row, next_token, next_sibling))
    bonus_from = {"dist": "residual" if rejected_some else "target", "node": row,
                  "topk": topk_pairs(p.float(), trace_topk)}
    return AcceptResult(correct, bonus, path, decisions, bonus_from)


def _children(node: int, next_token: list[int], next_sibling: list[int]) -> set[int]:
    out, cur = set(), next_token[node]
    while cur != -1:
        out.add(cur)
        cur = next_sibling[cur]
    return out
