"""SGLang's tree sampling rule, `tree_speculative_sampling_target_only` (--acceptance target_only).

Drafts come from a deterministic top-k tree, so the rule looks at the target alone. At each
level one coin is drawn (the coin of the last accepted node); the children are tried in sibling
order and the target mass of the tried ones accumulates:

    accept child x  iff  coin <= prob_acc / threshold_acc   or   p(x) >= threshold_single
    reject          ->   draft_probs[row][x] = p(x)   (its mass leaves the residual)

With both thresholds 1.0 this is an inverse-CDF draw over the siblings' target probabilities:
child x is taken with probability exactly p(x), and when none is, the bonus comes from
relu(p - draft_probs) = p without the rejected siblings: lossless. Thresholds below 1 accept
more often than p says, which biases the output (tests measure how much). At full depth the
bonus comes from p itself (the kernel's "no draft probs at full depth").
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance.greedy import AcceptResult
from spectrace.core.sampling import sample_from_prob, topk_pairs


def target_only_walk(candidates: list[int], next_token: list[int], next_sibling: list[int],
                     target_probs: torch.Tensor, coins: torch.Tensor, coin_final: float, max_depth: int,
                     threshold_single: float = 1.0, threshold_acc: float = 1.0,
                     draft_probs: torch.Tensor | None = None, trace_topk: int = 5) -> AcceptResult:
    """One request. target_probs (n, V): p after each node; coins (n,): the coin of each node's
    level (coins[node] decides among node's children); draft_probs (n, V), zeros if None, is
    written as in the kernel. max_depth: the deepest accepted level (num_spec_step - 1)."""
    threshold_acc = max(threshold_acc, 1e-9)  # the host wrapper's clamp
    if draft_probs is None:
        draft_probs = torch.zeros_like(target_probs)
    path, correct, decisions = [0], [], []
    row, prob_acc, coin = 0, 0.0, float(coins[0])
    for _ in range(max_depth):
        cur = next_token[row]
        while cur != -1:
            tok = candidates[cur]
            p = float(target_probs[row, tok])
            prob_acc += p
            by_acc, by_single = coin <= prob_acc / threshold_acc, p >= threshold_single
            ok = by_acc or by_single
            decisions.append({
                "node": cur, "draft": tok, "accepted": ok, "coin": round(coin, 6), "p": round(p, 6),
                "prob_acc": round(prob_acc, 6), "threshold_single": threshold_single, "threshold_acc": threshold_acc,
                "rule": ("coin <= prob_acc / threshold_acc" if by_acc else "p >= threshold_single") if ok else
                        "coin > prob_acc / threshold_acc and p < threshold_single"})
            if ok:
                path.append(cur)
                correct.append(tok)
                row, prob_acc, coin = cur, 0.0, float(coins[cur])
                break
            draft_probs[row, tok] = target_probs[row, tok]
            cur = next_sibling[cur]
        if cur == -1:
            break
    full_depth = len(correct) == max_depth
    residual = target_probs[row] if full_depth else torch.relu(target_probs[row] - draft_probs[row])
    bonus = sample_from_prob(residual, coin_final)
    total = float(residual.sum())
    bonus_from = {"dist": "target" if full_depth or total == float(target_probs[row].sum()) else "residual",
                  "node": row, "coin": round(coin_final, 6),
                  "topk": topk_pairs(residual / max(total, 1e-30), trace_topk)}
    return AcceptResult(correct, bonus, path, decisions, bonus_from)


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single=1.0, threshold_acc=1.0, deterministic=True) -> None:
    """SGLang's batched form, in place (predicts, accept_index, accept_token_num, draft_probs).
    target_probs/draft_probs (bs, n, V); uniform_samples (bs, n); the final coins (bs,)."""
    bs, n = candidates.shape
    for b in range(bs):
        rows = retrive_index[b].tolist()
        res = target_only_walk(candidates[b].tolist(), retrive_next_token[b].tolist(),
                               retrive_next_sibling[b].tolist(), target_probs[b], uniform_samples[b],
                               float(uniform_samples_for_final_sampling[b]), accept_index.shape[1] - 1,
                               threshold_single, threshold_acc, draft_probs[b])
        for k, node in enumerate(res.accept_nodes):
            accept_index[b, k] = rows[node]
            predicts[rows[node]] = res.accept_tokens[k]
        accept_token_num[b] = len(res.correct_drafts)
