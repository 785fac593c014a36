"""`ForwardBatch`: the ragged batch one forward runs over, as SGLang names its fields."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from spectrace.core.kv import KVCache


@dataclass
class ForwardBatch:
    """Request i adds `extend_lens[i]` new tokens after `seq_lens[i] - extend_lens[i]` cached ones.

    Tokens of all requests are packed along one axis of N = sum(extend_lens) rows.
    """

    input_ids: torch.Tensor  # (N,)
    positions: torch.Tensor  # (N,)
    req_pool_indices: list[int]
    seq_lens: list[int]  # KV length each request attends over, its new tokens included
    extend_lens: list[int]
    out_cache_loc: torch.Tensor  # (N,) slots the new tokens' K and V are written to
    custom_masks: list[torch.Tensor | None]  # per request (extend_len, seq_len) bool; None = causal
    # what a kernel backend computes once per forward and every layer reuses (SGLang's forward
    # metadata: kv indices, packed masks); the explicit attention needs none
    attn_metadata: dict | None = None
    # --deterministic: every row computed as a one-token decode computes it (CausalLM.forward)
    batch_invariant: bool = False

    def rows(self) -> list["ForwardBatch"]:
        """One batch per row, in row order (a tree's parents before their children): row j of
        request i sees what its mask row shows, its own K/V written to its slot by its own pass."""
        out, row = [], 0
        for req, seq_len, n, mask in zip(self.req_pool_indices, self.seq_lens, self.extend_lens,
                                         self.custom_masks):
            if mask is None:  # causal: new token j sits at position seq_len - n + j
                mask = torch.ones(n, seq_len, dtype=torch.bool, device=self.input_ids.device)
                mask = mask.tril(seq_len - n)
            for j in range(n):
                r = slice(row + j, row + j + 1)
                out.append(ForwardBatch(self.input_ids[r], self.positions[r], [req], [seq_len], [1],
                                        self.out_cache_loc[r], [mask[j:j + 1]],
                                        batch_invariant=True))
            row += n
        return out

    @classmethod
    def build(cls, kv: KVCache, items: list[tuple[int, int, list[int]]], masks=None,
              positions: list[list[int]] | None = None) -> "ForwardBatch":
        """`items`: (request, start, new token ids) per request: the new tokens take
        `req_to_token[req, start:start+n]`, mapped here with `kv.prepare` (so it allocates).
        Their RoPE positions are start.. unless `positions` gives them (tree nodes sit at
        prefix length + depth, not at their column)."""
        device = kv.req_to_token.device
        ids, pos, locs = [], [], []
        for j, (req, start, tokens) in enumerate(items):
            slots = kv.prepare(req, start, len(tokens))
            p = positions[j] if positions is not None else list(range(start, start + len(tokens)))
            kv.record_write(req, p, slots, tokens)
            ids.extend(tokens)
            pos.extend(p)
            locs.append(slots)
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
            positions=torch.tensor(pos, dtype=torch.int64, device=device),
            req_pool_indices=[req for req, _, _ in items],
            seq_lens=[start + len(tokens) for _, start, tokens in items],
            extend_lens=[len(tokens) for _, _, tokens in items],
            out_cache_loc=torch.cat(locs),
            custom_masks=list(masks) if masks is not None else [None] * len(items),
        )
