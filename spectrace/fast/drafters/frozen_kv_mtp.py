"""FROZEN_KV_MTP on the fast engine (core/drafters/frozen_kv_mtp.py): the assistant with the batch
on the device.

The assistant keeps no KV: each pass puts every query row at its request's root position and
reads the target's last-layer KV over the committed prefix (decode_attention_fwd through
kernels/backend.py: frozen_kv_attention, its metadata built on the device, fast/batch.py:
prefix_rows). The draft loop is the EAGLE worker's (draft_forward, build_draft_tree); between
steps the assistant keeps only the target feature of the row that produced the next root.
"""
from __future__ import annotations

import torch

from spectrace.core.drafters import SampledDrafts
from spectrace.core.drafters.eagle_worker import draft_forward
from spectrace.core.drafters.frozen_kv_mtp import FrozenKVMtpHead
from spectrace.fast.batch import prefix_rows
from spectrace.fast.drafters.eagle_worker import build_draft_tree
from spectrace.fast.kv import StaticKV
from spectrace.fast.tree import DeviceTree


class FrozenKVMtp:
    kv = None  # it reads the target's
    capture_layers = ()  # the root's feature is the target's last hidden state
    on_host = False

    def __init__(self, head: FrozenKVMtpHead, target, target_kv: StaticKV, topk: int, sampled: bool, keep_q: bool,
                 trace_topk: int | None, temperature: float = 1.0):
        self.head, self.embed, self.target_kv = head, target.model.embed_tokens, target_kv
        self.topk, self.sampled, self.keep_q, self.trace_topk = topk, sampled, keep_q, trace_topk
        self.temperature = temperature  # q = softmax(logits / T): the run's T when drafts are sampled
        bs = target_kv.seq_lens.shape[0]
        self.root_feature = torch.zeros(bs, target.config.hidden_size, dtype=target.lm_head.weight.dtype,
                                device=target.lm_head.weight.device)  # (bs, H_t) the root's feature

    def reset(self) -> None:
        pass  # root_feature is rewritten by every prefill

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, paths: int):
        """One assistant pass over `paths` rows per request (input_ids, hidden (bs * paths, ...)),
        each at its root's position over its prefix: (q (bs * paths, V), hidden for the next level)."""
        kv, bs = self.target_kv, self.target_kv.seq_lens.shape[0]
        lens = kv.seq_lens.repeat_interleave(paths)  # each row's prefix, and its position (the root's)
        reqs = torch.arange(bs, device=lens.device).repeat_interleave(paths)
        h, logits = self.head(self.embed(input_ids), hidden, lens, kv, prefix_rows(kv.req_to_token, lens, reqs))
        return torch.softmax(logits / self.temperature, dim=-1), h

    def prefill(self, prompt_ids, prompt_lens, roots, features) -> None:
        """The hidden state whose lm_head gave the first token."""
        L = prompt_ids.shape[1]
        self.root_feature.copy_(features[torch.arange(len(roots), device=roots.device) * L + prompt_lens - 1])

    def draft(self, roots, seq_lens, num_steps, num_draft_tokens, randoms) -> DeviceTree:
        """The assistant's pass at the root first (it keeps no q between steps), then the loop."""
        K = self.topk
        sampled = SampledDrafts(None, randoms.worth if K > 1 else None, iter(randoms.noise)) if self.sampled else None
        probs, hidden = self.forward(roots, self.root_feature, 1)
        levels = draft_forward(lambda i, ids, h, parents: self.forward(ids, h, K), probs, hidden, num_steps, K,
                               sampled)
        return build_draft_tree(levels, roots, seq_lens, K, num_draft_tokens, self.keep_q, self.trace_topk)

    def extend(self, tree, verdict, features, live) -> None:
        """No KV to extend: the next root's feature, the target's at the last accepted row."""
        last_row = verdict.path.gather(1, verdict.accept_num[:, None]).flatten()
        self.root_feature.copy_(torch.where(live[:, None], features[last_row], self.root_feature))
