"""Triton twins of core/tree.py, one program per request: build_tree, the same arguments and
outputs (all three mask layouts), and organize_draft_results over the draft loop's packed
candidates (kernels/draft_level.py: DraftBuffers). SGLang's entry point with the root prepended,
build_tree_kernel_efficient, is spectrace/compat/triton.py's.

No `.item()` and no host-side cumsum: a request's offset into the FULL_MASK layout is summed inside
its program. A node's parent is found with one vector compare over its request's selected_index
row instead of the explicit loop over it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.core.tree import TreeMaskMode
from spectrace.kernels import check

__all__ = ["build_tree", "organize_draft_results"]


@triton.jit
def _parent_position(selected_index_row, parents_row, sel, i, topk, n: tl.constexpr, BLOCK: tl.constexpr):
    """tree.py: _parent_position. sel (BLOCK,) is the request's selected_index row, -1 past n-1."""
    parent_tb_idx = tl.load(selected_index_row + i) // topk  # the row of parent_list it was expanded from
    token_idx = tl.load(parents_row + parent_tb_idx, mask=parent_tb_idx > 0, other=-1)  # the parent's flat index
    lanes = tl.arange(0, BLOCK)
    found = tl.min(tl.where(sel == token_idx, lanes, n - 1), axis=0)  # the first selected_index equal to it
    return tl.where(parent_tb_idx == 0, 0, found + 1)  # n: not among the nodes


@triton.jit
def _build_tree_kernel(parent_list, selected_index, seq_lens, tree_mask, positions, retrive_index,
                       retrive_next_token, retrive_next_sibling, topk, parents_width,
                       n: tl.constexpr, MODE: tl.constexpr, BLOCK: tl.constexpr, BS_BLOCK: tl.constexpr):
    b = tl.program_id(0)  # one program per request (tree.py: `for b in range(bs)`)
    lanes = tl.arange(0, BLOCK)
    selected_index_row, parents_row = selected_index + b * (n - 1), parent_list + b * parents_width
    sel = tl.load(selected_index_row + lanes, mask=lanes < n - 1, other=-1)
    seq_len = tl.load(seq_lens + b)
    # linked lists: children pushed to the front, scanning nodes downward
    for k in range(1, n):
        i = n - k
        tl.store(retrive_index + b * n + i, b * n + i)
        parent_position = _parent_position(selected_index_row, parents_row, sel, i - 1, topk, n, BLOCK)
        if parent_position < n:  # else SGLang drops the node ("invalid eagle tree")
            head = tl.load(retrive_next_token + b * n + parent_position)
            if head != -1:
                tl.store(retrive_next_sibling + b * n + i, head)
            tl.store(retrive_next_token + b * n + parent_position, i)
    tl.store(retrive_index + b * n, b * n)
    # each row sees the root and, below, its own ancestors and itself; position = prefix + depth
    bs_lanes = tl.arange(0, BS_BLOCK)
    prefix_before = tl.sum(tl.load(seq_lens + bs_lanes, mask=bs_lanes < b, other=0), axis=0)  # sum(seq_lens[:b])
    for tid in range(n):
        row = lanes == 0
        depth = 0
        cur_position = tid - 1
        walking = tid > 0
        for _ in range(n - 1):
            if walking:
                depth += 1
                row = row | (lanes == cur_position + 1)
                parent_position = _parent_position(selected_index_row, parents_row, sel, cur_position, topk, n, BLOCK)
                walking = (parent_position > 0) & (parent_position < n)  # the root, or a dropped node
                cur_position = parent_position - 1
        tl.store(positions + b * n + tid, seq_len + depth)
        if MODE == 0:  # FULL_MASK: prefix columns stay True (the wrapper's fill)
            start = prefix_before * n + b * n * n + tid * (seq_len + n) + seq_len
            tl.store(tree_mask + start + lanes, row, mask=lanes < n)
        elif MODE == 1:  # QLEN_ONLY
            tl.store(tree_mask + b * n * n + tid * n + lanes, row, mask=lanes < n)
        else:  # QLEN_ONLY_BITPACKING: bit j = node j
            tl.store(tree_mask + b * n + tid, tl.sum(tl.where(row & (lanes < n), 1 << lanes, 0), axis=0))


def build_tree(parent_list, top_scores_index, seq_lens, topk: int, num_verify_tokens: int,
               tree_mask_mode=TreeMaskMode.FULL_MASK, seq_lens_sum: int | None = None):
    """core/tree.py: build_tree, one program per request: -> (tree_mask, positions, retrive_index,
    retrive_next_token, retrive_next_sibling). seq_lens: (bs,) int64, or a list of ints;
    seq_lens_sum: their sum, which sizes the FULL_MASK buffer (given, it spares a device sync)."""
    bs, n, device = top_scores_index.shape[0], num_verify_tokens, top_scores_index.device
    mode = TreeMaskMode(tree_mask_mode)
    if not torch.is_tensor(seq_lens):
        seq_lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)
    check("top_scores_index", top_scores_index, torch.int64, (bs, n - 1))
    check("parent_list", parent_list, torch.int64, device=device)
    check("seq_lens", seq_lens, torch.int64, (bs,), device)
    if mode == TreeMaskMode.FULL_MASK:
        total = int(seq_lens.sum()) if seq_lens_sum is None else seq_lens_sum
        tree_mask = torch.ones(total * n + n * n * bs, dtype=torch.bool, device=device)
    elif mode == TreeMaskMode.QLEN_ONLY:
        tree_mask = torch.ones(n * n * bs, dtype=torch.bool, device=device)
    else:
        if n > 32:
            raise ValueError(f"QLEN_ONLY_BITPACKING holds at most 32 tree nodes, not {n}")
        tree_mask = torch.zeros(n * bs, dtype=[torch.uint8, torch.int16, torch.int32][(n > 8) + (n > 16)],
                                device=device)
    positions = torch.empty(bs * n, dtype=torch.int64, device=device)
    retrive_index, retrive_next_token, retrive_next_sibling = torch.full((3, bs, n), -1, dtype=torch.int64,
                                                                         device=device)
    if bs:
        _build_tree_kernel[(bs,)](parent_list, top_scores_index, seq_lens, tree_mask, positions, retrive_index,
                                  retrive_next_token, retrive_next_sibling, topk, parent_list.shape[1], n=n,
                                  MODE=int(mode), BLOCK=triton.next_power_of_2(n),
                                  BS_BLOCK=triton.next_power_of_2(bs))
    return tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling


@triton.jit
def _organize_kernel(scores, tokens, roots, top_scores_index, draft_tokens, C, n: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK_C)
    x = tl.load(scores + b * C + j, mask=j < C, other=float("-inf"))
    kept = j < 0
    prev_v = float("inf")
    prev_j = -1
    for _ in tl.static_range(n - 1):  # the best remaining candidate in (score desc, index asc) order: a stable sort's
        after = (j < C) & ((x < prev_v) | ((x == prev_v) & (j > prev_j)))
        prev_v = tl.max(tl.where(after, x, float("-inf")), axis=0)
        prev_j = tl.min(tl.where(after & (x == prev_v), j, 2147483647), axis=0)
        kept = kept | (j == prev_j)
    slot = tl.cumsum(kept.to(tl.int32), axis=0) - 1  # by candidate index
    tl.store(top_scores_index + b * (n - 1) + slot, j.to(tl.int64), mask=kept)
    tl.store(draft_tokens + b * n + 1 + slot, tl.load(tokens + b * C + j, mask=kept), mask=kept)
    tl.store(draft_tokens + b * n, tl.load(roots + b))


def organize_draft_results(scores: torch.Tensor, tokens: torch.Tensor, roots: torch.Tensor, num_draft_token: int):
    """core/tree.py: organize_draft_results over candidates already packed (scores, tokens (bs, C)
    in flat candidate order): the n-1 best path scores, ties to the lower candidate index, re-sorted
    by candidate index. -> (top_scores_index (bs, n-1), draft_tokens (bs, n), the root first)."""
    bs, C = scores.shape
    n, device = num_draft_token, scores.device
    check("scores", scores, torch.float32, (bs, C))
    check("tokens", tokens, torch.int64, (bs, C), device)
    check("roots", roots, torch.int64, (bs,), device)
    if not 1 <= n - 1 <= C:
        raise ValueError(f"{n - 1} draft tokens cannot be chosen from {C} candidates")
    top_scores_index = torch.empty(bs, n - 1, dtype=torch.int64, device=device)
    draft_tokens = torch.empty(bs, n, dtype=torch.int64, device=device)
    if bs:
        _organize_kernel[(bs,)](scores, tokens, roots, top_scores_index, draft_tokens, C, n=n,
                                BLOCK_C=triton.next_power_of_2(C))
    return top_scores_index, draft_tokens
