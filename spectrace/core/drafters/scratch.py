"""Scratch KV for the levels of a draft tree, laid out as SGLang lays it: `[topk][step]`.

Before drafting, `topk * (num_steps - 1)` slots are mapped after each request's committed draft
KV; the path kept as beam k at level i writes its KV to column k * (num_steps - 1) + i and
attends to the committed prefix plus the columns of its own ancestors. After drafting, the
scratch is released: only DRAFT_EXTEND commits draft KV.
"""
from __future__ import annotations

import torch

from spectrace.core.batch import ForwardBatch
from spectrace.core.kv import KVCache


class TreeScratch:
    def __init__(self, kv: KVCache, reqs: list[int], topk: int, num_steps: int, base_positions: list[int]):
        """base_positions: RoPE position of level-0 inputs per request."""
        self.kv, self.reqs, self.K, self.S = kv, reqs, topk, num_steps
        self.T = [kv.seq_lens[r] for r in reqs]  # committed draft KV per request
        self.width = topk * (num_steps - 1)
        self.base = base_positions
        self.slots = [kv.prepare(r, t, self.width) for r, t in zip(reqs, self.T)]
        self.paths: list[list[list[int]]] = []  # per request and beam: its ancestors' columns and its own

    def batch(self, i: int, input_ids: torch.Tensor, parent_beam) -> ForwardBatch:
        """The forward of level i: input_ids (bs*K,); parent_beam (bs, K) or None at level 0."""
        K, device = self.K, self.kv.req_to_token.device
        cols = [k * (self.S - 1) + i for k in range(K)]
        if i == 0:
            self.paths = [[[c] for c in cols] for _ in self.reqs]
        else:
            self.paths = [[self.paths[b][int(parent_beam[b, k])] + [cols[k]] for k in range(K)]
                          for b in range(len(self.reqs))]
        masks, locs = [], []
        for b, r in enumerate(self.reqs):
            m = torch.zeros(K, self.T[b] + self.width, dtype=torch.bool, device=device)
            m[:, :self.T[b]] = True
            for k in range(K):
                m[k, [self.T[b] + c for c in self.paths[b][k]]] = True
            masks.append(m)
            locs.append(self.slots[b][cols])
            self.kv.record_write(r, [self.base[b] + i] * K, self.slots[b][cols], input_ids[b * K:(b + 1) * K].tolist())
        return ForwardBatch(
            input_ids=input_ids,
            positions=torch.tensor([p + i for p in self.base for _ in range(K)], device=device),
            req_pool_indices=list(self.reqs), seq_lens=[t + self.width for t in self.T],
            extend_lens=[K] * len(self.reqs), out_cache_loc=torch.cat(locs), custom_masks=masks)

    def release(self) -> None:
        if self.width:
            for r, t in zip(self.reqs, self.T):
                self.kv.commit(r, t, self.width, keep=[])
