"""FROZEN_KV_MTP: an MTP drafter that reads the target's KV and keeps none of its own.

SGLang runs it for Gemma 4's assistant models (`Gemma4AssistantForCausalLM`): "the assistant
reads target KV only ... there is no assistant-side KV extension". Its data flow, as transformers'
`SinglePositionMultiTokenCandidateGenerator` and `Gemma4AssistantForCausalLM` spell it out:

    x        pre_projection([target_embed(token); hidden])       2 H_t -> H
    layers   Llama blocks whose attention computes queries only: keys and values are the target's
             own, read from the target's last layer over the committed prefix (cross-attention
             into frozen target KV; nothing is written)
    out      logits = lm_head(norm(x)) over the full vocabulary;
             hidden for the next level = post_projection(norm(x))   H -> H_t
    position every level sits at the root's position: with no KV of its own the assistant is
             "locked into a constant position_ids value"; it learns depth from its hidden state

Seed (SGLang's "one-token DECODE of the bonus token with the last target hidden against frozen
target KV"): the root token with the target's feature at the row that produced it. Tree levels
then run the EAGLE worker's draft loop on the assistant's own hidden states; siblings never see
each other, so no scratch KV is needed.

spectrace's target is a Llama, so the blocks are Llama blocks (Gemma 4's are Gemma blocks with
sliding-window layers and an ordered-embedding head); the checkpoint keeps Gemma 4's assistant
key names: `pre_projection`, `post_projection`, `lm_head`, `model.layers.*` (no k/v
projections), `model.norm`. The config is a Llama config with `backbone_hidden_size`; head_dim
and num_key_value_heads must equal the target's, since the assistant reads the target's KV.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from spectrace.core.config import ModelConfig
from spectrace.core.drafters.eagle_worker import build_draft_tree, draft_forward
from spectrace.core.kv import KVCache
from spectrace.core.checkpoint import finish_loading, read_checkpoint
from spectrace.core.model import (CausalLM, DecoderLayer, RMSNorm, RotaryEmbedding, apply_rope,
                                  attend)
from spectrace.core.tree import DraftTree
from spectrace.errors import SpectraceError


class FrozenKVAttention(nn.Module):
    """Queries of the assistant against the target's keys and values of one layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.o_bias)

    def forward(self, x, cos, sin, kv: KVCache, kv_layer: int, rows):
        """rows: (request, target KV length, n query rows) in row order (or what the KV's backend
        reads instead: the fast engine's decode metadata); no mask: every query sees the whole
        committed prefix and nothing else."""
        q = apply_rope(self.q_proj(x).view(x.shape[0], self.num_heads, self.head_dim), cos, sin)
        return self.o_proj(FROZEN_ATTENTION[kv.backend](q, kv, kv_layer, rows).view(x.shape[0], -1))


def frozen_attention(q, kv: KVCache, kv_layer: int,
                     rows: list[tuple[int, int, int]]) -> torch.Tensor:
    """q (N, h, d) against layer kv_layer of the target's KV, each request's rows over its
    prefix."""
    out, row = torch.empty_like(q), 0
    for req, seq_len, n in rows:
        slots = kv.req_to_token[req, :seq_len]
        out[row:row + n] = attend(q[row:row + n], kv.pool.k[kv_layer, slots],
                                  kv.pool.v[kv_layer, slots])
        row += n
    return out


# backend -> the attention of the assistant's queries (kernels/backend.py adds "triton")
FROZEN_ATTENTION = {"explicit": frozen_attention}


class FrozenKVMtpHead(nn.Module):
    capture_layers: tuple[int, ...] = ()  # reads the target's last hidden state

    def __init__(self, cfg: ModelConfig, backbone_hidden_size: int, kv_layer: int):
        super().__init__()
        self.config, self.kv_layer = cfg, kv_layer
        H, Ht = cfg.hidden_size, backbone_hidden_size
        self.pre_projection = nn.Linear(2 * Ht, H, bias=False)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(DecoderLayer(cfg, FrozenKVAttention(cfg))
                                          for _ in range(cfg.num_hidden_layers))
        self.model.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_projection = nn.Linear(H, Ht, bias=False)
        self.lm_head = nn.Linear(H, cfg.vocab_size, bias=False)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    @property
    def layers(self):
        return self.model.layers

    @torch.no_grad()
    def forward(self, embeds, features, positions, kv: KVCache, rows):
        """embeds, features (N, H_t): target embedding of each row's token and the hidden state
        it continues. Returns (hidden for the next level (N, H_t), logits (N, vocab))."""
        x = self.pre_projection(torch.cat([embeds, features], dim=-1))
        cos, sin = self.rotary_emb(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, kv, self.kv_layer, rows)
        x = self.model.norm(x)
        return self.post_projection(x), self.lm_head(x).float()


def load_frozen_kv_mtp(path: str | Path, target: CausalLM) -> FrozenKVMtpHead:
    raw, state = read_checkpoint(path)
    cfg, tc = ModelConfig.from_json(raw), target.config
    Ht = raw.get("backbone_hidden_size")
    pre = state.get("pre_projection.weight")
    if (Ht != tc.hidden_size or pre is None
        or tuple(pre.shape) != (cfg.hidden_size, 2 * tc.hidden_size)):
        raise SpectraceError(f"FROZEN_KV_MTP checkpoint {path} does not fit the "
                             f"target: backbone_hidden_size {Ht}, pre_projection "
                             f"{None if pre is None else tuple(pre.shape)}; the "
                             f"target's hidden size is {tc.hidden_size}")
    if (cfg.head_dim, cfg.num_key_value_heads, cfg.vocab_size) != \
            (tc.head_dim, tc.num_key_value_heads, tc.vocab_size):
        raise SpectraceError(f"FROZEN_KV_MTP checkpoint {path} cannot read the target's "
                             f"KV: head_dim {cfg.head_dim}, {cfg.num_key_value_heads} "
                             f"KV heads, vocabulary {cfg.vocab_size}; the target has "
                             f"{tc.head_dim}, {tc.num_key_value_heads}, {tc.vocab_size}")
    return finish_loading(lambda: FrozenKVMtpHead(cfg, Ht, kv_layer=tc.num_hidden_layers - 1),
                          state, target, path, "FROZEN_KV_MTP assistant")


class FrozenKVMtpDrafter:
    """The EAGLE worker's draft loop (drafters/eagle_worker.py: draft_forward) with no KV of its
    own: every level's queries read the target's KV over the committed prefix."""

    kv = None  # no draft KV: the point of FROZEN_KV_MTP
    capture_layers: tuple[int, ...] = ()

    def __init__(self, head: FrozenKVMtpHead, target: CausalLM, target_kv: KVCache, num_steps: int,
                 topk: int = 1, num_draft_tokens: int | None = None, temperature: float = 1.0,
                 trace_topk: int = 5):
        self.head, self.embed, self.target_kv = head, target.model.embed_tokens, target_kv
        self.trace_topk = trace_topk
        self.num_steps, self.topk = num_steps, topk
        self.num_draft_tokens = num_draft_tokens or num_steps + 1
        # q = softmax(logits / T): T of the run when drafts are sampled, else 1
        self.temperature = temperature
        # req -> (H_t,) target feature of the root's row
        self.seed_feature: dict[int, torch.Tensor] = {}

    def draft_extend_for_prefill(self, items) -> None:
        """items: (req, prompt + first token, target features of the prompt rows): the last row
        produced the first token."""
        for req, _, f in items:
            self.seed_feature[req] = f[-1]

    def draft_extend(self, items) -> None:
        """items: (req, accept_tokens, features of the accepted rows): the last produced the bonus.
        Nothing runs: there is no assistant KV to extend."""
        self.draft_extend_for_prefill(items)

    def _forward(self, input_ids, hidden_states, seq_lens, reqs):
        """One assistant pass, every row at its request's root position (n rows per request)."""
        n = len(input_ids) // len(reqs)
        positions = torch.tensor([p for p in seq_lens for _ in range(n)], device=input_ids.device)
        rows = [(r, L, n) for r, L in zip(reqs, seq_lens)]
        h, logits = self.head(self.embed(input_ids), hidden_states, positions, self.target_kv, rows)
        return torch.softmax(logits / self.temperature, dim=-1), h

    @torch.no_grad()
    def draft(self, reqs: list[int], root_tokens: list[int], seq_lens: list[int],
              sampled=None) -> DraftTree:
        roots = torch.tensor(root_tokens, device=self.head.lm_head.weight.device)
        probs, hidden = self._forward(roots, torch.stack([self.seed_feature[r] for r in reqs]),
                                      seq_lens, reqs)

        # no scratch KV: the paths need no ancestry
        def forward(i, input_ids, hidden_states, parents):
            return self._forward(input_ids, hidden_states, seq_lens, reqs)

        levels = draft_forward(forward, probs, hidden, self.num_steps, self.topk, sampled)
        return build_draft_tree(levels, roots, seq_lens, self.num_draft_tokens, self.topk,
                                self.trace_topk, sampled, self.target_kv.backend)

    def release(self, req: int) -> None:
        self.seed_feature.pop(req, None)
