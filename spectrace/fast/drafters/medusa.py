"""Medusa on the fast engine (core/drafters/medusa.py): the heads over a static tree, the batch on
the device.

The tree never changes, so everything but the tokens is made once: each node's head (its depth)
and rank, its parent, the (n, n) mask and the retrive_* lists (reconstruct_indices_from_tree_mask,
as the explicit drafter reads them). A step is then one pass of the heads over each request's
last hidden state (the target's, at the row whose lm_head gave the root), top-k, and the gather
of node j's token as head depth[j]'s rank[j]-th; the static mask is laid over each prefix.
"""
from __future__ import annotations

import torch

from spectrace.core.drafters.medusa import MedusaHeads, MedusaTree
from spectrace.core.tree import reconstruct_indices_from_tree_mask
from spectrace.fast.tree import DeviceTree


class Medusa:
    kv = None
    capture_layers = ()  # the heads read the target's final hidden state
    drafts_on_host = False
    samples_drafts = False  # a static tree of each head's top-k

    def __init__(self, heads: MedusaHeads, tree: MedusaTree, bs: int, hidden_size: int,
                 trace_topk: int, recording: bool):
        device, dtype = next(heads.parameters()).device, next(heads.parameters()).dtype
        self.heads, self.n, self.recording = heads, len(tree.choices) + 1, recording
        # node j+1's head
        self.depth = torch.tensor([len(c) - 1 for c in tree.choices], device=device)
        self.rank = torch.tensor([c[-1] for c in tree.choices], device=device)
        self.parent = tree.parent  # node j+1's parent node (0 = the root); parents come first
        # (bs, n, n): every request's tree is the same
        self.masks = tree.mask.to(device).repeat(bs, 1, 1)
        offsets, _, next_token, next_sibling = reconstruct_indices_from_tree_mask(
            tree.mask.reshape(-1), [0], self.n)
        self.offsets = offsets.to(device)  # (n,) each node's depth
        self.retrive_next_token = next_token.to(device).expand(bs, -1).contiguous()
        self.retrive_next_sibling = next_sibling.to(device).expand(bs, -1).contiguous()
        self.retrive_index = torch.arange(bs * self.n, device=device).view(bs, self.n)
        # each head's top tokens: the tree's widest rank, and what the trace keeps (run traced or
        # not,
        # the same top-k call, so ties fall the same way)
        self.width = min(max(tree.shape[1], trace_topk, 1), heads.medusa_head[0][-1].out_features)
        # h at the root's parent row
        self.last_hidden = torch.zeros(bs, hidden_size, dtype=dtype, device=device)

    def reset(self) -> None:
        pass  # last_hidden is rewritten by every prefill

    def prefill(self, prompt_ids, prompt_lens, roots, features) -> None:
        L = prompt_ids.shape[1]
        self.last_hidden.copy_(features[torch.arange(len(roots), device=roots.device) * L
                                        + prompt_lens - 1])

    def draft(self, roots, seq_lens, num_steps, num_draft_tokens, randoms) -> DeviceTree:
        """Every request's tree: tokens (root first), positions; for the trace q, path scores of
        nodes 1..n-1 and each node's head top-k."""
        probs = torch.softmax(self.heads(self.last_hidden).float(), dim=-1)  # (heads, bs, V)
        top = torch.topk(probs, self.width, dim=-1)
        tokens = torch.cat([roots[:, None], top.indices[self.depth, :, self.rank].T], dim=1)
        tree = DeviceTree(tokens, seq_lens[:, None] + self.offsets, self.masks, self.retrive_index,
                          self.retrive_next_token, self.retrive_next_sibling)
        if self.recording:
            q = top.values[self.depth, :, self.rank].T  # (bs, n-1): head depth[j]'s rank[j]-th
            scores = []
            for j, p in enumerate(self.parent):  # a path's score: the product of q from the root
                scores.append(q[:, j] * scores[p - 1] if p else q[:, j])
            tree.q, tree.scores = q, torch.stack(scores, dim=1)
            tree.draft_top = (top.values[self.depth].transpose(0, 1),
                              top.indices[self.depth].transpose(0, 1))
        return tree

    def draft_extend(self, tree, verdict, features, live) -> None:
        """No KV: the next tree reads the target's hidden state at the last accepted row."""
        last_row = verdict.path.gather(1, verdict.accept_num[:, None]).flatten()
        self.last_hidden.copy_(torch.where(live[:, None], features[last_row], self.last_hidden))
