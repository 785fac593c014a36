"""Chain rejection sampling, SGLang's `chain_speculative_sampling` (--acceptance rejection, or
--speculative-use-rejection-sampling; the Triton kernel `speculative_sampling_classic_kernel`):
the classic rule of Leviathan et al. and Chen et al.

Each draft d_j was sampled from the draft's q(. | prefix); with the target's p(. | prefix):

    accept d_j  iff  coin_j * q(d_j) < p(d_j)          (accept with probability min(1, p/q))
    first reject -> bonus ~ relu(p - q) / sum           (the residual)
    all accepted -> bonus ~ p after the last draft

which makes every emitted token a sample of p exactly. SGLang allows it only for chains (topk
1) with both thresholds 1.0. The comparison is strict and in float32, as in the kernel, and a NaN
in q counts as 0 in the residual.
"""
from __future__ import annotations

import numpy as np
import torch

from spectrace.core.acceptance import AcceptResult, bonus_from, decision
from spectrace.core.sampling import sample_from_prob

F32 = np.float32


def rejection_walk(candidates, retrive_next_token, retrive_next_sibling, target_predict,
                   target_probs, draft_probs, randoms, max_depth, params) -> AcceptResult:
    """A chain: candidates (n,) root then drafts. Reads target_probs (n, V), draft_probs (n-1, V)
    (the q each draft was sampled from), randoms.coins (coin j-1 for draft j) and coin_final."""
    n = len(candidates)
    path, correct, decisions, row = [0], [], [], 0
    for step in range(1, n):
        tok = candidates[step]
        p, q, coin = (F32(target_probs[row, tok]), F32(draft_probs[row, tok]),
                      F32(randoms.coins[step - 1]))
        ok = coin * q < p
        decisions.append(decision(step, tok, ok, "coin * q < p" if ok else "coin * q >= p",
                                  coin=coin, p=p, q=q))
        if not ok:
            break
        correct.append(tok)
        path.append(step)
        row = step
    all_accepted = len(correct) == n - 1
    dist = target_probs[row]  # every draft accepted: the bonus from p after the last
    if not all_accepted:  # else from the residual after the rejected draft's parent
        dist = torch.relu(target_probs[row] - torch.nan_to_num(draft_probs[row]))
    coin_final = float(randoms.coin_final)
    return AcceptResult(correct, sample_from_prob(dist, coin_final), path, decisions,
                        bonus_from("target" if all_accepted else "residual", row, dist,
                                   params.trace_topk, coin=coin_final))
