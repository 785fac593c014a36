"""Medusa's typical acceptance on the device (core/acceptance/typical.py: typical_walk): every
request's tree at once, in torch.

The explicit walk searches paths depth first; here each node's verdicts are computed together:

    p_node     p after the node's parent, of the node's token
    threshold  min(0.09, 0.3 * exp(-H(p))) of each row, H(p) = -sum p log(p + 1e-5)
    passes     p_node > its parent row's threshold; a path holds while every node on it passes
    best       the deepest node whose path holds, ties to the higher sum of log p_node (summed
               root to leaf in float64, as the walk sums); its path is accepted
    bonus      a sample of p after the best node, tokens below that row's threshold removed

An exact tie in both depth and summed log p (common in bf16, where siblings can share p) goes
where the explicit walk's search sends it: that walk pops paths from a stack, so it visits a
node's children last to first, and keeps the first path it finds with the best key. Here each
node's place in that order is a number whose digits are (n - its sibling rank) per level, and the
smallest wins.
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance.typical import POSTERIOR_ALPHA, POSTERIOR_THRESHOLD
from spectrace.fast.acceptance import Verdict, target_probs
from spectrace.fast.sampling import sample_rows


def typical_walk(p: torch.Tensor, candidates: torch.Tensor, tree_rows: torch.Tensor,
                 depths: torch.Tensor,
                 coin_final: torch.Tensor, width: int) -> tuple[torch.Tensor, ...]:
    """p (bs, n, V) after each node; candidates (bs, n) root first; tree_rows (bs, n, n) each
    node's ancestors and itself; depths (bs, n) (root 0); coin_final (bs,). Returns accept_index
    (bs, width) as flat rows (-1 past the
    path), accept_num (bs,) and the bonus (bs,)."""
    bs, n, _ = p.shape
    device = p.device
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)  # (bs, n), float32 as the walk computes it
    threshold = torch.clamp(torch.exp(-entropy.double()) * POSTERIOR_ALPHA, max=POSTERIOR_THRESHOLD)
    nodes = torch.arange(n, device=device)
    # (bs, n, n) strictly above
    ancestors = tree_rows & (nodes[None, None, :] != nodes[None, :, None])
    # (bs, n)
    parent = torch.where(ancestors & (depths[:, None, :] == depths[:, :, None] - 1), nodes,
                         0).amax(-1)
    p_parent = p.gather(1, parent[..., None].expand(-1, -1, p.shape[-1]))
    p_node = p_parent.gather(2, candidates[..., None])[..., 0]
    passes = (p_node.double() > threshold.gather(1, parent)) | (nodes == 0)  # the root always holds
    holds = ~(tree_rows & ~passes[:, None, :]).any(-1)  # every node on the path passes
    log_p = torch.log(p_node.double())
    ll = torch.zeros(bs, n, dtype=torch.float64, device=device)
    for j in range(1, n):  # parents come before children: root-to-leaf sums, in the walk's order
        ll[:, j] = ll.gather(1, parent[:, j:j + 1])[:, 0] + log_p[:, j]
    depth_key = torch.where(holds, depths, -1)
    deepest = depth_key == depth_key.amax(-1, keepdim=True)
    best_ll = torch.where(deepest, ll, -torch.inf)
    tied = deepest & (best_ll == best_ll.amax(-1, keepdim=True))
    best = torch.where(tied, search_order(parent, tree_rows, depths, width - 1),
                       torch.iinfo(torch.int64).max
                       ).argmin(-1)  # (bs,)
    accept_num = depths.gather(1, best[:, None])[:, 0]
    levels = torch.arange(width, device=device)
    # (bs, n) the path's nodes
    on_path = tree_rows.gather(1, best[:, None, None].expand(-1, 1, n))[:, 0]
    # (bs, levels, n)
    at_level = on_path[:, None, :] & (depths[:, None, :] == levels[None, :, None])
    index = torch.where(at_level.any(-1), at_level.int().argmax(-1), -1)
    accept_index = torch.where(index >= 0, index + (torch.arange(bs, device=device) * n)[:, None],
                               -1)
    row = p.gather(1, best[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
    kept = torch.where(row.double() >= threshold.gather(1, best[:, None]), row.double(), 0.0)
    bonus = sample_rows(kept, coin_final.double())
    return accept_index, accept_num, bonus


def search_order(parent: torch.Tensor, tree_rows: torch.Tensor, depths: torch.Tensor,
                 max_depth: int) -> torch.Tensor:
    """(bs, n) each node's place in typical_walk's search, smaller first: children last to first,
    depth first. A node's digits, root to node, are n - its rank among its siblings (siblings are
    in node order), in base n + 1; nodes at one depth compare as their paths do."""
    bs, n = parent.shape
    nodes = torch.arange(n, device=parent.device)
    earlier = nodes[None, None, :] < nodes[None, :, None]
    same_parent = (parent[:, None, :] == parent[:, :, None]) & earlier
    rank = (same_parent & (nodes >= 1)[None, None, :]).sum(-1)  # (bs, n): earlier siblings
    # too deep to number (a long chain: one node per depth, no ties)
    if (n + 1) ** max_depth >= 2 ** 62:
        return nodes.expand(bs, n)
    weight = (n + 1) ** (max_depth - depths.clamp(min=1))
    digits = torch.where(nodes >= 1, (n - rank) * weight, 0)
    return (tree_rows.long() * digits[:, None, :]).sum(-1)


def typical_accept(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict:
    """The rule's entry (fast/acceptance: FAST_RULES)."""
    seq_lens = tree.positions[:, 0]  # the root sits at the committed length
    rows = tree.tree_mask
    index, num, bonus = typical_walk(target_probs(logits, tree, spec), tree.draft_tokens, rows,
                                     tree.positions - seq_lens[:, None], randoms.coin_final,
                                     max_depth + 1)
    return Verdict(index, num, bonus)
