"""Top-k of rows by one int64 key a candidate (SGLang's `fast_topk` in spirit): the recording's top
tokens of p, and the draft loop's children (kernels/draft_level.py).

A value and its index travel as one key: the fp32 bits made monotone in the high half, the
inverted index in the low half, so a pick is one max, ties to the lower index as torch.topk's
stable order. A row of V columns is cut into chunks read by many programs at once
(`chunk_top_k`): each keeps its chunk's top k and, over logits, the softmax's max and sum there;
a second kernel merges a row's chunks. softmax(x) is then computed for the k picks only, from the
row's max and sum, which are reduced in another order than torch.softmax's: a value can differ
from torch's in the last bit (and two values equal to rounding in p keep the logits' order).

    top_k_softmax   (rows, V) logits -> the top k of softmax(logits): values, indices; the max and
                    sum too, for p at any other token; and p at given tokens, in the same kernels
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check
from spectrace.kernels.pdl import launch_options, wait_first

NO_KEY = tl.constexpr(-9223372036854775807)  # below every key: a pick already taken, a masked lane


@triton.jit
def order_key(x, j):
    """(value, index) as one int64 ordered by value, then by lower index: the largest key is the
    largest value at the lowest index (fp32 bits made monotone; -0.0 counted as +0.0)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - j).to(tl.int64)


@triton.jit
def key_value(key):
    ordered = (key >> 32).to(tl.int32)
    return tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def key_index(key):
    return 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)


@triton.jit
def _chunk_top_k_kernel(src, keys_out, m_out, s_out, V, NCH, K: tl.constexpr, CH: tl.constexpr,
                        PROBS: tl.constexpr, PDL: tl.constexpr):
    """One chunk of CH columns of one row of src: its top K as keys, and (logits) the softmax's
    max and sum over the chunk."""
    wait_first(PDL)
    r = tl.program_id(0)
    ch = tl.program_id(1)
    j = ch * CH + tl.arange(0, CH)
    x = tl.load(src + r * V + j, mask=j < V, other=float("-inf")).to(tl.float32)
    key = order_key(x, j)
    for p in tl.static_range(K):
        best = tl.max(key, axis=0)
        tl.store(keys_out + (r * NCH + ch) * K + p, best)
        key = tl.where(key == best, NO_KEY, key)
    if not PROBS:
        m = tl.max(x, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        tl.store(m_out + r * NCH + ch, m)
        tl.store(s_out + r * NCH + ch, tl.sum(tl.exp(x - m_safe), axis=0))


def chunk_top_k(src: torch.Tensor, k: int, probs: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (rows, V) logits (probs: already a distribution) -> each chunk's top k keys (rows, NCH, k)
    and the softmax's max and sum over it (rows, NCH); about 8 chunks a row on a GPU, more past
    16 K columns; chunks of up to 4,096 columns interpreted."""
    rows, V = src.shape
    CH = min(2048, max(64, triton.next_power_of_2(triton.cdiv(V, 8))))
    if not src.is_cuda:  # interpreted: few, wide programs (the interpreter's cost is per program)
        CH = max(CH, min(4096, triton.next_power_of_2(V)))
    NCH = triton.cdiv(V, CH)
    keys = torch.empty(rows, NCH, k, dtype=torch.int64, device=src.device)
    m, s = (torch.empty(rows, NCH, dtype=torch.float32, device=src.device) for _ in range(2))
    if rows:
        _chunk_top_k_kernel[(rows, NCH)](src, keys, m, s, V, NCH, K=k, CH=CH, PROBS=probs, **launch_options(src))
    return keys, m, s


@triton.jit
def _merge_top_k_kernel(keys, part_m, part_s, values_out, indices_out, m_out, s_out, logits, at, p_at, V, NCH,
                        K: tl.constexpr, NB: tl.constexpr, AT: tl.constexpr, BLOCK_AT: tl.constexpr,
                        GROUP_ROWS: tl.constexpr, PDL: tl.constexpr):
    wait_first(PDL)
    r = tl.program_id(0)
    n = tl.arange(0, NB)
    row_keys = tl.load(keys + r * NCH * K + n, mask=n < NCH * K, other=NO_KEY)
    m_c = tl.load(part_m + r * NCH + n, mask=n < NCH, other=float("-inf"))
    s_c = tl.load(part_s + r * NCH + n, mask=n < NCH, other=0.0)
    m = tl.max(m_c, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_c * tl.exp(m_c - m_safe), axis=0)
    for p in tl.static_range(K):
        best = tl.max(row_keys, axis=0)
        row_keys = tl.where(row_keys == best, NO_KEY, row_keys)
        tl.store(values_out + r * K + p, tl.exp(key_value(best) - m_safe) / s)
        tl.store(indices_out + r * K + p, key_index(best).to(tl.int64))
    tl.store(m_out + r, m_safe)
    tl.store(s_out + r, s)
    if AT > 0:  # p at the row's group's tokens: exp(logit - max) / sum
        a = tl.arange(0, BLOCK_AT)
        tokens = tl.load(at + (r // GROUP_ROWS) * AT + a, mask=a < AT, other=0)
        x = tl.load(logits + r.to(tl.int64) * V + tokens, mask=a < AT, other=0.0).to(tl.float32)
        tl.store(p_at + r * AT + a, tl.exp(x - m_safe) / s, mask=a < AT)


def top_k_softmax(logits: torch.Tensor, k: int, at: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """logits (rows, V) -> (values, indices) (rows, k) of the top k of softmax(logits.float()) in
    descending order, and the row's max and sum (rows,): p at token t is exp(logits[t] - max) / sum.
    at (groups, A) token ids, each group's shared by rows // groups consecutive rows (a tree's nodes
    share its drafts): p at them, (rows, A) (no at: (rows, 0))."""
    check("logits", logits, (torch.float32, torch.float16, torch.bfloat16), (None, None), logits.device)
    rows, V = logits.shape
    if not 0 <= k <= V:
        raise ValueError(f"top {k} of {V} columns")
    if at is not None:
        check("at", at, torch.int64, (None, None), logits.device)
        if at.shape[0] == 0 or rows % at.shape[0]:
            raise ValueError(f"{rows} rows do not group over {at.shape[0]} rows of tokens")
        at = at.contiguous()
    keys, part_m, part_s = chunk_top_k(logits, k, False)
    values = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
    indices = torch.empty(rows, k, dtype=torch.int64, device=logits.device)
    m, s = torch.empty(2, rows, dtype=torch.float32, device=logits.device)
    width = 0 if at is None else at.shape[1]
    p_at = torch.empty(rows, width, dtype=torch.float32, device=logits.device)
    if rows:
        nch = keys.shape[1]
        _merge_top_k_kernel[(rows,)](keys, part_m, part_s, values, indices, m, s, logits, p_at if at is None else at,
                                     p_at, V, nch, K=k, NB=triton.next_power_of_2(max(nch * k, nch)), AT=width,
                                     BLOCK_AT=triton.next_power_of_2(max(width, 1)),
                                     GROUP_ROWS=rows // at.shape[0] if at is not None else 1,
                                     **launch_options(logits))
    return values, indices, m, s, p_at
