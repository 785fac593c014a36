"""SGLang's speculative-decoding tree functions with its names, argument order and in-place
outputs, on CPU tensors (sgl-kernel `eagle_utils.cu`, `speculative_sampling.cuh`, `ngram_utils.cu`
and their Python wrappers in `sglang.srt.speculative.eagle_utils`; the Triton attention of
`sglang.srt.layers.attention.triton_ops`). Thin adapters over `spectrace.core`: the batched forms
loop the per-request walks of `spectrace.core.acceptance` and `core.model.attend`.

Outputs follow the kernels: rows are flat, request b's node j is row retrive_index[b, j]
(= b * n + j); `predicts[row]` is the token that follows an accepted row (the bonus after the
last); `accept_index` (bs, num_spec_step) lists the accepted rows, root first, -1 padded; and
`accept_token_num` counts the correct drafts, without the bonus (spectrace's accept_len - 1).
sgl-kernel's wrappers spell the linked lists `retrive_*` (the kernels' `retrieve_*`); pass them
by position.
"""
from __future__ import annotations

import torch

from spectrace.core import tree
from spectrace.core.acceptance import AcceptResult, Randoms, RuleParams
from spectrace.core.acceptance.greedy import greedy_walk
from spectrace.core.acceptance.rejection import rejection_walk
from spectrace.core.acceptance.target_only import target_only_walk
from spectrace.core.model import attend
from spectrace.core.tree import TreeMaskMode, organize_draft_results

__all__ = ["TreeMaskMode", "organize_draft_results", "build_tree_kernel_efficient", "verify_tree_greedy",
           "tree_speculative_sampling_target_only", "chain_speculative_sampling", "reconstruct_indices_from_tree_mask",
           "extend_attention_fwd", "decode_attention_fwd"]


def build_tree_kernel_efficient(verified_id, parent_list, top_scores_index, draft_tokens, seq_lens,
                                seq_lens_sum, topk, spec_steps, num_verify_tokens,
                                tree_mask_mode=TreeMaskMode.FULL_MASK):
    """-> (tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling,
    draft_tokens) with the root (verified_id) prepended to each request's draft tokens."""
    draft_tokens = torch.cat((verified_id.unsqueeze(1), draft_tokens), dim=1).flatten()
    mask, positions, ri, rnt, rns = tree.build_tree(parent_list, top_scores_index, seq_lens, topk,
                                                    num_verify_tokens, TreeMaskMode(tree_mask_mode))
    return mask, positions, ri, rnt, rns, draft_tokens


def _write_back(res: AcceptResult, rows: list[int], b: int, predicts, accept_index, accept_token_num) -> None:
    """One request's walk into the kernel's in-place outputs."""
    for k, node in enumerate(res.accept_nodes):
        accept_index[b, k] = rows[node]
        predicts[rows[node]] = res.accept_tokens[k]  # the token that follows this row
    accept_token_num[b] = len(res.correct_drafts)


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """In place: predicts (bs*n,), accept_index (bs, num_spec_step), accept_token_num (bs,).
    target_predict (bs, n) or (bs*n,): the target's argmax after each row."""
    flat_target = target_predict.flatten()
    for b in range(candidates.shape[0]):
        rows = retrive_index[b].tolist()
        res = greedy_walk(candidates[b].tolist(), retrive_next_token[b].tolist(), retrive_next_sibling[b].tolist(),
                          [int(flat_target[r]) for r in rows], None, None, Randoms(), accept_index.shape[1] - 1,
                          RuleParams())
        _write_back(res, rows, b, predicts, accept_index, accept_token_num)


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single=1.0, threshold_acc=1.0, deterministic=True) -> None:
    """In place (predicts, accept_index, accept_token_num, and draft_probs as the kernel writes
    it). target_probs, draft_probs (bs, n, V) float32; uniform_samples (bs, n); the final coins
    (bs,). `deterministic` is accepted for the signature: the walk is deterministic."""
    bs, n = candidates.shape
    params = RuleParams(threshold_single, threshold_acc)
    for b in range(bs):
        rows = retrive_index[b].tolist()
        randoms = Randoms(coins=uniform_samples[b], coin_final=uniform_samples_for_final_sampling[b])
        res = target_only_walk(candidates[b].tolist(), retrive_next_token[b].tolist(), retrive_next_sibling[b].tolist(),
                               None, target_probs[b], draft_probs[b], randoms, accept_index.shape[1] - 1, params)
        _write_back(res, rows, b, predicts, accept_index, accept_token_num)


def chain_speculative_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
                               uniform_samples_for_final_sampling, target_probs, draft_probs) -> None:
    """SGLang's chain rejection sampling (`chain_speculative_sampling_triton`, whose kernel is
    `speculative_sampling_classic_kernel`), in place. Chains of n nodes: accept_index (bs, n),
    target_probs (bs, n, V), draft_probs (bs, n-1, V), uniform_samples (bs, n) (coin j-1 for
    draft j), the final coins (bs,)."""
    for b in range(candidates.shape[0]):
        randoms = Randoms(coins=uniform_samples[b], coin_final=uniform_samples_for_final_sampling[b])
        res = rejection_walk(candidates[b].tolist(), None, None, None, target_probs[b], draft_probs[b], randoms,
                             candidates.shape[1] - 1, RuleParams())
        _write_back(res, retrive_index[b].tolist(), b, predicts, accept_index, accept_token_num)


def reconstruct_indices_from_tree_mask(tree_mask, seq_lens, positions, retrive_index, retrive_next_token,
                                       retrive_next_sibling, batch_size, draft_token_num) -> None:
    """Fills positions and the retrive_* tensors in place from a QLEN_ONLY mask."""
    pos, ri, rnt, rns = tree.reconstruct_indices_from_tree_mask(tree_mask, seq_lens[:batch_size], draft_token_num)
    positions.copy_(pos)
    retrive_index.copy_(ri)
    retrive_next_token.copy_(rnt)
    retrive_next_sibling.copy_(rns)


def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                         kv_indices, custom_mask, mask_indptr, max_len_extend, sm_scale=None, logit_cap=0.0,
                         skip_prefix_custom_mask=True) -> None:
    """Writes o_extend in place: request b's new tokens (rows qo_indptr[b]:qo_indptr[b+1]) attend over
    its prefix, the pool slots kv_indices[kv_indptr[b]:kv_indptr[b+1]], then the new tokens themselves
    (k_extend, v_extend), causally or under its FULL_MASK rows custom_mask[mask_indptr[b]:] of width
    prefix + extend. With skip_prefix_custom_mask the prefix columns are taken as visible unread."""
    for b in range(qo_indptr.shape[0] - 1):
        q0, q1 = qo_indptr[b:b + 2].tolist()
        k0, k1 = kv_indptr[b:b + 2].tolist()
        n, prefix = q1 - q0, k1 - k0
        if custom_mask is None:  # causal: new token j sits at position prefix + j
            mask = torch.ones(n, prefix + n, dtype=torch.bool, device=q_extend.device).tril(prefix)
        else:
            m0 = int(mask_indptr[b])
            mask = custom_mask[m0:m0 + n * (prefix + n)].view(n, prefix + n).bool()
            if skip_prefix_custom_mask:
                mask[:, :prefix] = True
        slots = kv_indices[k0:k1]
        o_extend[q0:q1] = attend(q_extend[q0:q1], torch.cat((k_buffer[slots], k_extend[q0:q1])),
                                 torch.cat((v_buffer[slots], v_extend[q0:q1])), mask, sm_scale, logit_cap)


def decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, sm_scale=None, logit_cap=0.0) -> None:
    """One new token per request (row b of q, o), its own K/V already in the pool among kv_indices."""
    for b in range(q.shape[0]):
        slots = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])]
        o[b:b + 1] = attend(q[b:b + 1], k_buffer[slots], v_buffer[slots], None, sm_scale, logit_cap)
