"""Triton twins of `spectrace.compat.sglang`: SGLang's tree build and walks, one program per
request, with the same names, argument order and in-place outputs (sgl-kernel's signatures).

Each kernel mirrors an explicit function line for line, with its variable names:

    build_tree_kernel_efficient            core/tree.py: build_tree (all three mask layouts)
    verify_tree_greedy                     core/acceptance/greedy.py: greedy_walk
    tree_speculative_sampling_target_only  core/acceptance/target_only.py: target_only_walk
    chain_speculative_sampling             core/acceptance/rejection.py: rejection_walk

No `.item()` and no host-side cumsum: a request's offset into the FULL_MASK layout is summed
inside its program. A node's parent is found with one vector compare over its request's
selected_index row instead of the explicit loop over it. The walks load their request's tree rows
into registers before walking (`pick`), and the chain walk, whose decisions are all known up front,
finds its first rejection with a min instead of a loop: a walk on the GPU is latency, not bytes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.core.tree import TreeMaskMode
from spectrace.kernels import check
from spectrace.kernels.sampling import sample_bonus, store_bonus_draw

__all__ = ["TreeMaskMode", "build_tree", "build_tree_kernel_efficient", "verify_tree_greedy",
           "tree_speculative_sampling_target_only", "chain_speculative_sampling"]


# ---- build_tree_kernel_efficient -------------------------------------------------------------

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


def build_tree_kernel_efficient(verified_id, parent_list, top_scores_index, draft_tokens, seq_lens,
                                seq_lens_sum, topk, spec_steps, num_verify_tokens,
                                tree_mask_mode=TreeMaskMode.FULL_MASK):
    """-> (tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling,
    draft_tokens), the root (verified_id) prepended to each request's draft tokens."""
    built = build_tree(parent_list, top_scores_index, seq_lens, topk, num_verify_tokens, tree_mask_mode, seq_lens_sum)
    return *built, torch.cat((verified_id.unsqueeze(1), draft_tokens), dim=1).flatten()


# ---- the walks ---------------------------------------------------------------------------------

@triton.jit
def pick(row, i, idx):
    """row[i] of a request's row held in registers (idx = arange over it): Triton has no register
    gather, so a masked sum. The walks read their tree this way: one round of loads before the
    walk instead of a dependent load per node, which left a walk waiting on memory at every level."""
    return tl.sum(tl.where(idx == i, row, 0), axis=0)


@triton.jit
def _verify_tree_greedy_kernel(predicts, accept_index, accept_token_num, candidates, retrive_index,
                               retrive_next_token, retrive_next_sibling, target_predict,
                               n: tl.constexpr, num_spec_step: tl.constexpr, N: tl.constexpr):
    b = tl.program_id(0)  # greedy.py: greedy_walk, one request
    idx = tl.arange(0, N)  # the request's tree rows, in registers (node ids: int32 throughout)
    in_tree = idx < n
    candidates_row = tl.load(candidates + b * n + idx, mask=in_tree, other=-1)
    index_row = tl.load(retrive_index + b * n + idx, mask=in_tree, other=0)
    next_token_row = tl.load(retrive_next_token + b * n + idx, mask=in_tree, other=-1).to(tl.int32)
    next_sibling_row = tl.load(retrive_next_sibling + b * n + idx, mask=in_tree, other=-1).to(tl.int32)
    predict_row = tl.load(target_predict + index_row, mask=in_tree, other=-1)  # the target's argmax after each node

    last = pick(index_row, 0, idx)  # flat row of path[-1], the last accepted node
    parent = 0  # its node
    tl.store(accept_index + b * num_spec_step, last)
    num_accepted = 0
    walking = 1
    for _ in range(num_spec_step - 1):  # `for _ in range(max_depth)`
        if walking:
            target = pick(predict_row, parent, idx)  # the target's argmax after the parent
            cur = pick(next_token_row, parent, idx)
            found = 0
            for _ in range(n - 1):  # its children in sibling order
                if (found == 0) & (cur != -1):
                    if pick(candidates_row, cur, idx) == target:  # draft == argmax(p)
                        tl.store(predicts + last, target)
                        last = pick(index_row, cur, idx)
                        num_accepted += 1
                        tl.store(accept_index + b * num_spec_step + num_accepted, last)
                        parent = cur
                        found = 1
                    else:
                        cur = pick(next_sibling_row, cur, idx)
            walking = found
    tl.store(accept_token_num + b, num_accepted)
    tl.store(predicts + last, pick(predict_row, parent, idx))  # the bonus


def _check_walk(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index,
                accept_token_num):
    bs, n = candidates.shape
    device = candidates.device
    for name, t in (("candidates", candidates), ("retrive_index", retrive_index),
                    ("retrive_next_token", retrive_next_token), ("retrive_next_sibling", retrive_next_sibling)):
        check(name, t, torch.int64, (bs, n), device)
    check("predicts", predicts, (torch.int32, torch.int64), (bs * n,), device)
    check("accept_index", accept_index, (torch.int32, torch.int64), device=device)
    check("accept_token_num", accept_token_num, (torch.int32, torch.int64), (bs,), device)
    return bs, n


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """In place, as compat.sglang.verify_tree_greedy. target_predict (bs, n) or (bs*n,)."""
    bs, n = _check_walk(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts,
                        accept_index, accept_token_num)
    check("target_predict", target_predict.view(-1), torch.int64, (bs * n,), candidates.device)
    if bs:
        _verify_tree_greedy_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, target_predict,
                                          n=n, num_spec_step=accept_index.shape[1], N=triton.next_power_of_2(n))


@triton.jit
def _target_only_kernel(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                        retrive_next_sibling, uniform_samples, target_probs, draft_probs, bonus_draw, threshold_single,
                        threshold_acc, vocab_size, n: tl.constexpr, num_spec_step: tl.constexpr, N: tl.constexpr):
    b = tl.program_id(0)  # target_only.py: target_only_walk, one request
    idx = tl.arange(0, N)  # the request's tree rows and coins, in registers (see pick)
    in_tree = idx < n
    candidates_row = tl.load(candidates + b * n + idx, mask=in_tree, other=-1)
    index_row = tl.load(retrive_index + b * n + idx, mask=in_tree, other=0)
    next_token_row = tl.load(retrive_next_token + b * n + idx, mask=in_tree, other=-1).to(tl.int32)
    next_sibling_row = tl.load(retrive_next_sibling + b * n + idx, mask=in_tree, other=-1).to(tl.int32)
    coins_row = tl.load(uniform_samples + b * n + idx, mask=in_tree, other=0.0)

    last = pick(index_row, 0, idx)
    tl.store(accept_index + b * num_spec_step, last)
    row = 0  # the node whose p the level reads
    prob_acc = 0.0
    coin = pick(coins_row, 0, idx)
    num_accepted = 0
    walking = 1
    for _ in range(num_spec_step - 1):
        if walking:
            cur = pick(next_token_row, row, idx)
            p_row = target_probs + (b * n + row).to(tl.int64) * vocab_size
            found = 0
            for _ in range(n - 1):
                if (found == 0) & (cur != -1):
                    tok = pick(candidates_row, cur, idx)
                    p = tl.load(p_row + tok)  # the one load a node costs: p of its token after its parent
                    prob_acc += p
                    if (coin <= prob_acc / threshold_acc) | (p >= threshold_single):
                        tl.store(predicts + last, tok)
                        last = pick(index_row, cur, idx)
                        num_accepted += 1
                        tl.store(accept_index + b * num_spec_step + num_accepted, last)
                        row = cur
                        prob_acc = 0.0
                        coin = pick(coins_row, cur, idx)
                        found = 1
                    else:  # its mass leaves the residual
                        tl.store(draft_probs + (b * n + row).to(tl.int64) * vocab_size + tok, p)
                        cur = pick(next_sibling_row, cur, idx)
            walking = found
    tl.store(accept_token_num + b, num_accepted)
    full_depth = num_accepted == num_spec_step - 1  # then the bonus comes from p itself, else relu(p - q)
    offset = (b * n + row).to(tl.int64) * vocab_size
    store_bonus_draw(bonus_draw, b, last, offset, offset, 1 - full_depth.to(tl.int32))


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single=1.0, threshold_acc=1.0, deterministic=True) -> None:
    """In place, as compat.sglang's (draft_probs written as the kernel writes it). target_probs,
    draft_probs (bs, n, V) float32; uniform_samples (bs, n) and the final coins (bs,) float32."""
    bs, n = _check_walk(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts,
                        accept_index, accept_token_num)
    device = candidates.device
    check("target_probs", target_probs, torch.float32, (bs, n, None), device)
    check("draft_probs", draft_probs, torch.float32, tuple(target_probs.shape), device)
    check("uniform_samples", uniform_samples, torch.float32, (bs, n), device)
    check("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, torch.float32, (bs,), device)
    if bs:
        vocab_size = target_probs.shape[-1]
        bonus_draw = torch.empty(bs, 4, dtype=torch.int64, device=device)
        _target_only_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index,
                                   retrive_next_token, retrive_next_sibling, uniform_samples, target_probs,
                                   draft_probs, bonus_draw, float(threshold_single),
                                   max(float(threshold_acc), 1e-9), vocab_size, n=n,
                                   num_spec_step=accept_index.shape[1], N=triton.next_power_of_2(n))
        sample_bonus(bonus_draw, target_probs, draft_probs, uniform_samples_for_final_sampling, predicts)


@triton.jit
def _chain_kernel(predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
                  target_probs, draft_probs, bonus_draw, vocab_size, n: tl.constexpr, N: tl.constexpr):
    b = tl.program_id(0)  # rejection.py: rejection_walk, one request's chain
    # A chain's node `step` follows node step - 1, so every decision's inputs are known before the
    # walk: all of them are loaded at once, and the walk's loop (stop at the first rejection) is a min.
    step = tl.arange(0, N) + 1  # the draft positions 1 .. n-1
    drafted = step < n
    row = (step - 1).to(tl.int64)  # the parent whose p and q judge the draft
    tok = tl.load(candidates + b * n + step, mask=drafted, other=0)
    p = tl.load(target_probs + (b * n + row) * vocab_size + tok, mask=drafted, other=0.0)
    q = tl.load(draft_probs + (b * (n - 1) + row) * vocab_size + tok, mask=drafted, other=0.0)
    coin = tl.load(uniform_samples + b * n + step - 1, mask=drafted, other=0.0)
    rejected = drafted & ~(coin * q < p)  # `if coin * q < p: accept, else stop` (a NaN q rejects)
    num_accepted = tl.min(tl.where(rejected, step - 1, n - 1), axis=0)

    path = tl.load(retrive_index + b * n + step - 1, mask=step - 1 <= num_accepted, other=0)  # rows 0 .. accepted
    tl.store(accept_index + b * n + step - 1, path, mask=step - 1 <= num_accepted)
    tl.store(predicts + path, tok, mask=step - 1 < num_accepted)  # each accepted draft at its parent's row
    tl.store(accept_token_num + b, num_accepted)
    last = tl.load(retrive_index + b * n + num_accepted)
    all_accepted = num_accepted == n - 1  # then the bonus comes from p after the last draft
    # all accepted: row n-1 of draft_probs does not exist, and subtract 0 masks every read of it
    store_bonus_draw(bonus_draw, b, last, (b * n + num_accepted).to(tl.int64) * vocab_size,
                     (b * (n - 1) + num_accepted).to(tl.int64) * vocab_size, 1 - all_accepted.to(tl.int32))


def chain_speculative_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
                               uniform_samples_for_final_sampling, target_probs, draft_probs) -> None:
    """In place, as compat.sglang.chain_speculative_sampling. Chains of n nodes: target_probs
    (bs, n, V), draft_probs (bs, n-1, V) (row n-1 is never read), uniform_samples (bs, n)."""
    bs, n = candidates.shape
    device = candidates.device
    check("candidates", candidates, torch.int64, (bs, n), device)
    check("retrive_index", retrive_index, torch.int64, (bs, n), device)
    check("predicts", predicts, (torch.int32, torch.int64), (bs * n,), device)
    check("accept_index", accept_index, (torch.int32, torch.int64), (bs, n), device)
    check("accept_token_num", accept_token_num, (torch.int32, torch.int64), (bs,), device)
    check("target_probs", target_probs, torch.float32, (bs, n, None), device)
    check("draft_probs", draft_probs, torch.float32, (bs, n - 1, target_probs.shape[-1]), device)
    check("uniform_samples", uniform_samples, torch.float32, (bs, n), device)
    check("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, torch.float32, (bs,), device)
    if bs:
        vocab_size = target_probs.shape[-1]
        bonus_draw = torch.empty(bs, 4, dtype=torch.int64, device=device)
        _chain_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
                             target_probs, draft_probs, bonus_draw, vocab_size, n=n, N=triton.next_power_of_2(n))
        sample_bonus(bonus_draw, target_probs, draft_probs, uniform_samples_for_final_sampling, predicts)
