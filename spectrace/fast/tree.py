"""One step's draft trees on the device (core/tree.py: DraftTree), as DRAFT leaves them for VERIFY.

Every tensor covers the whole batch bucket with a fixed shape, so a CUDA graph replays it:
`bs` requests, `n` nodes each (the root, the last committed token, first). Where core keeps a
request's tree part of the mask (n, n), VERIFY here reads SGLang's FULL_MASK: each request's
rows (n, seq_len + n), the prefix columns set, flattened and concatenated (`lay_out_mask`), in a
buffer sized for any prefix (`full_mask_size`), so its size never depends on the step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DeviceTree:
    draft_tokens: torch.Tensor  # (bs, n) root first
    positions: torch.Tensor  # (bs, n) committed length + depth
    tree_mask: torch.Tensor | None  # FULL_MASK over each prefix (flat); None: a lone root, causal
    retrive_index: torch.Tensor  # (bs, n) flat verify rows, b * n + j
    retrive_next_token: torch.Tensor  # (bs, n) each node's first child, -1 for none
    retrive_next_sibling: torch.Tensor  # (bs, n) each node's next sibling, -1 for none
    draft_probs: torch.Tensor | None = None  # (bs, n-1, V) the q node j+1 was drawn from (or chosen by top-k)
    num_drafts: torch.Tensor | None = None  # (bs,) drafts per request where they vary (n-gram); else n - 1
    # what the trace keeps of each node (recording runs only)
    tree_rows: torch.Tensor | None = None  # (bs, n, n) the tree part of the mask
    q: torch.Tensor | None = None  # (bs, n-1) q of each node given its parent
    scores: torch.Tensor | None = None  # (bs, n-1) path scores
    draft_top: tuple[torch.Tensor, torch.Tensor] | None = None  # (values, indices) (bs, n-1, k) at each parent
    candidates: tuple | None = None  # the draft loop's every candidate: level_tensors + top_scores_index

    @property
    def num_nodes(self) -> int:
        return self.draft_tokens.shape[1]


def root_tree(roots: torch.Tensor, seq_lens: torch.Tensor) -> DeviceTree:
    """Plain decoding's "tree": each request's last token alone, read causally after its prefix."""
    bs = roots.shape[0]
    none = torch.full((bs, 1), -1, device=roots.device)
    return DeviceTree(roots[:, None], seq_lens[:, None], None, torch.arange(bs, device=roots.device)[:, None],
                      none, none)


def full_mask_size(req_to_token: torch.Tensor, n: int) -> int:
    """Entries of a FULL_MASK for any prefixes: build_tree's size with seq_lens_sum bounded by
    every column of req_to_token (a bound known without a sync)."""
    return req_to_token.numel() * n + n * n * req_to_token.shape[0]


def lay_out_mask(masks: torch.Tensor, seq_lens: torch.Tensor, capacity: int) -> torch.Tensor:
    """core/tree.py: lay_out_mask (FULL_MASK) for trees given as (bs, n, n) masks: request b's rows
    (n, seq_lens[b] + n), row r = the prefix then masks[b, r], flattened and concatenated, in a
    buffer of `capacity` entries."""
    bs, n = masks.shape[0], masks.shape[1]
    indptr = F.pad((n * (seq_lens + n)).cumsum(0), (1, 0))
    idx = torch.arange(capacity, device=seq_lens.device)
    b = torch.searchsorted(indptr[1:], idx, right=True).clamp(max=bs - 1)
    local, prefix = idx - indptr[b], seq_lens[b]
    width = prefix + n
    r, col = local // width, local % width - prefix  # col < 0: a prefix column
    inside = masks[b, r.clamp(max=n - 1), col.clamp(min=0, max=n - 1)]
    return ((col < 0) | inside) & (idx < indptr[-1])


def tree_mask_rows(tree_mask: torch.Tensor, seq_lens: torch.Tensor, n: int) -> torch.Tensor:
    """core/tree.py: tree_mask_rows of a FULL_MASK: the tree part of each request's rows, (bs, n, n)."""
    seq, r = seq_lens[:, None, None], torch.arange(n, device=seq_lens.device)
    start = F.pad((n * (seq_lens + n)).cumsum(0), (1, 0))[:-1, None, None]
    return tree_mask[start + r[:, None] * (seq + n) + seq + r]
