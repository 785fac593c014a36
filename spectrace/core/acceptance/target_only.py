"""SGLang's tree sampling rule, `tree_speculative_sampling_target_only` (--acceptance target_only),
from sgl-kernel's `speculative_sampling.cuh`.

Drafts come from a deterministic top-k tree, so the rule looks at the target alone. At each
level one coin is used (the coin of the last accepted node); the children are tried in sibling
order and the target mass of the tried ones accumulates:

    accept child x  iff  coin <= prob_acc / threshold_acc   or   p(x) >= threshold_single
    reject          ->   draft_probs[row][x] = p(x)   (its mass leaves the residual)

With both thresholds 1.0 this is an inverse-CDF draw over the siblings' target probabilities:
child x is taken with probability exactly p(x), and when none is, the bonus comes from
relu(p - draft_probs) = p without the rejected siblings: lossless. Thresholds below 1 accept
more often than p says, which biases the output (tests measure how much). At full depth the
bonus comes from p itself (the kernel's "no draft probs at full depth").

The arithmetic is the kernel's, in float32: prob_acc accumulates float32 probabilities, and
`prob_acc / threshold_acc` is a float32 division.
"""
from __future__ import annotations

import numpy as np
import torch

from spectrace.core.acceptance import AcceptResult, bonus_from, decision
from spectrace.core.sampling import sample_from_prob

F32 = np.float32


def target_only_walk(candidates, retrive_next_token, retrive_next_sibling, target_predict,
                     target_probs, draft_probs, randoms, max_depth, params) -> AcceptResult:
    """Reads target_probs (n, V) and randoms.coins (n,): coins[node] decides among node's
    children; randoms.coin_final draws the bonus. draft_probs: the kernel's (n, V) buffer, written
    in place as the kernel writes it (zeros when None; a drafter's q is not read)."""
    threshold_acc = F32(max(params.threshold_acc, 1e-9))  # the host wrapper's clamp
    threshold_single = F32(params.threshold_single)
    if draft_probs is None:  # what SGLang's callers pass: zeros_like(target_probs)
        draft_probs = torch.zeros_like(target_probs)
    path, correct, decisions = [0], [], []
    row, prob_acc, coin = 0, F32(0), F32(randoms.coins[0])
    for _ in range(max_depth):
        cur = retrive_next_token[row]
        while cur != -1:
            tok = candidates[cur]
            p = F32(target_probs[row, tok])
            prob_acc += p
            by_acc, by_single = coin <= prob_acc / threshold_acc, p >= threshold_single
            ok = by_acc or by_single
            decisions.append(decision(
                cur, tok, ok,
                ("coin <= prob_acc / threshold_acc" if by_acc else "p >= threshold_single") if ok
                else "coin > prob_acc / threshold_acc and p < threshold_single", coin=coin, p=p,
                prob_acc=prob_acc, threshold_single=threshold_single, threshold_acc=threshold_acc))
            if ok:
                path.append(cur)
                correct.append(tok)
                row, prob_acc, coin = cur, F32(0), F32(randoms.coins[cur])
                break
            draft_probs[row, tok] = target_probs[row, tok]
            cur = retrive_next_sibling[cur]
        if cur == -1:
            break
    full_depth = len(correct) == max_depth
    residual = target_probs[row] if full_depth else torch.relu(target_probs[row] - draft_probs[row])
    coin_final = float(randoms.coin_final)
    untouched = full_depth or bool(torch.equal(residual, target_probs[row]))
    return AcceptResult(correct, sample_from_prob(residual, coin_final), path, decisions,
                        bonus_from("target" if untouched else "residual", row, residual,
                                   params.trace_topk, coin=coin_final))
