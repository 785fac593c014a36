"""One level of EAGLE's draft loop as one Triton program per request: the draft's softmax over each
kept path's logits, its top-K children (SGLang's `fast_topk`), their path scores and the K best of
the K*K (`select_top_k_tokens`), and what the next level reads (its input ids, the rows of the
hidden states it continues from, each kept path's scratch columns).

Explicit counterpart: core/drafters/eagle_worker.py: draft_forward's `probs` -> `propose_children`
-> core/tree.py: `select_top_k_tokens` (level i >= 1, greedy drafts), and fast/drafters/
eagle_worker.py's path bookkeeping; there they are about sixteen kernels a level. Greedy drafts
only: q is the draft's softmax at T = 1, and the children are its top K, not draws.

The top K of a row of V logits are found in K passes over the row, each taking the largest value
after the previous pick in (value descending, index ascending) order, so the row never has to fit
in one tile. q = softmax(logits) is computed for the K picks only, from the row's max and sum
(an online pass first). Its sum is reduced in another order than torch's softmax, so q and the path
scores can differ from the explicit ones in the last bit; which nodes a tree keeps can then differ
only where two path scores tie to rounding, and greedy verification keeps the output lossless.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check

__all__ = ["select_level"]


@triton.jit
def _next_pick(x, j, prev_v, prev_i):
    """Per row, the largest x after (prev_v, prev_i) in (value desc, index asc) order: (value, index)."""
    after = (x < prev_v[:, None]) | ((x == prev_v[:, None]) & (j > prev_i[:, None]))
    xm = tl.where(after, x, float("-inf"))
    best = tl.max(xm, axis=1)
    idx = tl.min(tl.where(after & (xm == best[:, None]), j, 2147483647), axis=1)
    return best, idx


@triton.jit
def _select_level_kernel(logits, scores, paths, score_out, token_out, parent_out, scores_out, input_ids_out,
                         rows_out, paths_out, stride_pb, stride_pk, V, level, num_steps, K: tl.constexpr, KB: tl.constexpr, BLOCK_V: tl.constexpr,
                         LEVEL_B: tl.constexpr):
    b = tl.program_id(0)
    k = tl.arange(0, KB)  # the request's K kept paths, one row of logits each
    k_ok = k < K
    row = logits + (b * K + k)[:, None] * V
    # the softmax's max and sum over each row, online
    m = tl.full((KB,), float("-inf"), tl.float32)
    s = tl.zeros((KB,), tl.float32)
    for start in range(0, V, BLOCK_V):
        j = start + tl.arange(0, BLOCK_V)[None, :]
        x = tl.load(row + j, mask=k_ok[:, None] & (j < V), other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
        m = m_new
    # the top K of each row, one pass each: (KB, KB) tokens and q, child c of path k at [k, c]
    c = tl.arange(0, KB)[None, :]
    top_i = tl.zeros((KB, KB), tl.int32)
    top_q = tl.zeros((KB, KB), tl.float32)
    prev_v = tl.full((KB,), float("inf"), tl.float32)
    prev_i = tl.full((KB,), -1, tl.int32)
    for p in tl.static_range(K):
        best_v = tl.full((KB,), float("-inf"), tl.float32)
        best_i = tl.full((KB,), 2147483647, tl.int32)
        for start in range(0, V, BLOCK_V):
            j = start + tl.arange(0, BLOCK_V)[None, :]
            x = tl.load(row + j, mask=k_ok[:, None] & (j < V), other=float("-inf"))
            v, i = _next_pick(x, j, prev_v, prev_i)
            better = (v > best_v) | ((v == best_v) & (i < best_i))
            best_v, best_i = tl.where(better, v, best_v), tl.where(better, i, best_i)
        top_i = tl.where(c == p, best_i[:, None], top_i)
        top_q = tl.where(c == p, (tl.exp(best_v - m) / s)[:, None], top_q)
        prev_v, prev_i = best_v, best_i
    # path scores of the K*K children, candidate e = k * K + c, and the K best of them
    prev_scores = tl.load(scores + b * K + k, mask=k_ok, other=0.0)
    expand = prev_scores[:, None] * top_q  # (KB, KB)
    ok = k_ok[:, None] & (c < K)
    e = tl.where(ok, k[:, None] * K + c, 2147483647)
    cand = tl.where(ok, expand, float("-inf"))
    tl.store(score_out + b * K * K + e, expand, mask=ok)
    tl.store(token_out + b * K * K + e, top_i.to(tl.int64), mask=ok)
    sel_v = float("inf")
    sel_e = -1
    steps = num_steps - 1  # scratch columns per path
    lanes = tl.arange(0, LEVEL_B)
    for p in tl.static_range(K):
        after = (cand < sel_v) | ((cand == sel_v) & (e > sel_e))
        xm = tl.where(after & ok, cand, float("-inf"))
        sel_v = tl.max(tl.max(xm, axis=1), axis=0)
        sel_e = tl.min(tl.min(tl.where(after & ok & (xm == sel_v), e, 2147483647), axis=1), axis=0)
        beam = sel_e // K
        tl.store(scores_out + b * K + p, sel_v)
        tl.store(parent_out + b * K + p, (sel_e + K * K * (level - 1) + K).to(tl.int64))
        token = tl.sum(tl.sum(tl.where(e == sel_e, top_i, 0), axis=1), axis=0)
        tl.store(input_ids_out + b * K + p, token.to(tl.int64))
        tl.store(rows_out + b * K + p, (b * K + beam).to(tl.int64))
        # kept path p extends path `beam`: its columns, then its own (p * steps + level)
        old = tl.load(paths + b * stride_pb + beam * stride_pk + lanes, mask=lanes < level, other=0)
        new = tl.where(lanes < level, old, p * steps + level)
        tl.store(paths_out + (b * K + p) * (level + 1) + lanes, new, mask=lanes <= level)


def select_level(logits: torch.Tensor, scores: torch.Tensor, paths: torch.Tensor, level: int, num_steps: int):
    """Level `level` >= 1 of the draft loop for greedy drafts. logits (bs*K, V) float32: the draft's
    after each kept path; scores (bs, K) their path scores; paths (bs, K, level) their scratch
    columns. Returns SGLang's tree_info for the level (path scores (bs, K, K), tokens (bs, K*K),
    the kept paths' flat candidate indices (bs, K)), the kept scores (bs, K), the next input ids
    (bs*K,), the rows of the hidden states they continue from (bs*K,), and the kept paths' scratch
    columns (bs, K, level + 1), each path's own last (p * (num_steps - 1) + level)."""
    bs, K = scores.shape
    V = logits.shape[1]
    device = logits.device
    check("logits", logits, torch.float32, (bs * K, None), device)
    check("scores", scores, torch.float32, (bs, K), device)
    check("paths", paths, torch.int64, (bs, K, level), device, strided=True)
    score_out = torch.empty(bs, K, K, dtype=torch.float32, device=device)
    token_out = torch.empty(bs, K * K, dtype=torch.int64, device=device)
    parent_out, input_ids, rows = torch.empty(3, bs * K, dtype=torch.int64, device=device)
    scores_out = torch.empty(bs, K, dtype=torch.float32, device=device)
    paths_out = torch.empty(bs, K, level + 1, dtype=torch.int64, device=device)
    if bs:
        KB = triton.next_power_of_2(K)
        if level > 1 and paths.stride(2) != 1:
            paths = paths.contiguous()
        _select_level_kernel[(bs,)](logits.contiguous(), scores.contiguous(), paths, score_out, token_out, parent_out,
                                    scores_out, input_ids, rows, paths_out, paths.stride(0), paths.stride(1), V, level,
                                    num_steps, K=K, KB=KB,
                                    BLOCK_V=min(triton.next_power_of_2(V), max(256, 8192 // KB)),
                                    LEVEL_B=triton.next_power_of_2(level + 1))
    return (score_out, token_out, parent_out.view(bs, K)), scores_out, input_ids, rows, paths_out
