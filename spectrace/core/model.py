"""An explicit Llama-family forward (Llama, Mistral, Qwen2, Qwen3) over the paged KV cache.

The classes map one to one onto the transformers modules (and their state-dict keys), so any
Hugging Face checkpoint of these families loads, and tests compare logits with transformers'.
The families differ in three places: Qwen2's q/k/v bias, Qwen3's RMSNorm over each head of q and
k (before RoPE), and Llama 3.1's RoPE frequencies (`llama3_inv_freq`). One `forward` serves every
phase of the engine: prefill (EXTEND over a prompt), one-token decode, and the multi-token verify
pass with an arbitrary mask over prefix + new tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from spectrace.core.batch import ForwardBatch
from spectrace.core.checkpoint import Progress, building, check_keys, load_weights, read_checkpoint
from spectrace.core.config import ModelConfig
from spectrace.core.kv import KVCache
from spectrace.errors import SpectraceError


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # (N, H), normalised in float32 as transformers does
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """RoPE on queries or keys (..., heads, head_dim), cos/sin broadcast over the heads."""
    return x * cos + rotate_half(x) * sin


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float,
                    high_freq_factor: float,
                    original_max_position_embeddings: int, **_) -> torch.Tensor:
    """Llama 3.1's RoPE scaling (transformers' `_compute_llama3_parameters`): frequencies whose
    wavelength is longer than the pre-training context / low_freq_factor are divided by `factor`,
    those shorter than context / high_freq_factor kept, and the band between blended smoothly."""
    old = original_max_position_embeddings
    low_wavelen, high_wavelen = old / low_freq_factor, old / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    between = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(between, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each (i, i + d/2) pair of a head by position * theta^(-2i/d); with `scaling`
    (config.rope_scaling, type llama3) those frequencies rescaled by llama3_inv_freq."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        # a plain float32 attribute, not a buffer: model.to(bfloat16) must not round the frequencies
        even = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32)
        inv_freq = 1.0 / (theta ** (even / head_dim))
        self.inv_freq = llama3_inv_freq(inv_freq, **scaling) if scaling else inv_freq

    def forward(self, positions, dtype):  # positions (N,) -> cos, sin (N, 1, head_dim)
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def attend(q, keys, values, mask=None, scale=None, logit_cap=0.0):
    """Scaled dot-product attention with grouped KV heads, the math every attention here shares.

    q (..., n, h, d); keys, values (..., S, kvh, d), each KV head serving h / kvh query heads;
    mask (..., n, S) bool, True where a query sees a key (None: every key). Scores are scaled by
    `scale` (default d^-1/2) and, with logit_cap > 0, soft-capped to cap * tanh(score / cap);
    softmax in float32, as transformers computes it. Returns (..., n, h, d)."""
    group = q.shape[-2] // keys.shape[-2]
    keys = keys.repeat_interleave(group, dim=-2)  # (..., S, h, d)
    values = values.repeat_interleave(group, dim=-2)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("...qhd,...khd->...hqk", q, keys) * scale  # (..., h, n, S)
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if mask is not None:
        scores = scores.masked_fill(~mask.unsqueeze(-3), float("-inf"))
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("...hqk,...khd->...qhd", probs, values)


class Attention(nn.Module):
    """Grouped-query attention reading every request's KV through `req_to_token`."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        H, D = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(H, self.num_heads * D, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(H, self.num_kv_heads * D, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(H, self.num_kv_heads * D, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * D, H, bias=cfg.o_bias)
        if cfg.qk_norm:  # Qwen3: each head of q and k normalised before RoPE
            self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(D, cfg.rms_norm_eps)

    def head_norms(self, q, k):
        """q (N, h, d), k (N, kvh, d), each head RMS-normalised where the model has
        q_norm/k_norm."""
        return (self.q_norm(q), self.k_norm(k)) if hasattr(self, "q_norm") else (q, k)

    def forward(self, x, cos, sin, batch: ForwardBatch, kv: KVCache):
        N = x.shape[0]
        q, k = self.head_norms(self.q_proj(x).view(N, self.num_heads, self.head_dim),
                               self.k_proj(x).view(N, self.num_kv_heads, self.head_dim))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # (N, h, d), (N, kvh, d)
        v = self.v_proj(x).view(N, self.num_kv_heads, self.head_dim)
        kv.pool.write(self.layer_id, batch.out_cache_loc, k, v)  # new tokens' KV into their slots
        out = ATTENTION[kv.backend](q, k, v, batch, kv, self.layer_id)
        return self.o_proj(out.view(N, self.num_heads * self.head_dim))


def paged_attention(q, k, v, batch: ForwardBatch, kv: KVCache, layer_id: int) -> torch.Tensor:
    """Each request's new tokens attend over its keys, read back through req_to_token (the new
    tokens' own K/V already written there), under its mask: q (N, h, d) -> (N, h, d). k, v are the
    new tokens' (N, kvh, d), for backends that read them directly (kernels/attention.py)."""
    out = torch.empty_like(q)
    row = 0
    for req, seq_len, n, mask in zip(batch.req_pool_indices, batch.seq_lens, batch.extend_lens,
                                     batch.custom_masks):
        slots = kv.req_to_token[req, :seq_len]  # prefix + the new tokens, in position order
        if mask is None:  # causal: new token j sits at position seq_len - n + j
            mask = torch.ones(n, seq_len, dtype=torch.bool, device=q.device).tril(seq_len - n)
        # one row: only the keys it sees, the keys a one-token decode reads
        if batch.batch_invariant:
            slots, mask = slots[mask[0]], None
        out[row:row + n] = attend(q[row:row + n], kv.pool.k[layer_id, slots],
                                  kv.pool.v[layer_id, slots], mask)
        row += n
    return out


# kv.backend -> the paged attention Attention.forward calls; kernels/backend.py adds "triton"
ATTENTION = {"explicit": paged_attention}


class MLP(nn.Module):  # SwiGLU
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, I = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(H, I, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(H, I, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(I, H, bias=cfg.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + MLP(norm(x)). The attention module is the
    one thing that varies: paged self-attention here, queries into the target's KV for
    FROZEN_KV_MTP, context-injected block attention for DFLASH; it gets `attn_args`."""

    def __init__(self, cfg: ModelConfig, self_attn: nn.Module):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, *attn_args):
        x = x + self.self_attn(self.input_layernorm(x), *attn_args)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):  # transformers' `model.` prefix
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, Attention(cfg, i))
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (N, vocab) float32; (bs, vocab) with last_only
    hidden_states: torch.Tensor  # (N, H) after the final norm: what lm_head reads
    # (N, H) each: residual stream entering each captured layer
    aux_hidden_states: list[torch.Tensor]


class KVCacheOwner:
    """Models that keep paged KV: one pool layer per decoder layer of `self.config`."""

    def new_kv_cache(self, name, style, num_slots, max_requests, max_context,
                     cache_class=KVCache) -> KVCache:
        """cache_class: KVCache, or kernels/kv.py's TritonKVCache for --backend triton."""
        cfg, p = self.config, next(self.parameters())
        return cache_class.create(name, style, len(self.layers), num_slots, cfg.num_key_value_heads,
                                  cfg.head_dim, max_requests, max_context, p.dtype, p.device)


class CausalLM(nn.Module, KVCacheOwner):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv: KVCache, capture_layers: tuple[int, ...] = (),
                last_only: bool = False) -> ForwardOutput:
        """`capture_layers`: ids i whose input (the output of layer i-1) is returned, as SGLang
        captures EAGLE-3's auxiliary hidden states. `last_only`: logits of each request's last
        row only (bs, V), as SGLang's LogitsProcessor prunes a prefill; else of every row.

        `batch.batch_invariant` (--deterministic): each row gets its own pass, in order, reading
        only the keys its mask shows, so every operation has the shapes of a one-token decode and
        a row's numbers do not depend on what it was batched with (a GPU or CPU matrix product
        picks its reduction order by the number of rows; attention by the number of keys)."""
        if batch.batch_invariant and len(batch.input_ids) > 1:
            outs = [self.forward(row, kv, capture_layers) for row in batch.rows()]
            logits = torch.cat([o.logits for o in outs])
            if last_only:
                logits = logits[torch.tensor(batch.extend_lens, device=logits.device).cumsum(0) - 1]
            return ForwardOutput(logits, torch.cat([o.hidden_states for o in outs]),
                                 [torch.cat(a) for a in zip(*(o.aux_hidden_states for o in outs))])
        x = self.model.embed_tokens(batch.input_ids)  # (N, H)
        cos, sin = self.model.rotary_emb(batch.positions, x.dtype)
        aux = []
        for i, layer in enumerate(self.model.layers):
            if i in capture_layers:
                aux.append(x)
            x = layer(x, cos, sin, batch, kv)
        x = self.model.norm(x)
        rows = x[torch.tensor(batch.extend_lens, device=x.device).cumsum(0) - 1] if last_only else x
        return ForwardOutput(self.lm_head(rows).float(), x, aux)

    @property
    def layers(self):
        return self.model.layers


def least_params(cfg: ModelConfig) -> int:
    """The parameters cfg builds, but for norms and biases: the embedding (and an untied head), and
    each layer's attention and MLP projections."""
    h, q, kv = (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim,
                cfg.num_key_value_heads * cfg.head_dim)
    layer = 2 * h * (q + kv) + 3 * h * cfg.intermediate_size
    embeddings = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return embeddings + cfg.num_hidden_layers * layer


def load_model(path: str | Path, dtype=torch.float32, device="cpu",
               progress: Progress | None = None) -> CausalLM:
    """Config from config.json, weights from the directory's files straight onto `device` in
    `dtype`; the key set must match exactly (a tied head's stray lm_head.weight and RoPE buffers of
    old checkpoints aside). progress(bytes loaded, bytes in all) hears each tensor land."""
    raw, weights = read_checkpoint(path)
    cfg = ModelConfig.from_json(raw)
    if cfg.tie_word_embeddings:  # lm_head is embed_tokens; transformers tolerates a stray copy
        weights.pop("lm_head.weight", None)
    stored, least = sum(math.prod(w.shape) for w in weights.values()), least_params(cfg)
    # refused before building: a config.json edited to 10**9 layers allocates nothing
    if least > 2 * stored:
        raise SpectraceError(f"checkpoint {path} does not match its config.json: the config makes "
                             f"at least {least:,} parameters, the weight files hold {stored:,}")
    with building(dtype, device):
        model = CausalLM(cfg)
    check_keys(model, weights, path, cfg.model_type,
               optional=["lm_head.weight"] if cfg.tie_word_embeddings else ())
    load_weights(model, weights, path, progress)
    return model.eval()
