"""FROZEN_KV_MTP on the fast engine (core/drafters/frozen_kv_mtp.py): the assistant with the batch
on the device.

The assistant keeps no KV: each pass puts every query row at its request's root position and
reads the target's last-layer KV over the committed prefix (decode_attention_fwd's rows form
through kernels/backend.py: frozen_kv_attention, read from req_to_token: no metadata to build). The
draft loop is the EAGLE worker's (draft_forward, build_draft_tree); between
steps the assistant keeps only the target feature of the row that produced the next root.
"""
from __future__ import annotations

import torch

from spectrace.core.drafters import SampledDrafts
from spectrace.core.drafters.eagle_worker import draft_forward
from spectrace.core.drafters.frozen_kv_mtp import FrozenKVMtpHead
from spectrace.fast.drafters.eagle_worker import (build_draft_tree, build_fused_tree,
                                                  fused_draft_forward)
from spectrace.fast.kv import StaticKV
from spectrace.fast.tree import DeviceTree


class FrozenKVMtp:
    kv = None  # it reads the target's
    capture_layers = ()  # the root's feature is the target's last hidden state
    drafts_on_host = False

    def __init__(self, head: FrozenKVMtpHead, target, target_kv: StaticKV, topk: int, sampled: bool,
                 keep_q: bool, trace_topk: int | None, temperature: float = 1.0,
                 fused: bool = False):
        self.head, self.embed, self.target_kv = head, target.model.embed_tokens, target_kv
        self.topk, self.samples_drafts = topk, sampled
        self.keep_q, self.trace_topk = keep_q, trace_topk
        # q = softmax(logits / T): the run's T when drafts are sampled
        self.temperature = temperature
        self.fused = fused  # fused_draft_forward (engines.py: fast_drafter says when)
        bs = target_kv.seq_lens.shape[0]
        self.root_feature = torch.zeros(bs, target.config.hidden_size,
                                        dtype=target.lm_head.weight.dtype,
                                device=target.lm_head.weight.device)  # (bs, H_t) the root's feature

    def reset(self) -> None:
        pass  # root_feature is rewritten by every prefill

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """One assistant pass over rows of input_ids and hidden, a request's rows together, each at
        `positions` (its root's) over its request's prefix: (logits (rows, V), hidden for the next
        level)."""
        kv = self.target_kv
        # each row reads its request's committed prefix (decode_attention_fwd's rows form)
        rows = dict(req_to_token=kv.req_to_token, prefix_lens=kv.seq_lens)
        h, logits = self.head(self.embed(input_ids), hidden, positions, kv, rows)
        return logits, h

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits / self.temperature, dim=-1)

    def prefill(self, prompt_ids, prompt_lens, roots, features) -> None:
        """The hidden state whose lm_head gave the first token."""
        L = prompt_ids.shape[1]
        self.root_feature.copy_(features[torch.arange(len(roots), device=roots.device) * L
                                         + prompt_lens - 1])

    def draft(self, roots, seq_lens, num_steps, num_draft_tokens, randoms) -> DeviceTree:
        """The assistant's pass at the root first (it keeps no q between steps), then the loop."""
        K = self.topk
        logits, hidden = self.forward(roots, self.root_feature, seq_lens)
        positions = seq_lens.repeat_interleave(K)  # every level's rows sit at their root's position
        if self.fused:  # each level's selection is one kernel
            buffers, tops = fused_draft_forward(lambda i, input_ids, h,
                                                paths: self.forward(input_ids, h, positions),
                                                logits, hidden, num_steps, K, probs=False,
                                                trace_topk=self.trace_topk)
            return build_fused_tree(buffers, roots, seq_lens, K, num_draft_tokens, tops)
        sampled = (SampledDrafts(None, randoms.worth if K > 1 else None, iter(randoms.noise))
                   if self.samples_drafts else None)

        def forward(i, input_ids, h, parents):
            logits, h = self.forward(input_ids, h, positions)
            return self.probs(logits), h
        levels = draft_forward(forward, self.probs(logits), hidden, num_steps, K, sampled)
        return build_draft_tree(levels, roots, seq_lens, K, num_draft_tokens, self.keep_q,
                                self.trace_topk)

    def draft_extend(self, tree, verdict, features, live) -> None:
        """No KV to extend: the next root's feature, the target's at the last accepted row."""
        last_row = verdict.path.gather(1, verdict.accept_num[:, None]).flatten()
        self.root_feature.copy_(torch.where(live[:, None], features[last_row], self.root_feature))
