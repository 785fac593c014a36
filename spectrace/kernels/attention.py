"""Triton twin of the verify attention: SGLang's `extend_attention_fwd` over the paged KV, with a
tree mask, and the one-query decode form of the same kernel.

Explicit counterpart: `core/model.py: Attention.forward` -> `attend`, which gathers each request's
keys through `req_to_token` and applies its (extend_len, seq_len) mask. SGLang splits the same
keys in two: the prefix, already in the pool, read through `kv_indices[kv_indptr[b]:kv_indptr[b+1]]`
(stage 1), and the new tokens' keys, passed contiguously as `k_extend` (stage 2). The custom mask
is each request's FULL_MASK rows, row-major (extend_len, prefix_len + extend_len), concatenated;
`mask_indptr[b]` is where request b's rows start (kernels/batch.py: `pack_custom_mask` builds
both, and `create_kv_indices` the kv_indices).

One program per (request, KV head, block of new tokens). The query heads that share a KV head are
packed into the block's rows (row r = token r // GROUP, head r % GROUP), as vLLM's unified
attention does, so each K/V tile is loaded once per KV head rather than once per query head.
Interpreted, a program takes every KV head (`kv_heads_per_program`): its rows are all query heads,
its tiles every KV head's keys side by side, and a row sees its own head's columns only.
Softmax is the online (flash) form in float32; with float32 inputs the dot products are IEEE
(no TF32), so the result matches `attend` to rounding.

A small batch gives too few programs to fill the GPU (bs 1 with 8 KV heads: 8 programs on 132 SMs),
so the prefix is split across `num_kv_splits` programs (flash-decoding, SGLang's decode kernel's
kv_splits): each attends to its share of the keys and leaves its unnormalised output with its
row max and sum, and a second kernel merges the splits, rescaling each by exp(m_s - max m).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check
from spectrace.kernels.pdl import launch_options, wait_first

__all__ = ["extend_attention_fwd", "decode_attention_fwd"]


@triton.jit
def _attend_tile(q, k_tile, v_tile, visible, m_i, l_i, acc, sm_scale, logit_cap, IEEE: tl.constexpr):
    """One K/V tile into the running (max, sum, output) of each row: attend's softmax, online."""
    if IEEE:
        qk = tl.dot(q, tl.trans(k_tile), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k_tile))
    qk = qk * sm_scale  # (BLOCK_M, BLOCK_N) float32
    if logit_cap > 0:  # Grok-style soft cap: cap * tanh(qk / cap)
        qk = logit_cap * (2.0 / (1.0 + tl.exp(-2.0 * qk / logit_cap)) - 1.0)
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet stays 0
    p = tl.exp(qk - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p.to(v_tile.dtype), v_tile, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v_tile.dtype), v_tile)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _fwd_kernel(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                paths, stride_pr, stride_pk, path_lens, custom_mask, mask_indptr, mid_o, mid_ml, sm_scale, logit_cap, kv_row_stride,
                stride_qt, stride_qh, stride_kt, stride_kh, stride_bt, stride_bh, stride_ot, stride_oh,
                NUM_HEADS: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_EXTEND: tl.constexpr, USE_CUSTOM_MASK: tl.constexpr,
                SKIP_PREFIX_CUSTOM_MASK: tl.constexpr, IEEE: tl.constexpr, SPLITS: tl.constexpr,
                KV_ROWS: tl.constexpr, QLEN_MASK: tl.constexpr, ROWS_PER_REQ: tl.constexpr, PATH_LEN: tl.constexpr,
                PATH_LENS: tl.constexpr, KV_HEADS: tl.constexpr, PDL: tl.constexpr):
    wait_first(PDL)
    b, kvh = tl.program_id(0), tl.program_id(1) * KV_HEADS  # the program's (first) KV head
    block, split = tl.program_id(2) // SPLITS, tl.program_id(2) % SPLITS
    if HAS_EXTEND:
        qo_start = tl.load(qo_indptr + b)
        extend_len = tl.load(qo_indptr + b + 1) - qo_start
    else:  # a decode: query row b, its own K/V already in the pool
        qo_start = b
        extend_len = 1
    if KV_ROWS:  # the prefix is row req of req_to_token (kv_indices), its first kv_indptr[req] entries
        req = b // ROWS_PER_REQ
        kv_start = req * kv_row_stride
        prefix_len = tl.load(kv_indptr + req)
    else:
        kv_start = tl.load(kv_indptr + b)
        prefix_len = tl.load(kv_indptr + b + 1) - kv_start
    seq_len = prefix_len + extend_len  # the mask row's width: attend's (extend_len, seq_len)
    keys = prefix_len + PATH_LEN  # stage 1's keys: the prefix, then the row's path columns
    if PATH_LENS:  # a decode row's own path length (a verify node's depth)
        keys = prefix_len + tl.load(path_lens + b)

    rows = tl.arange(0, BLOCK_M)
    heads: tl.constexpr = GROUP * KV_HEADS  # query heads a program takes
    tokens_per_block: tl.constexpr = BLOCK_M // heads
    m = block * tokens_per_block + rows // heads  # which new token of the request a row is
    head = kvh * GROUP + rows % heads  # which query head
    row_ok = (rows < tokens_per_block * heads) & (m < extend_len)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_extend + (qo_start + m)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if USE_CUSTOM_MASK:  # this row of the FULL_MASK (extend_len, seq_len), or of the QLEN_ONLY (extend_len, extend_len)
        mask_row = custom_mask + tl.load(mask_indptr + b) + m * (extend_len if QLEN_MASK else seq_len)

    # a tile's columns: BLOCK_N keys of the program's KV head, or of each of its KV_HEADS side by
    # side (key = column % BLOCK_N), a row seeing its own head's only
    cols = tl.arange(0, BLOCK_N * KV_HEADS)
    if KV_HEADS == 1:
        key, col_head = cols, kvh
    else:
        key, col_head = cols % BLOCK_N, (kvh + cols // BLOCK_N)[:, None]
        own_head = (head // GROUP)[:, None] == (kvh + cols // BLOCK_N)[None, :]

    # stage 1, the prefix: keys from the pool through kv_indices (attend's kv.req_to_token[req, :seq_len]);
    # this split's share of it, whole BLOCK_N tiles each
    chunk = tl.cdiv(tl.cdiv(keys, SPLITS), BLOCK_N) * BLOCK_N
    prefix_end = tl.minimum((split + 1) * chunk, keys)
    for start in range(split * chunk, prefix_end, BLOCK_N):
        n = start + key
        n_ok = n < prefix_end
        col = n
        if PATH_LEN > 0:  # past the prefix: column prefix_len + paths[b, n - prefix_len]
            on_path = n_ok & (n >= prefix_len)
            path = paths + req * stride_pr + (b % ROWS_PER_REQ) * stride_pk + n - prefix_len
            col = tl.where(on_path, prefix_len + tl.load(path, mask=on_path, other=0), n)
        slot = tl.load(kv_indices + kv_start + col, mask=n_ok, other=0)
        kv_offs = slot[:, None] * stride_bt + col_head * stride_bh + d[None, :]
        k_tile = tl.load(k_buffer + kv_offs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        v_tile = tl.load(v_buffer + kv_offs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        visible = row_ok[:, None] & n_ok[None, :]
        if KV_HEADS > 1:
            visible = visible & own_head
        if USE_CUSTOM_MASK and not SKIP_PREFIX_CUSTOM_MASK:
            visible = visible & (tl.load(mask_row[:, None] + n[None, :], mask=visible, other=0) != 0)
        m_i, l_i, acc = _attend_tile(q, k_tile, v_tile, visible, m_i, l_i, acc, sm_scale, logit_cap, IEEE)

    # stage 2, the new tokens: keys from k_extend, under the custom mask or causal (the last split's share)
    if HAS_EXTEND and split == SPLITS - 1:
        if USE_CUSTOM_MASK:
            extend_end = extend_len
        else:  # causal: no row of this block sees past its last token
            extend_end = tl.minimum(extend_len, (block + 1) * tokens_per_block)
        for start in range(0, extend_end, BLOCK_N):
            n = start + key
            n_ok = n < extend_end
            kv_offs = (qo_start + n)[:, None] * stride_kt + col_head * stride_kh + d[None, :]
            k_tile = tl.load(k_extend + kv_offs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            v_tile = tl.load(v_extend + kv_offs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            visible = row_ok[:, None] & n_ok[None, :]
            if KV_HEADS > 1:
                visible = visible & own_head
            if USE_CUSTOM_MASK:
                offs = n if QLEN_MASK else prefix_len + n
                visible = visible & (tl.load(mask_row[:, None] + offs[None, :], mask=visible, other=0) != 0)
            else:
                visible = visible & (n[None, :] <= m[:, None])
            m_i, l_i, acc = _attend_tile(q, k_tile, v_tile, visible, m_i, l_i, acc, sm_scale, logit_cap, IEEE)

    if SPLITS == 1:
        out = acc / tl.where(row_ok, l_i, 1.0)[:, None]  # a row that sees no key: 0 / 0, NaN, as in attend
        tl.store(o_extend + (qo_start + m)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out.to(o_extend.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:  # this split's partial result, (token, head, split) rows of mid_o (.., D) and mid_ml (.., 2)
        mid = ((qo_start + m) * NUM_HEADS + head) * SPLITS + split
        tl.store(mid_o + mid[:, None] * D + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(mid_ml + mid * 2, m_i, mask=row_ok)
        tl.store(mid_ml + mid * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _merge_splits_kernel(mid_o, mid_ml, o, stride_ot, stride_oh, NUM_HEADS: tl.constexpr, D: tl.constexpr,
                         SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    wait_first(PDL)
    t, head = tl.program_id(0), tl.program_id(1)  # one (token, head): softmax over all splits' keys at once
    s, d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    mid = (t * NUM_HEADS + head) * SPLITS + s
    m_s = tl.load(mid_ml + mid * 2, mask=s < SPLITS, other=float("-inf"))
    l_s = tl.load(mid_ml + mid * 2 + 1, mask=s < SPLITS, other=0.0)
    acc_s = tl.load(mid_o + mid[:, None] * D + d[None, :], mask=(s < SPLITS)[:, None] & (d < D)[None, :], other=0.0)
    m_max = tl.max(m_s, 0)
    scale = tl.exp(m_s - tl.where(m_max == float("-inf"), 0.0, m_max))  # a split that saw no key: exp(-inf) = 0
    out = tl.sum(acc_s * scale[:, None], 0) / tl.sum(l_s * scale, 0)  # no key anywhere: 0 / 0, NaN, as in attend
    tl.store(o + t * stride_ot + head * stride_oh + d, out.to(o.dtype.element_ty), mask=d < D)


def kv_heads_per_program(device: torch.device, kv_heads: int) -> int:
    """One KV head a program on a GPU, where programs run side by side; every one interpreted,
    where they run one after another and each costs the ops it runs, not the size of its tiles
    (the embedded target's attention: 4 times fewer programs)."""
    return 1 if device.type == "cuda" else kv_heads


def _block_sizes(tokens: int, group: int, kv_heads: int) -> tuple[int, int]:
    """BLOCK_M rows hold whole groups of query heads of the program's kv_heads, enough for the
    request's new tokens (at least 16, tl.dot's smallest tile; at most 64 a KV head); BLOCK_N keys
    per tile."""
    heads = group * kv_heads
    most = max(64 * kv_heads, triton.next_power_of_2(heads))
    block_m = min(max(16, triton.next_power_of_2(heads * max(tokens, 1))), most)
    return block_m, 64


def _sms(device: torch.device) -> int:
    """The device's SMs; 0 on the CPU, where the interpreter gains nothing from splitting."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0


def auto_kv_splits(device: torch.device, programs: int, prefix_tokens: int, bs: int, tile: int = 64) -> int:
    """How many programs share each request's prefix: a power of two, enough for four programs per
    SM, at most 64, each with at least one tile of keys; none for a mean prefix under 256 keys
    (the mean is kv_indices' length / bs, known without a sync), where the merge kernel a split
    needs costs more than it saves. One on the CPU, where the interpreter gains nothing from
    splitting. Its picks at Llama-3.1-8B's shape, against more or fewer splits, are timed in
    docs/benchmarks.md."""
    sms = _sms(device)
    if not sms or not bs or prefix_tokens // bs < 256:
        return 1
    splits = max(1, min(64, triton.cdiv(4 * sms, programs), prefix_tokens // bs // tile))
    return 1 << (splits.bit_length() - 1)


def decode_tile(device: torch.device, programs: int, prefix_tokens: int, bs: int) -> int:
    """Keys per tile where each request has one new token (a decode, plain decoding's extend, a
    draft level): 64, or, where even the splits of 64-key tiles leave SMs without a program, fewer
    (at least 16, tl.dot's smallest) if that lets `auto_kv_splits` make more splits. The query rows
    are few and a split's latency, not its keys, is the time (the tiles against the splits at
    Llama-3.1-8B's shape: docs/benchmarks.md)."""
    sms, splits = _sms(device), auto_kv_splits(device, programs, prefix_tokens, bs)
    if splits == 1 or programs * splits >= sms:
        return 64
    wanted = triton.cdiv(4 * sms, programs)
    tile = max(16, min(64, 1 << (max(1, prefix_tokens // bs // wanted).bit_length() - 1)))
    return tile if auto_kv_splits(device, programs, prefix_tokens, bs, tile) > splits else 64  # none past 64


def _launch(q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
            mask_indptr, max_len_extend, sm_scale, logit_cap, skip_prefix_custom_mask, has_extend, num_kv_splits,
            kv_rows=False, qlen_mask=False, paths=None, path_lens=None):
    bs = qo_indptr.shape[0] - 1 if has_extend else q.shape[0]  # programs along axis 0: requests, or decode rows
    # rows per request: one per request in an extend; a decode over req_to_token rows groups its query rows
    rows_per_req = q.shape[0] // max(kv_indptr.shape[0], 1) if kv_rows and not has_extend else 1
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buffer.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    kv_heads = kv_heads_per_program(q.device, num_kv_heads)
    block_m, block_n = _block_sizes(max_len_extend, group, kv_heads)
    blocks = triton.cdiv(max(max_len_extend, 1), block_m // (group * kv_heads))
    prefix_tokens = bs * kv_indices.shape[1] if kv_rows else kv_indices.numel()  # at most, known without a sync
    if max_len_extend == 1 and not num_kv_splits:  # a fixed split count (decode_rows_batch) keeps 64-key tiles
        block_n = decode_tile(q.device, bs * num_kv_heads, prefix_tokens, bs)
    splits = num_kv_splits or auto_kv_splits(q.device, bs * num_kv_heads * blocks, prefix_tokens, bs, block_n)
    mid_o = mid_ml = kv_indptr  # unused when one split writes o directly
    if splits > 1:
        mid_o = torch.empty(q.shape[0], num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
        mid_ml = torch.empty(q.shape[0], num_heads, splits, 2, dtype=torch.float32, device=q.device)
    use_mask = custom_mask is not None
    block_d = max(16, triton.next_power_of_2(head_dim))
    _fwd_kernel[(bs, num_kv_heads // kv_heads, blocks * splits)](
        q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
        kv_indptr if paths is None else paths, 0 if paths is None else paths.stride(0),
        0 if paths is None else paths.stride(1), kv_indptr if path_lens is None else path_lens,
        custom_mask if use_mask else kv_indptr,
        mask_indptr if use_mask else kv_indptr, mid_o, mid_ml,
        head_dim ** -0.5 if sm_scale is None else sm_scale, logit_cap, kv_indices.stride(0) if kv_rows else 0,
        q.stride(0), q.stride(1), k_extend.stride(0), k_extend.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        o.stride(0), o.stride(1),
        NUM_HEADS=num_heads, D=head_dim, GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        HAS_EXTEND=has_extend, USE_CUSTOM_MASK=use_mask, SKIP_PREFIX_CUSTOM_MASK=skip_prefix_custom_mask,
        IEEE=q.dtype == torch.float32, SPLITS=splits, KV_ROWS=kv_rows, QLEN_MASK=qlen_mask,
        ROWS_PER_REQ=rows_per_req, PATH_LEN=0 if paths is None else paths.shape[-1], PATH_LENS=path_lens is not None,
        KV_HEADS=kv_heads, **launch_options(q))
    if splits > 1 and q.shape[0]:
        _merge_splits_kernel[(q.shape[0], num_heads)](mid_o, mid_ml, o, o.stride(0), o.stride(1), NUM_HEADS=num_heads,
                                                      D=head_dim, SPLITS=splits,
                                                      BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d,
                                                      **launch_options(q))


def _check_attention(q, o, k_buffer, v_buffer, requests: int, kv_indptr, kv_indices, kv_rows=False) -> None:
    device = q.device
    check("q", q, (torch.float32, torch.float16, torch.bfloat16), (None, None, None))
    check("o", o, q.dtype, tuple(q.shape), device)
    check("k_buffer", k_buffer, q.dtype, (None, None, q.shape[2]), device)
    check("v_buffer", v_buffer, q.dtype, tuple(k_buffer.shape), device)
    if kv_rows:  # req_to_token (bs, columns) and each row's prefix length
        check("prefix_lens", kv_indptr, (torch.int32, torch.int64), (requests,), device)
        check("req_to_token", kv_indices, (torch.int32, torch.int64), (requests, None), device)
        return
    check("kv_indptr", kv_indptr, (torch.int32, torch.int64), (requests + 1,), device)
    check("kv_indices", kv_indices, (torch.int32, torch.int64), (None,), device)


def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                         kv_indices, custom_mask, mask_indptr, max_len_extend, sm_scale=None, logit_cap=0.0,
                         skip_prefix_custom_mask=True, num_kv_splits=None, req_to_token=None, prefix_lens=None,
                         qlen_mask=False) -> None:
    """SGLang's verify/extend attention, writing o_extend in place.

    q_extend, o_extend (N, num_heads, head_dim); k_extend, v_extend (N, num_kv_heads, head_dim);
    k_buffer, v_buffer (num_slots, num_kv_heads, head_dim), one layer of the pool; request b's new
    tokens are rows qo_indptr[b]:qo_indptr[b+1] and its prefix slots kv_indices[kv_indptr[b]:kv_indptr[b+1]].
    custom_mask: None for causal, else the packed FULL_MASK rows (bool or uint8) starting at mask_indptr[b].
    skip_prefix_custom_mask: trust the prefix columns to be all visible (verify's case) and not read them.
    num_kv_splits: programs per request's prefix (None: `auto_kv_splits`).

    The fast engine's forms: req_to_token (bs, columns) and prefix_lens (bs,) in place of kv_indptr
    and kv_indices (None): request b's prefix is req_to_token[b, :prefix_lens[b]], read in the kernel,
    so there is no kv_indices to build first. qlen_mask: custom_mask holds only each request's
    (extend_len, extend_len) rows, SGLang's QLEN_ONLY layout (TreeMaskMode.QLEN_ONLY), every prefix
    column visible."""
    kv_rows = req_to_token is not None
    if kv_rows:
        kv_indptr, kv_indices = prefix_lens, req_to_token
    if qlen_mask and not skip_prefix_custom_mask:
        raise ValueError("a QLEN_ONLY mask holds no prefix columns: skip_prefix_custom_mask must be True")
    check("qo_indptr", qo_indptr, (torch.int32, torch.int64), (None,), q_extend.device)
    _check_attention(q_extend, o_extend, k_buffer, v_buffer, qo_indptr.shape[0] - 1, kv_indptr, kv_indices, kv_rows)
    check("k_extend", k_extend, q_extend.dtype, (q_extend.shape[0], k_buffer.shape[1], q_extend.shape[2]),
          q_extend.device)
    check("v_extend", v_extend, q_extend.dtype, tuple(k_extend.shape), q_extend.device)
    if custom_mask is not None:
        check("custom_mask", custom_mask, (torch.bool, torch.uint8), (None,), q_extend.device)
        check("mask_indptr", mask_indptr, (torch.int32, torch.int64), tuple(qo_indptr.shape), q_extend.device)
        custom_mask = custom_mask.view(torch.uint8)
    _launch(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
            custom_mask, mask_indptr, max_len_extend, sm_scale, logit_cap, skip_prefix_custom_mask, True, num_kv_splits,
            kv_rows, qlen_mask)


def decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr=None, kv_indices=None, sm_scale=None, logit_cap=0.0,
                         num_kv_splits=None, req_to_token=None, prefix_lens=None, paths=None, path_lens=None) -> None:
    """One new token per query row, its own K/V already in the pool: every key comes through
    kv_indices (stage 1 of the same kernel, one query row per program). q, o (rows, num_heads, head_dim);
    row r reads the slots kv_indices[kv_indptr[r]:kv_indptr[r+1]].

    The fast engine's form: req_to_token (bs, columns) and prefix_lens (bs,) in place of kv_indptr
    and kv_indices (None), the rows grouped R = rows // bs per request: row r reads its request's
    req_to_token[r // R, :prefix_lens[r // R]] and then, given paths (bs, R, L), the columns
    prefix_lens[r // R] + paths[r // R, r % R, :L] (the draft loop's scratch columns of the row's
    path, fast/batch.py: scratch_batch). Nothing is built per forward. path_lens (bs, R): row r
    reads only the first path_lens[r // R, r % R] of its path's columns (--deterministic's verify,
    every tree node a decode over its prefix, its ancestors and itself: fast/batch.py:
    decode_rows_batch). The keys are one logical sequence, prefix then path, cut into BLOCK_N
    tiles and num_kv_splits shares from its start, so a row reads its keys in the blocks a
    one-token decode over the same keys would."""
    kv_rows = req_to_token is not None
    if kv_rows:
        kv_indptr, kv_indices = prefix_lens, req_to_token
        requests = prefix_lens.shape[0]
        if requests and q.shape[0] % requests:
            raise ValueError(f"{q.shape[0]} query rows do not group over {requests} requests")
        if paths is not None:
            if paths.shape[2] > 1 and paths.stride(2) != 1:
                paths = paths.contiguous()
            check("paths", paths, torch.int64, (requests, q.shape[0] // max(requests, 1), None), q.device, strided=True)
        if path_lens is not None:
            check("path_lens", path_lens, torch.int64, tuple(paths.shape[:2]) if paths is not None else (0,), q.device)
    else:
        requests = q.shape[0]
    _check_attention(q, o, k_buffer, v_buffer, requests, kv_indptr, kv_indices, kv_rows)
    _launch(q, q, q, o, k_buffer, v_buffer, kv_indptr, kv_indptr, kv_indices, None, None, 1, sm_scale, logit_cap,
            True, False, num_kv_splits, kv_rows, paths=paths, path_lens=path_lens)
