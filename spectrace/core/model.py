"""An explicit Llama-family forward (Llama, Mistral, Qwen2) over the paged KV cache.

The classes map one to one onto the transformers modules (and their state-dict keys), so any
Hugging Face checkpoint of these families loads, and tests compare logits with transformers'.
One `forward` serves every phase of the engine: prefill (EXTEND over a prompt), one-token
decode, and the multi-token verify pass with an arbitrary mask over prefix + new tokens.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from spectrace.core.batch import ForwardBatch
from spectrace.core.config import ModelConfig, SpectraceError
from spectrace.core.kv import KVCache


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


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each (i, i + d/2) pair of a head by position * theta^(-2i/d)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        # a plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))

    def forward(self, positions, dtype):  # positions (N,) -> cos, sin (N, 1, head_dim)
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


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

    def forward(self, x, cos, sin, batch: ForwardBatch, kv: KVCache):
        N = x.shape[0]
        q = self.q_proj(x).view(N, self.num_heads, self.head_dim)  # (N, h, d)
        k = self.k_proj(x).view(N, self.num_kv_heads, self.head_dim)  # (N, kvh, d)
        v = self.v_proj(x).view(N, self.num_kv_heads, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        kv.pool.write(self.layer_id, batch.out_cache_loc, k, v)  # new tokens' KV into their slots

        out = torch.empty_like(q)
        group = self.num_heads // self.num_kv_heads
        row = 0
        for req, seq_len, n, mask in zip(batch.req_pool_indices, batch.seq_lens, batch.extend_lens,
                                          batch.custom_masks):
            slots = kv.req_to_token[req, :seq_len]  # prefix + the new tokens, in position order
            keys = kv.pool.k[self.layer_id, slots].repeat_interleave(group, dim=1)  # (S, h, d)
            values = kv.pool.v[self.layer_id, slots].repeat_interleave(group, dim=1)
            qs = q[row:row + n]  # (n, h, d)
            scores = torch.einsum("qhd,khd->hqk", qs, keys) * self.head_dim ** -0.5  # (h, n, S)
            if mask is None:  # causal: new token j sits at position seq_len - n + j
                mask = torch.ones(n, seq_len, dtype=torch.bool, device=x.device).tril(seq_len - n)
            scores = scores.masked_fill(~mask, float("-inf"))
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out[row:row + n] = torch.einsum("hqk,khd->qhd", probs, values)
            row += n
        return self.o_proj(out.view(N, self.num_heads * self.head_dim))


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
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, batch, kv):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):  # transformers' `model.` prefix
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (N, vocab) float32
    hidden_states: torch.Tensor  # (N, H) after the final norm: what lm_head reads
    aux_hidden_states: list[torch.Tensor]  # (N, H) each: residual stream entering each captured layer


class KVCacheOwner:
    """Models that keep paged KV: one pool layer per decoder layer of `self.config`."""

    def new_kv_cache(self, name, style, num_slots, max_requests, max_context) -> KVCache:
        cfg, p = self.config, next(self.parameters())
        return KVCache.create(name, style, len(self.layers), num_slots, cfg.num_key_value_heads,
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
    def forward(self, batch: ForwardBatch, kv: KVCache, capture_layers: tuple[int, ...] = ()) -> ForwardOutput:
        """`capture_layers`: ids i whose input (the output of layer i-1) is returned, as SGLang
        captures EAGLE-3's auxiliary hidden states."""
        x = self.model.embed_tokens(batch.input_ids)  # (N, H)
        cos, sin = self.model.rotary_emb(batch.positions, x.dtype)
        aux = []
        for i, layer in enumerate(self.model.layers):
            if i in capture_layers:
                aux.append(x)
            x = layer(x, cos, sin, batch, kv)
        x = self.model.norm(x)
        return ForwardOutput(self.lm_head(x).float(), x, aux)

    @property
    def layers(self):
        return self.model.layers


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Weights of a HF directory: safetensors (single or sharded), else a weights-only torch file."""
    from safetensors.torch import load_file

    if (path / "model.safetensors").is_file():
        return load_file(path / "model.safetensors")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        state = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(path / shard))
        return state
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise SpectraceError(f"{path} holds no model.safetensors or pytorch_model.bin")


def weights_digest(path: Path) -> str:
    """Short SHA-256 of a checkpoint's weight files: the model identity a trace records."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("*.bin")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def read_checkpoint(path: str | Path):
    """(transformers config, state dict) of a HF directory, with one-line errors."""
    from transformers import AutoConfig

    path = Path(path)
    if not (path / "config.json").is_file():
        raise SpectraceError(f"model directory {path} not found or has no config.json")
    try:
        hf = AutoConfig.from_pretrained(path)
        state = _read_state_dict(path)
    except (OSError, ValueError) as e:  # unreadable config or weights
        raise SpectraceError(f"cannot load model from {path}: {str(e).splitlines()[0]}") from None
    return hf, {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}


def check_keys(model: nn.Module, state: dict, path, what: str, optional=()) -> None:
    """The checkpoint's keys must be exactly the model's (keys in `optional` may be absent), each
    with the shape the config gives."""
    expected = model.state_dict()
    missing = sorted(expected.keys() - state.keys() - set(optional))
    unexpected = sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise SpectraceError(f"checkpoint {path} is not a {what}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise SpectraceError(f"checkpoint {path} does not match its config.json: {k} is {tuple(v.shape)}, "
                                 f"the config makes it {tuple(expected[k].shape)}")


def load_model(path: str | Path, dtype=torch.float32, device="cpu") -> CausalLM:
    """Config through `transformers.AutoConfig`, weights from the directory's files; the key set
    must match exactly (tied heads and RoPE buffers of old checkpoints aside)."""
    hf, state = read_checkpoint(path)
    cfg = ModelConfig.from_hf(hf)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = CausalLM(cfg)
    check_keys(model, state, path, cfg.model_type, optional=["lm_head.weight"] if cfg.tie_word_embeddings else ())
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)  # built off the meta device
    return model.to(device=device, dtype=dtype).eval()
