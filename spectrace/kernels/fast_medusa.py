"""Medusa on the fast engine (kernels/engine.py): drafters/medusa.py's static tree with the
batch on the device, graph-safe.

The tree never changes, so everything but the tokens is made once: each node's head (its depth)
and rank, its parent, the (n, n) mask and the retrive_* lists (reconstruct_indices_from_tree_mask,
as the explicit drafter reads them). A step is then one pass of the heads over each request's
last hidden state (the target's, at the row whose lm_head gave the root), top-k, the gather of
node j's token as head depth[j]'s rank[j]-th; the engine lays the static mask over each
request's prefix (engine.full_mask).
"""
from __future__ import annotations

import torch

from spectrace.core.drafters.medusa import MedusaHeads, MedusaTree
from spectrace.core.tree import reconstruct_indices_from_tree_mask


class FastMedusa:
    """The heads, the static tree, and each request's last hidden state (bs, H)."""

    capture_layers = ()  # the heads read the target's final hidden state

    def __init__(self, heads: MedusaHeads, tree: MedusaTree, bs: int, hidden: torch.Tensor, trace_topk: int):
        device = hidden.device
        self.heads, self.n = heads, len(tree.choices) + 1
        self.depth = torch.tensor([len(c) - 1 for c in tree.choices], device=device)  # node j+1's head
        self.rank = torch.tensor([c[-1] for c in tree.choices], device=device)
        self.parent = tree.parent  # node j+1's parent node (0 = the root); parents come first
        self.masks = tree.mask.to(device).expand(bs, -1, -1)  # (bs, n, n): every request's tree is the same
        offsets, _, next_token, next_sibling = reconstruct_indices_from_tree_mask(tree.mask.reshape(-1), [0], self.n)
        self.offsets = offsets.to(device)  # (n,) each node's depth
        self.retrive_next_token = next_token.to(device).expand(bs, -1).contiguous()
        self.retrive_next_sibling = next_sibling.to(device).expand(bs, -1).contiguous()
        self.retrive_index = torch.arange(bs * self.n, device=device).view(bs, self.n)
        self.width = min(max(tree.shape[1], trace_topk, 1), heads.medusa_head[0][-1].out_features)
        self.last_hidden = hidden  # the engine's buffer: h at the root's parent row

    def draft(self, roots: torch.Tensor, seq_lens: torch.Tensor) -> dict:
        """Every request's tree: tokens (root first), positions, q and path scores of nodes
        1..n-1 and each node's head top-k (for the trace)."""
        probs = torch.softmax(self.heads(self.last_hidden).float(), dim=-1)  # (heads, bs, V)
        top = torch.topk(probs, self.width, dim=-1)
        q = top.values[self.depth, :, self.rank].T  # (bs, n-1): head depth[j]'s rank[j]-th
        scores = []
        for j, p in enumerate(self.parent):  # a path's score: the product of q from the root
            scores.append(q[:, j] * scores[p - 1] if p else q[:, j])
        return {"draft_tokens": torch.cat([roots[:, None], top.indices[self.depth, :, self.rank].T], dim=1),
                "positions": seq_lens[:, None] + self.offsets, "q": q, "scores": torch.stack(scores, dim=1),
                "draft_top": (top.values[self.depth].transpose(0, 1), top.indices[self.depth].transpose(0, 1))}
