"""Scratch KV for the levels of a draft tree, laid out as SGLang lays it: `[topk][step]`.

Before drafting, `topk * (num_steps - 1)` slots are mapped after each request's committed draft
KV; the path kept as beam k at level i writes its KV to column k * (num_steps - 1) + i and
attends to the committed prefix plus the columns of its own ancestors. After drafting, the
scratch is released: only DRAFT_EXTEND commits draft KV.

    columns   [ beam 0: step 0 .. S-2 | beam 1: step 0 .. S-2 | ... | beam K-1 ]
"""
from __future__ import annotations

import torch

from spectrace.core.batch import ForwardBatch
from spectrace.core.kv import KVCache


class TreeScratch:
    def __init__(self, kv: KVCache, reqs: list[int], topk: int, num_steps: int,
                 base_positions: list[int]):
        """base_positions: RoPE position of level-0 inputs per request."""
        self.kv, self.reqs, self.K, self.S = kv, reqs, topk, num_steps
        self.T = [kv.seq_lens[r] for r in reqs]  # committed draft KV per request
        self.width = topk * (num_steps - 1)
        self.base = base_positions
        self.slots = [kv.prepare(r, t, self.width) for r, t in zip(reqs, self.T)]
        # per request and row of SGLang's parent_list (row 0: the root; then K rows per level):
        # the scratch columns of that path's nodes
        self.columns: list[list[list[int]]] = [[[]] for _ in reqs]

    def batch(self, i: int, input_ids: torch.Tensor, parents: torch.Tensor) -> ForwardBatch:
        """The forward of level i over its K kept paths: input_ids (bs*K,); parents (bs, K) each
        path's flat candidate index, whose `// topk` is the row of the path it extends (as
        build_tree finds a node's parent)."""
        K, device = self.K, self.kv.req_to_token.device
        cols = [k * (self.S - 1) + i for k in range(K)]
        masks, locs = [], []
        for b, r in enumerate(self.reqs):
            paths = [self.columns[b][int(parents[b, k]) // K] + [cols[k]] for k in range(K)]
            self.columns[b] += paths
            m = torch.zeros(K, self.T[b] + self.width, dtype=torch.bool, device=device)
            m[:, :self.T[b]] = True
            for k, path in enumerate(paths):
                m[k, [self.T[b] + c for c in path]] = True
            masks.append(m)
            locs.append(self.slots[b][cols])
            self.kv.record_write(r, [self.base[b] + i] * K, self.slots[b][cols],
                                 input_ids[b * K:(b + 1) * K].tolist())
        return ForwardBatch(
            input_ids=input_ids,
            positions=torch.tensor([p + i for p in self.base for _ in range(K)], device=device),
            req_pool_indices=list(self.reqs), seq_lens=[t + self.width for t in self.T],
            extend_lens=[K] * len(self.reqs), out_cache_loc=torch.cat(locs), custom_masks=masks)

    def release(self) -> None:
        if self.width:
            for r, t in zip(self.reqs, self.T):
                self.kv.commit(r, t, self.width, keep=[])
