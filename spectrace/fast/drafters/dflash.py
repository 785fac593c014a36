"""DFLASH on the fast engine (core/drafters/dflash.py): the block drafter with the batch on the
device.

The explicit drafter keeps each request's context keys and values in a list that grows by
torch.cat as tokens commit; here each draft layer's context lives in a static buffer
(bs, columns, kvh, d), request b in row b, column t holding committed token t. A request's
context always covers exactly its committed target KV, so the target's seq_lens say how much of
a row is real: DRAFT masks the columns past it, EXTEND writes the accepted rows' context at the
columns after the last commit (the rows past accept_num land past the new end, where the mask
hides them until they are overwritten). The block is one non-causal pass over every request; its
chain (topk 1) has a fixed shape, as Medusa's tree does.
"""
from __future__ import annotations

import torch

from spectrace.core.drafters.dflash import DFlashDraftModel
from spectrace.fast.tree import DeviceTree


class DFlash:
    kv = None  # its context buffers are not a paged KV
    drafts_on_host = False
    samples_drafts = False  # a block's argmax (vllm takes it one-hot)

    def __init__(self, model: DFlashDraftModel, target, bs: int, columns: int,
                 trace_topk: int | None):
        p = next(model.parameters())
        cfg, device = model.config, p.device
        self.model, self.embed, self.lm_head = model, target.model.embed_tokens, target.lm_head
        self.capture_layers = model.capture_layers
        self.n = n = model.block_size
        self.trace_topk = trace_topk
        self.ctx = [tuple(torch.zeros(bs, columns, cfg.num_key_value_heads, cfg.head_dim,
                                      dtype=p.dtype,
                                      device=device) for _ in range(2)) for _ in model.layers]
        self.columns = torch.arange(columns, device=device)
        self.offsets = torch.arange(n, device=device)
        # [root, MASK, ..., MASK]
        self.block = torch.full((bs, n), model.mask_token_id, device=device)
        # a chain
        self.masks = torch.ones(n, n, dtype=torch.bool, device=device).tril().repeat(bs, 1, 1)
        chain = torch.where(self.offsets < n - 1, self.offsets + 1, -1)
        self.retrive_next_token = chain.expand(bs, n).contiguous()
        self.retrive_next_sibling = torch.full((bs, n), -1, device=device)
        self.retrive_index = torch.arange(bs * n, device=device).view(bs, n)

    def reset(self) -> None:
        pass  # a row's context past its committed length is masked

    def write(self, features: torch.Tensor, starts: torch.Tensor) -> None:
        """The context K/V of features (bs, T, F), the target's captured rows, into columns
        starts[b] .. starts[b] + T - 1 of each row (core/drafters/dflash.py: _extend)."""
        bs, T = features.shape[:2]
        cols = starts[:, None] + torch.arange(T, device=starts.device)
        rows = torch.arange(bs, device=starts.device)[:, None]
        for (k_buf, v_buf), (k, v) in zip(self.ctx, self.model.context_kv(features, cols)):
            k_buf[rows, cols] = k
            v_buf[rows, cols] = v

    def prefill(self, prompt_ids, prompt_lens, roots, features) -> None:
        """The prompt's context K/V (its padding rows land past each prompt, masked)."""
        self.write(features.view(prompt_ids.shape[0], prompt_ids.shape[1], -1),
                   torch.zeros_like(prompt_lens))

    def draft(self, roots, seq_lens, num_steps, num_draft_tokens, randoms) -> DeviceTree:
        """Every request's block after its committed context: drafts are each row's argmax; for
        the trace q, path scores (the product of q) and each row's top-k."""
        self.block[:, 0] = roots
        positions = seq_lens[:, None] + self.offsets
        h = self.model(self.embed(self.block), positions, self.ctx,
                       self.columns < seq_lens[:, None])
        probs = torch.softmax(self.lm_head(h[:, 1:]).float(), dim=-1)  # (bs, n-1, V)
        q, drafts = probs.max(dim=-1)
        tree = DeviceTree(torch.cat([roots[:, None], drafts], dim=1), positions, self.masks,
                          self.retrive_index, self.retrive_next_token, self.retrive_next_sibling)
        if self.trace_topk is not None:
            top = torch.topk(probs, min(max(self.trace_topk, 1), probs.shape[-1]), dim=-1)
            tree.q, tree.scores, tree.draft_top = (q, torch.cumprod(q, dim=1),
                                                   (top.values, top.indices))
        return tree

    def draft_extend(self, tree, verdict, features, live) -> None:
        """The accepted rows' context, after the columns committed before this step (the root's
        position)."""
        self.write(features[verdict.path], tree.positions[:, 0])
