"""FROZEN_KV_MTP on the fast engine (kernels/engine.py): drafters/frozen_kv_mtp.py's assistant with
the batch on the device, graph-safe.

The assistant keeps no KV: each pass puts every query row at its request's root position and
reads the target's last-layer KV over the committed prefix (the attention goes through
decode_attention_fwd, kernels/backend.py: frozen_kv_attention, with its metadata built here on the
device). The draft loop is the engine's (draft_forward over `forward`); between steps the
assistant keeps only the target feature of the row that produced the next root.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from spectrace.core.drafters.frozen_kv_mtp import FrozenKVMtpHead
from spectrace.core.model import CausalLM
from spectrace.kernels import attention


class FastFrozenKVMtp:
    capture_layers = ()  # the root's feature is the target's last hidden state

    def __init__(self, head: FrozenKVMtpHead, target: CausalLM, kv, bs: int):
        self.head, self.embed, self.kv = head, target.model.embed_tokens, kv  # kv: the target's StaticKV
        self.temperature = 1.0  # q = softmax(logits / T): the run's T when drafts are sampled
        self.seed = torch.zeros(bs, target.config.hidden_size, dtype=target.lm_head.weight.dtype,
                                device=target.lm_head.weight.device)  # (bs, H_t) the root's feature

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, paths: int):
        """One assistant pass over `paths` rows per request (input_ids, hidden (bs * paths, ...)),
        each at its root's position over its prefix: (q (bs * paths, V), hidden for the next level)."""
        seq_lens = self.kv.seq_lens.repeat_interleave(paths)
        kv_indptr = F.pad(seq_lens.cumsum(0), (1, 0))
        kv_indices = torch.empty(seq_lens.shape[0] * self.kv.req_to_token.shape[1], dtype=torch.int64,
                                 device=seq_lens.device)  # room for any prefixes: no sync
        bs = self.kv.seq_lens.shape[0]
        attention.create_kv_indices(self.kv.req_to_token, torch.arange(bs, device=seq_lens.device).repeat_interleave(
            paths), seq_lens, kv_indptr, None, kv_indices)
        h, logits = self.head(self.embed(input_ids), hidden, seq_lens, self.kv,
                              dict(kv_indptr=kv_indptr, kv_indices=kv_indices))
        return torch.softmax(logits / self.temperature, dim=-1), h
