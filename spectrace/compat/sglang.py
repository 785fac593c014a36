"""SGLang's speculative-decoding tree functions, with its names, argument order and in-place
outputs, on CPU tensors. Thin adapters over `spectrace.core`; see reference/sglang.md 1-3.
"""
from __future__ import annotations

import torch

from spectrace.core import tree
from spectrace.core.acceptance import greedy
from spectrace.core.acceptance.target_only import tree_speculative_sampling_target_only
from spectrace.core.tree import TreeMaskMode, organize_draft_results

__all__ = ["TreeMaskMode", "organize_draft_results", "build_tree_kernel_efficient", "verify_tree_greedy",
           "tree_speculative_sampling_target_only", "reconstruct_indices_from_tree_mask"]


def build_tree_kernel_efficient(verified_id, parent_list, top_scores_index, draft_tokens, seq_lens,
                                seq_lens_sum, topk, spec_steps, num_verify_tokens,
                                tree_mask_mode=TreeMaskMode.FULL_MASK):
    """-> (tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling,
    draft_tokens) with the root (verified_id) prepended to each request's draft tokens."""
    draft_tokens = torch.cat((verified_id.unsqueeze(1), draft_tokens), dim=1).flatten()
    mask, positions, ri, rnt, rns = tree.build_tree(parent_list, top_scores_index, seq_lens, topk,
                                                    num_verify_tokens, TreeMaskMode(tree_mask_mode))
    return mask, positions, ri, rnt, rns, draft_tokens


verify_tree_greedy = greedy.verify_tree_greedy


def reconstruct_indices_from_tree_mask(tree_mask, seq_lens, positions, retrive_index, retrive_next_token,
                                       retrive_next_sibling, batch_size, draft_token_num) -> None:
    """Fills positions and the retrive_* tensors in place from a QLEN_ONLY mask."""
    pos, ri, rnt, rns = tree.reconstruct_indices_from_tree_mask(tree_mask, seq_lens[:batch_size], draft_token_num)
    positions.copy_(pos)
    retrive_index.copy_(ri)
    retrive_next_token.copy_(rnt)
    retrive_next_sibling.copy_(rns)
