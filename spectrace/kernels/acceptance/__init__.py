"""Triton twins of core/acceptance/: each rule's walk over every request's tree, one program per
request, file for file and named as the explicit walk it mirrors:

    greedy.py          greedy_walk          (SGLang's verify_tree_greedy)
    target_only.py     target_only_walk     (tree_speculative_sampling_target_only)
    rejection.py       rejection_walk       (chain_speculative_sampling)
    vllm.py            vllm_walk, recovered_tokens, expand_batch_to_tokens (vLLM's rejection sampler)
    tree_rejection.py  tree_rejection_walk  (the recursive rejection walk over sampled trees)

The SGLang-shaped walks keep sgl-kernel's signatures and in-place outputs: rows are flat
(request b's node j is row retrive_index[b, j]), `predicts[row]` is the token after an accepted
row (the bonus after the last), accept_index (bs, num_spec_step) the accepted rows, root first,
-1 after, accept_token_num the correct drafts. The peers' names are spectrace/compat/triton.py's.
The walks load their request's tree rows into registers before walking (`pick`): a walk on the
GPU is latency, not bytes. Their bonus is drawn after them by kernels/sampling.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check


@triton.jit
def pick(row, i, idx):
    """row[i] of a request's row held in registers (idx = arange over it): Triton has no register
    gather, so a masked sum. The walks read their tree this way: one round of loads before the
    walk instead of a dependent load per node, which left a walk waiting on memory at every level."""
    return tl.sum(tl.where(idx == i, row, 0), axis=0)


def check_walk(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index,
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
