"""One step's draft trees on the device (core/tree.py: DraftTree), as DRAFT leaves them for VERIFY.

Every tensor covers the whole batch bucket with a fixed shape, so a CUDA graph replays it:
`bs` requests, `n` nodes each (the root, the last committed token, first). The mask is what core
keeps of a request's tree, its (n, n) rows: SGLang's QLEN_ONLY layout (TreeMaskMode.QLEN_ONLY),
which VERIFY's attention reads with every prefix column visible. (SGLang's Triton backend verifies
under FULL_MASK, the rows (n, seq_len + n) with the prefix columns set: a buffer whose size and
offsets change with every step's prefixes, and nothing in it the QLEN_ONLY rows do not say.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DeviceTree:
    draft_tokens: torch.Tensor  # (bs, n) root first
    positions: torch.Tensor  # (bs, n) committed length + depth
    # (bs, n, n) bool, QLEN_ONLY: row i sees its ancestors and itself; None: a lone root
    tree_mask: torch.Tensor | None
    retrive_index: torch.Tensor  # (bs, n) flat verify rows, b * n + j
    retrive_next_token: torch.Tensor  # (bs, n) each node's first child, -1 for none
    retrive_next_sibling: torch.Tensor  # (bs, n) each node's next sibling, -1 for none
    # (bs, n-1, V) the q node j+1 was drawn from (or chosen by top-k)
    draft_probs: torch.Tensor | None = None
    # (bs,) drafts per request where they vary (n-gram); else n - 1
    num_drafts: torch.Tensor | None = None
    # what the trace keeps of each node (recording runs only)
    q: torch.Tensor | None = None  # (bs, n-1) q of each node given its parent
    scores: torch.Tensor | None = None  # (bs, n-1) path scores
    # (values, indices) (bs, n-1, k) at each parent
    draft_top: tuple[torch.Tensor, torch.Tensor] | None = None
    # the draft loop's every candidate: level_tensors + top_scores_index
    candidates: tuple | None = None

    @property
    def num_nodes(self) -> int:
        return self.draft_tokens.shape[1]


def root_tree(roots: torch.Tensor, seq_lens: torch.Tensor) -> DeviceTree:
    """Plain decoding's "tree": each request's last token alone, read causally after its prefix."""
    bs = roots.shape[0]
    none = torch.full((bs, 1), -1, device=roots.device)
    return DeviceTree(roots[:, None], seq_lens[:, None], None,
                      torch.arange(bs, device=roots.device)[:, None], none, none)
