"""DFLASH (--algo dflash): a block drafter. One non-causal forward drafts block_size - 1 tokens.

    context   the target's hidden states after layers `target_layer_ids` (the input of layer
              id + 1), concatenated per committed token, projected once: ctx =
              hidden_norm(fc(feats));
              every draft layer turns ctx into extra keys and values with its own k_proj / v_proj
              ("KV injection"), cached per request as tokens commit
    block     [root, MASK, ..., MASK] (block_size tokens) through the TARGET's embedding, at
              positions prefix + 0 .. block_size - 1; each draft layer attends, without a causal
              mask, to the context keys and to the whole block
    drafts    argmax of the target's lm_head over the block's last block_size - 1 rows
verified as a chain (topk 1), as SGLang's DFLASH worker does (greedy; SGLang forces argmax drafts).

The layers are Qwen3-shaped as in z-lab/dflash (`DFlashDraftModel`): per-head q_norm / k_norm,
SwiGLU MLP; checkpoint keys `layers.{i}.self_attn.{q,k,v,o}_proj`, `.q_norm`, `.k_norm`,
`layers.{i}.mlp.*`, `layers.{i}.{input,post_attention}_layernorm`, `norm`, `fc`, `hidden_norm`;
config `block_size`, `num_target_layers`, `dflash_config: {mask_token_id, target_layer_ids}`.
Our config is Llama-typed (the target is a Llama); the keys are DFlash's.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from spectrace.core.config import ModelConfig
from spectrace.core.checkpoint import finish_loading, read_checkpoint
from spectrace.core.model import (CausalLM, DecoderLayer, RMSNorm, RotaryEmbedding, apply_rope,
                                  attend)
from spectrace.core.sampling import topk_pairs
from spectrace.core.tree import DraftTree, chain_tree
from spectrace.errors import SpectraceError


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule: one draft layer reads the middle layer; more spread from 1 to L - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 3 - 1
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


class DFlashAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.h, self.kvh, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.h * self.d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(H, self.kvh * self.d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(H, self.kvh * self.d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.h * self.d, H, bias=cfg.o_bias)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)

    def kv(self, x, cos, sin):
        """(N, T, H) -> keys (normed, rotated) and values (N, T, kvh, d)."""
        N, T, _ = x.shape
        k = apply_rope(self.k_norm(self.k_proj(x).view(N, T, self.kvh, self.d)), cos, sin)
        return k, self.v_proj(x).view(N, T, self.kvh, self.d)

    def forward(self, x, cos, sin, ctx_k, ctx_v, ctx_mask):
        """x (N, B, H) the block; ctx_k/v (N, T, kvh, d); ctx_mask (N, T): which context keys count.
        No causal mask inside the block: every row sees the whole block."""
        N, B, _ = x.shape
        q = apply_rope(self.q_norm(self.q_proj(x).view(N, B, self.h, self.d)), cos, sin)
        k, v = self.kv(x, cos, sin)
        # (N, T+B)
        visible = torch.cat([ctx_mask, torch.ones(N, B, dtype=torch.bool, device=x.device)], 1)
        out = attend(q, torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1), visible[:, None, :])
        return self.o_proj(out.reshape(N, B, self.h * self.d))


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg: ModelConfig, target_layer_ids: list[int], block_size: int,
                 mask_token_id: int):
        super().__init__()
        self.config, self.target_layer_ids = cfg, list(target_layer_ids)
        self.block_size, self.mask_token_id = block_size, mask_token_id
        H = cfg.hidden_size
        self.layers = nn.ModuleList([DecoderLayer(cfg, DFlashAttention(cfg))
                                     for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    @property
    # the output of layer i is the input of layer i + 1
    def capture_layers(self) -> tuple[int, ...]:
        return tuple(i + 1 for i in self.target_layer_ids)

    def _cos_sin(self, positions, dtype):  # positions (N, T) -> cos, sin (N, T, 1, d)
        cos, sin = self.rotary_emb(positions.flatten(), dtype)
        return cos.view(*positions.shape, 1, -1), sin.view(*positions.shape, 1, -1)

    def context_kv(self, feats, positions) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Target features (N, T, len(ids) * H) at positions (N, T) -> each layer's context keys
        and values (N, T, kvh, d)."""
        ctx = self.hidden_norm(self.fc(feats))
        cos, sin = self._cos_sin(positions, ctx.dtype)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, noise, positions, ctx_kv, ctx_mask):
        """noise (N, B, H) the block's embeddings at positions (N, B) -> (N, B, H), final-normed."""
        cos, sin = self._cos_sin(positions, noise.dtype)
        x = noise
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, ctx_mask)
        return self.norm(x)


def load_dflash(path: str | Path, target: CausalLM) -> DFlashDraftModel:
    raw, state = read_checkpoint(path)
    cfg, tc = ModelConfig.from_json(raw), target.config
    extra = raw.get("dflash_config") or {}
    L, block = raw.get("num_target_layers"), raw.get("block_size")
    mask = extra.get("mask_token_id", raw.get("mask_token_id"))
    if L != tc.num_hidden_layers or not block or block < 2 or mask is None:
        raise SpectraceError(f"DFLASH checkpoint {path} does not fit the target: "
                             f"num_target_layers {L} (the target has {tc.num_hidden_layers}), "
                             f"block_size {block}, mask_token_id {mask}")
    ids = (extra.get("target_layer_ids", raw.get("target_layer_ids"))
           or build_target_layer_ids(L, cfg.num_hidden_layers))
    if (cfg.hidden_size != tc.hidden_size or cfg.vocab_size != tc.vocab_size
        or not all(0 <= i < L - 1 for i in ids)):
        raise SpectraceError(f"DFLASH checkpoint {path} does not fit the target: hidden size "
                             f"{cfg.hidden_size}, vocabulary {cfg.vocab_size}, target layers {ids}")
    return finish_loading(lambda: DFlashDraftModel(cfg, ids, block, mask), state, target, path,
                          "DFLASH draft model")


class DFlashDrafter:
    kv = None  # the context K/V is kept per request below, not in a paged pool

    def __init__(self, model: DFlashDraftModel, target: CausalLM, trace_topk: int = 5):
        self.model, self.trace_topk = model, trace_topk
        self.embed, self.lm_head = target.model.embed_tokens, target.lm_head
        self.capture_layers = model.capture_layers
        self.num_steps, self.topk, self.num_draft_tokens = model.block_size - 1, 1, model.block_size
        # req -> per layer (k, v) (1, T, kvh, d)
        self.ctx: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @torch.no_grad()
    def _extend(self, req: int, feats: torch.Tensor) -> None:
        """Cache the context K/V of newly committed tokens, at the positions after the cached
        ones."""
        start = self.ctx[req][0][0].shape[1] if req in self.ctx else 0
        pos = torch.arange(start, start + len(feats), device=feats.device)
        new = self.model.context_kv(feats[None], pos[None])
        old = self.ctx.get(req)
        self.ctx[req] = new if old is None else [(torch.cat([k0, k], 1), torch.cat([v0, v], 1))
                                                 for (k0, v0), (k, v) in zip(old, new)]

    def draft_extend_for_prefill(self, items) -> None:
        for req, _, feats in items:  # the prompt's features, positions 0 .. len - 1
            self.ctx.pop(req, None)
            self._extend(req, feats)

    def draft_extend(self, items) -> None:
        for req, _, feats in items:  # the accepted rows: root .. last correct draft
            self._extend(req, feats)

    @torch.no_grad()
    def draft(self, reqs: list[int], root_tokens: list[int], seq_lens: list[int],
              sampled=None) -> DraftTree:
        B, m = self.model.block_size, self.model
        device = self.lm_head.weight.device
        probs = []
        for req, root, L in zip(reqs, root_tokens, seq_lens):
            ctx = self.ctx[req]
            assert ctx[0][0].shape[1] == L, "the context must cover every position before the root"
            block = torch.tensor([root] + [m.mask_token_id] * (B - 1), device=device)
            pos = torch.arange(L, L + B, device=device)
            h = m(self.embed(block)[None], pos[None], ctx,
                  torch.ones(1, L, dtype=torch.bool, device=device))
            probs.append(torch.softmax(self.lm_head(h[0, 1:]).float(), -1))  # (B-1, V)
        probs = torch.stack(probs)  # (bs, B-1, V): the drafts are each row's argmax
        q, drafts = probs.max(dim=-1)
        return chain_tree(drafts.tolist(), root_tokens, seq_lens, q=q,
                          draft_topk=topk_pairs(probs, self.trace_topk), device=device)

    def release(self, req: int) -> None:
        self.ctx.pop(req, None)
