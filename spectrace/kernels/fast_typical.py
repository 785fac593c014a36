"""Medusa's typical acceptance (core/acceptance/typical.py: typical_walk) for the fast engine: every
request's tree at once, in torch on the device, graph-safe.

The explicit walk searches paths depth first; here each node's verdicts are computed together:

    p_node     p after the node's parent, of the node's token
    threshold  min(0.09, 0.3 * exp(-H(p))) of each row, H(p) = -sum p log(p + 1e-5)
    passes     p_node > its parent row's threshold; a path holds while every node on it passes
    best       the deepest node whose path holds, ties to the higher sum of log p_node (summed
               root to leaf in float64, as the walk sums); its path is accepted
    bonus      a sample of p after the best node, tokens below that row's threshold removed

(An exact tie in both depth and summed log p, which the explicit walk breaks by its search order,
goes to the lower node index here; the engine's trace check would say so.)
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance.typical import POSTERIOR_ALPHA, POSTERIOR_THRESHOLD


def typical_accept(p: torch.Tensor, candidates: torch.Tensor, tree_rows: torch.Tensor, depths: torch.Tensor,
                   coin_final: torch.Tensor, sample_rows, width: int) -> tuple[torch.Tensor, ...]:
    """p (bs, n, V) after each node; candidates (bs, n) root first; tree_rows (bs, n, n) each
    node's ancestors and itself; depths (bs, n) (root 0); coin_final (bs,). sample_rows(w, coins):
    the engine's inverse-CDF draw. Returns accept_index (bs, width) as flat rows (-1 past the
    path), accept_num (bs,) and the bonus (bs,)."""
    bs, n, _ = p.shape
    device = p.device
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)  # (bs, n), float32 as the walk computes it
    threshold = torch.clamp(torch.exp(-entropy.double()) * POSTERIOR_ALPHA, max=POSTERIOR_THRESHOLD)
    nodes = torch.arange(n, device=device)
    ancestors = tree_rows & (nodes[None, None, :] != nodes[None, :, None])  # (bs, n, n) strictly above
    parent = torch.where(ancestors & (depths[:, None, :] == depths[:, :, None] - 1), nodes, 0).amax(-1)  # (bs, n)
    p_node = p.gather(1, parent[..., None].expand(-1, -1, p.shape[-1])).gather(2, candidates[..., None])[..., 0]
    passes = (p_node.double() > threshold.gather(1, parent)) | (nodes == 0)  # the root always holds
    holds = ~(tree_rows & ~passes[:, None, :]).any(-1)  # every node on the path passes
    log_p = torch.log(p_node.double())
    ll = torch.zeros(bs, n, dtype=torch.float64, device=device)
    for j in range(1, n):  # parents come before children: root-to-leaf sums, in the walk's order
        ll[:, j] = ll.gather(1, parent[:, j:j + 1])[:, 0] + log_p[:, j]
    depth_key = torch.where(holds, depths, -1)
    deepest = depth_key == depth_key.amax(-1, keepdim=True)
    best_ll = torch.where(deepest, ll, -torch.inf)
    best = torch.where(deepest & (best_ll == best_ll.amax(-1, keepdim=True)), nodes, n).amin(-1)  # (bs,)
    accept_num = depths.gather(1, best[:, None])[:, 0]
    levels = torch.arange(width, device=device)
    on_path = tree_rows.gather(1, best[:, None, None].expand(-1, 1, n))[:, 0]  # (bs, n) the path's nodes
    at_level = on_path[:, None, :] & (depths[:, None, :] == levels[None, :, None])  # (bs, levels, n)
    index = torch.where(at_level.any(-1), at_level.int().argmax(-1), -1)
    accept_index = torch.where(index >= 0, index + (torch.arange(bs, device=device) * n)[:, None], -1)
    row = p.gather(1, best[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
    kept = torch.where(row.double() >= threshold.gather(1, best[:, None]), row.double(), 0.0)
    bonus = sample_rows(kept, coin_final.double())
    return accept_index, accept_num, bonus
