"""An explicit Llama-family forward (Llama, Mistral, Qwen2) over the paged KV cache.

The classes map one to one onto the transformers modules (and their state-dict keys), so any
Hugging Face checkpoint of these families loads, and tests compare logits with transformers'.
One `forward` serves every phase of the engine: prefill (EXTEND over a prompt), one-token
decode, and the multi-token verify pass with an arbitrary mask over prefix + new tokens.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from safetensors import SafetensorError

from spectrace.core.batch import ForwardBatch
from spectrace.core.config import ModelConfig, read_config_json
from spectrace.errors import SpectraceError
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


def apply_rope(x, cos, sin):
    """RoPE on queries or keys (..., heads, head_dim), cos/sin broadcast over the heads."""
    return x * cos + rotate_half(x) * sin


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

    def forward(self, x, cos, sin, batch: ForwardBatch, kv: KVCache):
        N = x.shape[0]
        q = apply_rope(self.q_proj(x).view(N, self.num_heads, self.head_dim), cos, sin)  # (N, h, d)
        k = apply_rope(self.k_proj(x).view(N, self.num_kv_heads, self.head_dim), cos, sin)  # (N, kvh, d)
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
    for req, seq_len, n, mask in zip(batch.req_pool_indices, batch.seq_lens, batch.extend_lens, batch.custom_masks):
        slots = kv.req_to_token[req, :seq_len]  # prefix + the new tokens, in position order
        if mask is None:  # causal: new token j sits at position seq_len - n + j
            mask = torch.ones(n, seq_len, dtype=torch.bool, device=q.device).tril(seq_len - n)
        if batch.batch_invariant:  # one row: only the keys it sees, the keys a one-token decode reads
            slots, mask = slots[mask[0]], None
        out[row:row + n] = attend(q[row:row + n], kv.pool.k[layer_id, slots], kv.pool.v[layer_id, slots], mask)
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
        self.layers = nn.ModuleList(DecoderLayer(cfg, Attention(cfg, i)) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (N, vocab) float32; (bs, vocab) with last_only
    hidden_states: torch.Tensor  # (N, H) after the final norm: what lm_head reads
    aux_hidden_states: list[torch.Tensor]  # (N, H) each: residual stream entering each captured layer


class KVCacheOwner:
    """Models that keep paged KV: one pool layer per decoder layer of `self.config`."""

    def new_kv_cache(self, name, style, num_slots, max_requests, max_context, cache_class=KVCache) -> KVCache:
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


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as a dict, state dict) of a HF directory, with one-line errors."""
    path = Path(path)
    raw = read_config_json(path)
    try:
        state = _read_state_dict(path)
    except (OSError, ValueError, SafetensorError) as e:  # unreadable or truncated weights
        raise SpectraceError(f"cannot load model from {path}: {str(e).splitlines()[0]}") from None
    return raw, {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}


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


def finish_loading(model: nn.Module, state: dict, target: CausalLM, path, what: str,
                   share_embedding: bool = False) -> nn.Module:
    """The tail of every drafter loader: keys checked strictly, weights loaded, the model moved to
    the target's device and dtype. share_embedding: `embed_tokens.weight` may be absent, and the
    target's stands in (EAGLE's own loader assumes the head shares the target's embedding)."""
    check_keys(model, state, path, what, optional=["embed_tokens.weight"] if share_embedding else ())
    if share_embedding:
        state.setdefault("embed_tokens.weight", target.model.embed_tokens.weight.detach().cpu())
    model.load_state_dict(state)
    p = target.lm_head.weight
    return model.to(device=p.device, dtype=p.dtype).eval()


@contextmanager
def skip_weight_init():
    """Build modules without filling their weights, which the checkpoint replaces anyway: the
    nn.init fills become no-ops while inside (transformers' `no_init_weights` does the same).
    Cheaper than building on the meta device, whose Python-level ops import torch._dynamo
    (about two seconds of a first run)."""
    names = ("uniform_", "normal_", "kaiming_uniform_", "zeros_", "ones_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fill in saved.items():
            setattr(nn.init, name, fill)


def load_model(path: str | Path, dtype=torch.float32, device="cpu") -> CausalLM:
    """Config from config.json, weights from the directory's files; the key set must match
    exactly (tied heads and RoPE buffers of old checkpoints aside)."""
    raw, state = read_checkpoint(path)
    cfg = ModelConfig.from_json(raw)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with skip_weight_init():
        model = CausalLM(cfg)
    check_keys(model, state, path, cfg.model_type, optional=["lm_head.weight"] if cfg.tie_word_embeddings else ())
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval()
