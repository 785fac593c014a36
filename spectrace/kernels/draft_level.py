"""EAGLE's draft loop between two draft forwards as two Triton launches per level: the draft's
softmax over each kept path's logits, its top-K children (SGLang's `fast_topk`), their path scores
and the K best of the K*K (`select_top_k_tokens`), written where organize_draft_results reads them
(one packed row per request, DraftBuffers), and what the next level reads (its input ids, the
hidden rows it continues from, each kept path's scratch columns).

Explicit counterpart: core/drafters/eagle_worker.py: draft_forward's `probs` -> `propose_children`
-> core/tree.py: `select_top_k_tokens` and the torch.cat of organize_draft_results' lists, and
fast/drafters/eagle_worker.py's path bookkeeping; there they are about sixteen kernels a level.
Greedy drafts only: q is the draft's softmax at T = 1, and the children are its top K, not draws.

    chunk_top_k            grid (rows, chunks): each chunk's top K and its softmax max and sum
                           (kernels/top_k.py)
    _select_level_kernel   grid (bs,): each row's top K from its chunks', q, path scores, the K best

Split so a row's V columns are read by many programs at once, where one program a request would
read the whole row K + 1 times, one after another. A value and its index travel as one int64 key
(kernels/top_k.py): ties go to the lower index, as torch.topk's stable order, and q can differ
from the explicit softmax in the last bit; which nodes a tree keeps can then differ only where
two path scores tie to rounding, and greedy verification keeps the output lossless.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from spectrace.kernels import check
from spectrace.kernels.top_k import NO_KEY, chunk_top_k, key_index, key_value, order_key

__all__ = ["DraftBuffers", "select_level"]


@triton.jit
def _select_level_kernel(part_keys, part_m, part_s, token_map, scores, paths, hidden, score_buf, token_buf, parent_buf,
                         scores_out, input_ids_out, hidden_out, paths_out, stride_pb, stride_pk, V, H, NCH, level,
                         num_steps, cand_off, C, P, trace_q, trace_ids, K: tl.constexpr, KT: tl.constexpr,
                         KB: tl.constexpr, NB: tl.constexpr, R: tl.constexpr, FIRST: tl.constexpr, PROBS: tl.constexpr,
                         TOKEN_MAP: tl.constexpr, HAS_HIDDEN: tl.constexpr, TRACE: tl.constexpr, BLOCK_H: tl.constexpr,
                         LEVEL_B: tl.constexpr):
    b = tl.program_id(0)
    k = tl.arange(0, KB)  # rows of src per request: R, the root's (level 0) or the K kept paths'
    k_ok = k < R
    # each row's top KT (its K children, then the trace's), from its chunks' top KT (n = chunk * KT + pick)
    n = tl.arange(0, NB)[None, :]
    n_ok = k_ok[:, None] & (n < NCH * KT)
    keys = tl.load(part_keys + (b * R + k)[:, None] * (NCH * KT) + n, mask=n_ok, other=NO_KEY)
    m = tl.zeros((KB,), tl.float32)  # src already holding q: m = 0, s = 1
    s = tl.full((KB,), 1.0, tl.float32)
    if not PROBS:  # the softmax's max and sum over the row, from its chunks'
        ch_ok = k_ok[:, None] & (n < NCH)
        m_c = tl.load(part_m + (b * R + k)[:, None] * NCH + n, mask=ch_ok, other=float("-inf"))
        s_c = tl.load(part_s + (b * R + k)[:, None] * NCH + n, mask=ch_ok, other=0.0)
        m = tl.max(m_c, axis=1)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(s_c * tl.exp(m_c - m_safe[:, None]), axis=1)
    # child c of path k at [k, c]: (KB, KB) tokens and q
    c = tl.arange(0, KB)[None, :]
    top_i = tl.zeros((KB, KB), tl.int32)
    top_q = tl.zeros((KB, KB), tl.float32)
    for p in tl.static_range(KT):
        best = tl.max(keys, axis=1)
        keys = tl.where(keys == best[:, None], NO_KEY, keys)
        v = key_value(best)
        q = v if PROBS else tl.exp(v - m) / s
        if p < K:
            top_i = tl.where(c == p, key_index(best)[:, None], top_i)
            top_q = tl.where(c == p, q[:, None], top_q)
        if TRACE:  # what the trace keeps of the row's q: its top KT, as target token ids
            i = key_index(best)
            if TOKEN_MAP:
                i = tl.load(token_map + i, mask=k_ok & (i < V), other=0)
            tl.store(trace_q + (b * R + k) * KT + p, q, mask=k_ok)
            tl.store(trace_ids + (b * R + k) * KT + p, i.to(tl.int64), mask=k_ok)
    if TOKEN_MAP:  # column j of src is the head's own token j, target token token_map[j] (EAGLE-3)
        top_t = tl.load(token_map + top_i, mask=k_ok[:, None] & (c < K) & (top_i < V), other=0)
    else:
        top_t = top_i.to(tl.int64)
    # path scores of the R*K children, candidate e = k * K + c, stored at cand_off + e; the K best
    if FIRST:
        prev_scores = tl.where(k == 0, 1.0, 0.0)  # the root's path score
        tl.store(parent_buf + b * P, -1)  # parent_list[0]: the root has none
    else:
        prev_scores = tl.load(scores + b * K + k, mask=k_ok, other=0.0)
    expand = prev_scores[:, None] * top_q  # (KB, KB)
    ok = k_ok[:, None] & (c < K)
    e = tl.where(ok, k[:, None] * K + c, 2147483647)
    cand = tl.where(ok, expand, float("-inf"))
    tl.store(score_buf + b * C + cand_off + e, expand, mask=ok)
    tl.store(token_buf + b * C + cand_off + e, top_t, mask=ok)
    key = tl.where(ok, order_key(cand, e), NO_KEY)
    steps = num_steps - 1  # scratch columns per path
    lanes = tl.arange(0, LEVEL_B)
    for p in tl.static_range(K):
        best = tl.max(tl.max(key, axis=1), axis=0)
        key = tl.where(key == best, NO_KEY, key)
        sel_v, sel_e = key_value(best), key_index(best)
        beam = sel_e // K
        tl.store(scores_out + b * K + p, sel_v)
        tl.store(parent_buf + b * P + 1 + level * K + p, (sel_e + cand_off).to(tl.int64))
        token = tl.sum(tl.sum(tl.where(e == sel_e, top_t, 0), axis=1), axis=0)
        tl.store(input_ids_out + b * K + p, token)
        if HAS_HIDDEN:  # the kept path continues from its beam's hidden row
            for start in range(0, H, BLOCK_H):
                h = start + tl.arange(0, BLOCK_H)
                x = tl.load(hidden + (b * R + beam) * H + h, mask=h < H)
                tl.store(hidden_out + (b * K + p) * H + h, x, mask=h < H)
        # kept path p extends path `beam`: its columns, then its own (p * steps + level)
        old = tl.load(paths + b * stride_pb + beam * stride_pk + lanes, mask=lanes < level, other=0)
        new = tl.where(lanes < level, old, p * steps + level)
        tl.store(paths_out + (b * K + p) * (level + 1) + lanes, new, mask=lanes <= level)


@dataclass
class DraftBuffers:
    """Every candidate one step's draft loop scores, in SGLang's flat candidate order (level 0's K,
    then K*K a level; core/drafters/eagle_worker.py: level_tensors): path scores and tokens
    (bs, K + (S-1)K*K), and parent_list (bs, 1 + S*K): -1 for the root, then each level's K kept
    paths' flat candidate indices (organize_draft_results reads the first 1 + (S-1)K)."""

    scores: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor

    @classmethod
    def empty(cls, bs: int, topk: int, num_steps: int, device) -> DraftBuffers:
        C = topk + (num_steps - 1) * topk * topk
        return cls(torch.empty(bs, C, device=device), torch.empty(bs, C, dtype=torch.int64, device=device),
                   torch.empty(bs, 1 + num_steps * topk, dtype=torch.int64, device=device))


def select_level(src: torch.Tensor, scores: torch.Tensor | None, paths: torch.Tensor | None,
                 hidden: torch.Tensor | None, level: int, num_steps: int, buffers: DraftBuffers, probs: bool = False,
                 token_map: torch.Tensor | None = None, trace_top: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Level `level` of the draft loop for greedy drafts. src: the draft's logits (or, probs=True,
    its q) after each kept path, (bs*K, V), or after each root at level 0, (bs, V); scores (bs, K)
    the kept paths' path scores and paths (bs, K, level) their scratch columns (None at level 0);
    hidden: the rows the draft forward returned, one per row of src (None: a draft LM); token_map
    (V,): the target token of each column of src, where the draft has a vocabulary of its own
    (EAGLE-3's hot_token_id: its softmax over those columns is the target-vocabulary softmax with
    every other token at -inf); None: columns are token ids. trace_top: (q (bs*R, KT), ids (bs*R,
    KT)) to fill with each row's top KT >= K of q and their target token ids (a recording run).
    Writes the level's candidates into `buffers`; returns the kept scores (bs, K), the next input
    ids (bs*K,), the hidden rows they continue from (bs*K, H) or None, and the kept paths'
    scratch columns (bs, K, level + 1), each path's own last (p * (num_steps - 1) + level)."""
    bs, C = buffers.scores.shape
    K = (buffers.parents.shape[1] - 1) // num_steps
    R = 1 if level == 0 else K
    V, device = src.shape[1], src.device
    check("src", src, (torch.float32, torch.float16, torch.bfloat16), (bs * R, None), device)
    if level:
        check("scores", scores, torch.float32, (bs, K), device)
        check("paths", paths, torch.int64, (bs, K, level), device, strided=True)
        if level > 1 and paths.stride(2) != 1:
            paths = paths.contiguous()
    if hidden is not None:
        check("hidden", hidden, None, (bs * R, None), device)
    if token_map is not None:
        check("token_map", token_map, torch.int64, (V,), device)
    scores_out = torch.empty(bs, K, dtype=torch.float32, device=device)
    input_ids = torch.empty(bs * K, dtype=torch.int64, device=device)
    hidden_out = torch.empty(bs * K, hidden.shape[1], dtype=hidden.dtype, device=device) if hidden is not None else None
    paths_out = torch.empty(bs, K, level + 1, dtype=torch.int64, device=device)
    if bs:
        KB = triton.next_power_of_2(K)
        H = hidden.shape[1] if hidden is not None else 0
        KT = trace_top[0].shape[1] if trace_top is not None else K
        part_keys, part_m, part_s = chunk_top_k(src, KT, probs)
        NCH = part_keys.shape[1]
        placeholder = buffers.parents  # for the pointers a level does not read
        _select_level_kernel[(bs,)](
            part_keys, part_m, part_s, token_map if token_map is not None else placeholder,
            scores if level else placeholder, paths if level else placeholder,
            hidden if hidden is not None else placeholder, buffers.scores, buffers.tokens, buffers.parents,
            scores_out, input_ids, hidden_out if hidden is not None else placeholder, paths_out,
            paths.stride(0) if level else 0, paths.stride(1) if level else 0, V, H, NCH, level, num_steps,
            0 if level == 0 else K + (level - 1) * K * K, C, buffers.parents.shape[1],
            *(trace_top if trace_top is not None else (placeholder, placeholder)),
            K=K, KT=KT, KB=KB, NB=triton.next_power_of_2(NCH * KT), R=R, FIRST=level == 0, PROBS=probs,
            TOKEN_MAP=token_map is not None, HAS_HIDDEN=hidden is not None, TRACE=trace_top is not None,
            BLOCK_H=min(1024, triton.next_power_of_2(max(H, 1))), LEVEL_B=triton.next_power_of_2(level + 1))
    return scores_out, input_ids, hidden_out, paths_out
