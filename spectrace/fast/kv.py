"""The fast engine's KV (core/kv.py's peer, not its twin): a static req_to_token in which request
b owns row b and the slots b * columns ... for the whole run.

    explicit KVCache                          StaticKV
    a free-slot allocator, per-request        no allocator: no slot ever leaves its request
      commits, KV events for the trace
    COMMIT (sglang): remap the accepted rows   COMMIT: reorder the row's verify columns, the
      into req_to_token, free the rest           accepted path first, the rest after it, kept
Only the order of a row's entries changes, so every step has the same shapes (a CUDA graph
replays it). `backend` routes the models' attention to the Triton twins (kernels/backend.py).
"""
from __future__ import annotations

import torch

from spectrace.core.kv import TokenToKVPool


class StaticKV:
    backend = "triton"

    def __init__(self, model, bs: int, columns: int):
        cfg, p = model.config, next(model.parameters())
        self.pool = TokenToKVPool(len(model.layers), bs * columns, cfg.num_key_value_heads, cfg.head_dim, p.dtype,
                                  p.device)
        self.identity = torch.arange(bs * columns, device=p.device).view(bs, columns)
        self.req_to_token = self.identity.clone()
        self.seq_lens = torch.zeros(bs, dtype=torch.int64, device=p.device)  # committed KV per request

    def reset(self) -> None:
        self.req_to_token.copy_(self.identity)
        self.seq_lens.zero_()

    def slots(self, starts: torch.Tensor, width: int) -> torch.Tensor:
        """(bs, width) slots of columns starts[b] .. starts[b] + width - 1 of each row."""
        return self.req_to_token.gather(1, starts[:, None] + torch.arange(width, device=starts.device))

    def commit(self, path: torch.Tensor, accept_num: torch.Tensor, live: torch.Tensor, n: int) -> None:
        """COMMIT (SGLang's remap): the verify's n columns of each live row reordered so the
        accepted path's slots come first, in path order, and the rest after them, still owned by
        the request; seq_lens grows by accept_num + 1 (the root and the correct drafts).
        path (bs, w): the accepted nodes (node indices, root first; entries past accept_num unread)."""
        bs, w = path.shape
        device = path.device
        j = torch.arange(w, device=device)
        cols = self.seq_lens[:, None] + torch.arange(n, device=device)
        # rank of each node in the new order: its place on the path, else n + its index; entries
        # past the path (and every entry of a frozen row) rewrite the root's rank 0, a no-op
        on_path = (j <= accept_num[:, None]) & live[:, None]
        rank = (torch.arange(n, device=device) + n).repeat(bs, 1)
        rank.scatter_(1, torch.where(on_path, path, 0), torch.where(on_path, j, 0))
        order = torch.argsort(rank, dim=1, stable=True)
        self.req_to_token.scatter_(1, cols, self.req_to_token.gather(1, cols).gather(1, order))
        self.seq_lens.add_(torch.where(live, accept_num + 1, 0))
