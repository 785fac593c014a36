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
from spectrace.kernels.commit import commit_rows


class StaticKV:
    backend = "triton"

    def __init__(self, model, bs: int, columns: int):
        cfg, p = model.config, next(model.parameters())
        self.pool = TokenToKVPool(len(model.layers), bs * columns, cfg.num_key_value_heads,
                                  cfg.head_dim, p.dtype, p.device)
        self.identity = torch.arange(bs * columns, device=p.device).view(bs, columns)
        self.req_to_token = self.identity.clone()
        # committed KV per request
        self.seq_lens = torch.zeros(bs, dtype=torch.int64, device=p.device)

    def reset(self) -> None:
        self.req_to_token.copy_(self.identity)
        self.seq_lens.zero_()

    def slots(self, starts: torch.Tensor, width: int) -> torch.Tensor:
        """(bs, width) slots of columns starts[b] .. starts[b] + width - 1 of each row."""
        return self.req_to_token.gather(1,
                                        starts[:, None] + torch.arange(width, device=starts.device))

    def commit(self, accept_index: torch.Tensor, accept_num: torch.Tensor, live: torch.Tensor,
               n: int) -> None:
        """COMMIT (SGLang's remap): the verify's n columns of each live row reordered so the
        accepted path's slots come first, in path order, and the rest after them, still owned by
        the request; seq_lens grows by accept_num + 1 (the root and the correct drafts).
        accept_index (bs, w): the accepted path as flat verify rows b * n + node, root first.
        One Triton program per request (kernels/commit.py)."""
        commit_rows(self.req_to_token, self.seq_lens, accept_index, accept_num, live, n)
