"""Chain rejection sampling, SGLang's `chain_speculative_sampling` (--acceptance rejection, or
--speculative-use-rejection-sampling): the classic rule of Leviathan et al. and Chen et al.

Each draft d_j was sampled from the draft's q(. | prefix); with the target's p(. | prefix):

    accept d_j  iff  coin_j * q(d_j) < p(d_j)          (accept with probability min(1, p/q))
    first reject -> bonus ~ relu(p - q) / sum           (the residual)
    all accepted -> bonus ~ p after the last draft

which makes every emitted token a sample of p exactly. SGLang allows it only for chains (topk
1) with both thresholds 1.0. The comparison is strict, as in the kernel.
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance.greedy import AcceptResult
from spectrace.core.sampling import sample_from_prob, topk_pairs


def rejection_walk(candidates: list[int], target_probs: torch.Tensor, draft_probs: torch.Tensor,
                   coins: torch.Tensor, coin_final: float, trace_topk: int = 5) -> AcceptResult:
    """One request's chain. candidates (n,): root then drafts; target_probs (n, V): p after each
    node; draft_probs (n-1, V): the q each draft was sampled from; coins (n-1,)."""
    n = len(candidates)
    path, correct, decisions, row = [0], [], [], 0
    for step in range(1, n):
        tok = candidates[step]
        p, q, coin = float(target_probs[row, tok]), float(draft_probs[row, tok]), float(coins[step - 1])
        ok = coin * q < p
        decisions.append({"node": step, "draft": tok, "accepted": ok, "coin": round(coin, 6), "p": round(p, 6),
                          "q": round(q, 6), "rule": "coin * q < p" if ok else "coin * q >= p"})
        if not ok:
            break
        correct.append(tok)
        path.append(step)
        row = step
    all_accepted = len(correct) == n - 1
    if all_accepted:
        dist = target_probs[row]
    else:
        dist = torch.relu(target_probs[row] - torch.nan_to_num(draft_probs[row]))
    bonus = sample_from_prob(dist, coin_final)
    total = float(dist.sum())
    bonus_from = {"dist": "target" if all_accepted else "residual", "node": row, "coin": round(coin_final, 6),
                  "topk": topk_pairs(dist / max(total, 1e-30), trace_topk)}
    return AcceptResult(correct, bonus, path, decisions, bonus_from)
