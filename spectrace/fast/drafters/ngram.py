"""n-gram on the fast engine (core/drafters/ngram.py): drafted on the CPU by the explicit drafters
(vLLM's prompt lookup or SGLang's trie), verified on the device.

A proposal is a lookup in the request's token history, which lives on the host, so DRAFT is host
code and not a graph: each step the host drafts for the unfinished requests and copies the trees
into static buffers that the verify graph reads (`draft` lays them out over the prefixes there),
every tree padded to the run's n nodes. A vLLM chain shorter than k (or none: a plain decode step,
as vLLM skips the request) gets padding nodes that no walk reaches, since its last real node has
no next token; a padding row attends to the root and itself, and its KV is never committed. The
host needs the last step's tokens before it can draft, so n-gram runs without the overlap the
model drafters get.
"""
from __future__ import annotations

import torch

from spectrace.core.request import Request
from spectrace.core.tree import DraftTree
from spectrace.fast.tree import DeviceTree


class Ngram:
    """An explicit n-gram drafter and the device buffers its trees are copied into, one row per
    request of the bucket: tokens (root slot unused: the engine's roots), (n, n) masks, depths, the
    retrive_* lists, and how many drafts each request has."""

    kv = None
    capture_layers = ()
    drafts_on_host = True
    samples_drafts = False  # copied tokens

    def __init__(self, drafter, bs: int, n: int, device: torch.device):
        self.drafter, self.bs, self.n, self.device = drafter, bs, n, device
        self.tokens = torch.zeros(bs, n, dtype=torch.int64, device=device)
        self.masks = torch.zeros(bs, n, n, dtype=torch.bool, device=device)
        self.depths = torch.zeros(bs, n, dtype=torch.int64, device=device)
        self.retrive_next_token = torch.full((bs, n), -1, dtype=torch.int64, device=device)
        self.retrive_next_sibling = torch.full((bs, n), -1, dtype=torch.int64, device=device)
        self.retrive_index = torch.arange(bs * n, device=device).view(bs, n)
        # vLLM's num_draft_tokens
        self.num_drafts = torch.zeros(bs, dtype=torch.int64, device=device)
        # the last step's trees, as the explicit drafter made them
        self.tree: DraftTree | None = None
        self.index: dict[int, int] = {}  # bucket row -> its request's index in `tree`
        self.sizes = [1] * bs  # nodes of each row's tree, root included (1: nothing drafted)

    def reset(self) -> None:
        pass  # its buffers are rewritten by every host_draft

    # ---- the host's part: the explicit drafter over each request's history ------------------
    def host_prefill(self, reqs: list[Request]) -> None:
        self.drafter.draft_extend_for_prefill([(r.req_pool_idx, r.prompt_ids + r.output_ids, None)
                                               for r in reqs if not r.finish_reason])

    def host_extend(self, reqs: list[Request], rows: list[list[int]]) -> None:
        """After a step, the histories of the requests still running grow by their accept tokens
        (rows: the host row of each, its accept_num last)."""
        self.drafter.draft_extend([(r.req_pool_idx, row[:row[-1] + 1], None)
                                   for r, row in zip(reqs, rows) if not r.finish_reason])

    def sizes_for(self, reqs: list[Request], tier) -> list[int]:
        """Nodes of each request's tree, as the last host_draft made them."""
        return list(self.sizes)

    def host_draft(self, reqs: list[Request]) -> None:
        """DRAFT on the host for the unfinished requests (a request's row is its req_pool_idx),
        then the trees into the device buffers."""
        live = [r for r in reqs if not r.finish_reason]
        tree = self.drafter.draft([r.req_pool_idx for r in live], [r.output_ids[-1] for r in live],
                                  [0] * len(live))
        n, bs, rows = self.n, self.bs, torch.arange(self.n)
        tokens = torch.zeros(bs, n, dtype=torch.int64)
        masks = torch.zeros(bs, n, n, dtype=torch.bool)
        masks[:, :, 0] = masks[:, rows, rows] = True  # padding rows: the root and themselves
        depths = torch.ones(bs, n, dtype=torch.int64)
        depths[:, 0] = 0
        next_token, next_sibling = torch.full((2, bs, n), -1, dtype=torch.int64)
        sizes = [1] * bs
        for i, r in enumerate(live):
            b, m = r.req_pool_idx, tree.size(i)
            tokens[b, :m], masks[b, :m, :m] = (tree.draft_tokens[i, :m].cpu(),
                                               tree.tree_mask[i, :m, :m].cpu())
            depths[b, :m] = tree.positions[i, :m].cpu()  # drafted after a seq_len of 0: the depths
            next_token[b, :m], next_sibling[b, :m] = (tree.retrive_next_token[i, :m],
                                                      tree.retrive_next_sibling[i, :m])
            sizes[b] = m
        self.tree, self.index, self.sizes = tree, {r.req_pool_idx: i
                                                   for i, r in enumerate(live)}, sizes
        for buffer, value in ((self.tokens, tokens), (self.masks, masks), (self.depths, depths),
                              (self.retrive_next_token, next_token),
                              (self.retrive_next_sibling, next_sibling),
                              (self.num_drafts, torch.tensor(sizes) - 1)):
            buffer.copy_(value.pin_memory() if self.device.type == "cuda" else value,
                         non_blocking=True)

    # ---- the device's part ----------------------------------------------------------------
    def prefill(self, prompt_ids, prompt_lens, roots, features) -> None:
        pass  # the histories are the host's (host_prefill)

    def draft(self, roots, seq_lens, num_steps, num_draft_tokens, randoms) -> DeviceTree:
        """The host's trees from the buffers, over each request's prefix."""
        return DeviceTree(torch.cat([roots[:, None], self.tokens[:, 1:]], dim=1),
                          seq_lens[:, None] + self.depths, self.masks, self.retrive_index,
                          self.retrive_next_token, self.retrive_next_sibling,
                          num_drafts=self.num_drafts)

    def draft_extend(self, tree, verdict, features, live) -> None:
        pass  # the histories grow on the host (host_extend)
