"""EAGLE (EAGLE-1 head, drafting EAGLE-2 trees): a one-layer head that extrapolates the target's
features. The head is here; it drafts through drafters/eagle_worker.py (EagleDrafter).

The head reads pairs (feature f_t, token x_{t+1}): f_t is the target's last hidden state (after
its final norm, what its lm_head reads) at position t, and the pair sits at position t of the
head's own KV. One decoder layer turns fc([embed(x_{t+1}); f_t]) into h_t, an estimate of
f_{t+1}; the target's lm_head on h_t gives the draft distribution of x_{t+2}. Deeper levels of
the tree feed the head its own h instead of a target feature.

Checkpoint: SafeAILab's EAGLE-1 layout (`fc.weight`, `fc.bias` unless the config says `"bias":
false` as EAGLE-LLaMA3-Instruct-8B's does, `layers.0.*` without `input_layernorm`,
`embed_tokens.weight`), a Llama config of one layer with its own RoPE (the Llama-3 head: theta
500000, no llama3 scaling); no lm_head of its own.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from spectrace.core.batch import ForwardBatch
from spectrace.core.config import ModelConfig
from spectrace.core.kv import KVCache
from spectrace.core.checkpoint import finish_loading, read_checkpoint
from spectrace.core.model import Attention, CausalLM, DecoderLayer, KVCacheOwner, RotaryEmbedding
from spectrace.errors import SpectraceError


class DraftHead(nn.Module, KVCacheOwner):
    """What the EAGLE-1, NEXTN/MTP and EAGLE-3 heads share: one decoder layer over (token,
    feature) pairs in the head's own KV. Each head says `layer_input` (how token and feature
    enter the layer) and may change `finish` (what the next level is fed) and `compute_logits`."""

    # target layers whose inputs are the features; () = last hidden
    capture_layers: tuple[int, ...] = ()

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """What the next tree level is fed: the layer output as is."""
        return h

    # target id of each id of the head's own vocabulary; None: the target's
    vocab_ids: torch.Tensor | None = None

    def vocab_logits(self, h: torch.Tensor, target_lm_head: nn.Module) -> torch.Tensor:
        """(N, the head's vocab) draft logits of what `forward` returned, in the model's dtype: the
        target's lm_head."""
        return target_lm_head(h)

    def compute_logits(self, h: torch.Tensor, target_lm_head: nn.Module) -> torch.Tensor:
        """(N, target vocab) float32 draft logits: vocab_logits over the target's vocabulary."""
        return self.vocab_logits(h, target_lm_head).float()

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv: KVCache, features: torch.Tensor) -> torch.Tensor:
        """features (N, F): the target's (or the head's own) hidden state one position back.
        Returns h (N, H), fed to the next level and read by `compute_logits`."""
        layer = self.layers[0]
        attn_in, x = self.layer_input(batch.input_ids, features)
        cos, sin = self.rotary_emb(batch.positions, x.dtype)
        x = x + layer.self_attn(attn_in, cos, sin, batch, kv)
        return self.finish(x + layer.mlp(layer.post_attention_layernorm(x)))


class EagleHead(DraftHead):
    """The EAGLE-1 head: fc over [embedding; feature], a decoder layer without input_layernorm."""

    def __init__(self, cfg: ModelConfig, fc_bias: bool = True):
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.fc = nn.Linear(2 * H, H, bias=fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(cfg, Attention(cfg, 0))])
        # EAGLE's layer 0 has none: fc output is the input
        self.layers[0].input_layernorm = nn.Identity()
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    def layer_input(self, input_ids: torch.Tensor, features: torch.Tensor):
        """(attention input, residual) of the decoder layer from tokens and features one position
        back."""
        x = self.fc(torch.cat([self.embed_tokens(input_ids), features], dim=-1))
        return self.layers[0].input_layernorm(x), x


def load_eagle(path: str | Path, target: CausalLM) -> EagleHead:
    """Strict: every key of the EAGLE-1 layout must be there and nothing else
    (`embed_tokens.weight` may be absent: it is the target's, as EAGLE's own loader assumes)."""
    raw, state = read_checkpoint(path)
    cfg = ModelConfig.from_json(raw)
    H = target.config.hidden_size
    fc = state.get("fc.weight")
    if fc is None or tuple(fc.shape) != (cfg.hidden_size, 2 * H) or cfg.hidden_size != H:
        shape = None if fc is None else tuple(fc.shape)
        raise SpectraceError(f"EAGLE checkpoint {path} does not fit the target: fc.weight is "
                             f"{shape}, expected ({H}, {2 * H}) for hidden size {H}")
    if cfg.vocab_size != target.config.vocab_size:
        raise SpectraceError(f"EAGLE checkpoint {path} has vocabulary {cfg.vocab_size}, "
                             f"the target {target.config.vocab_size}")
    bias = bool(raw.get("bias", True))  # SafeAILab's default when the config says nothing
    what = f"EAGLE-1 head (fc {'with' if bias else 'without'} bias, as its config says)"
    return finish_loading(lambda: EagleHead(cfg, fc_bias=bias), state, target, path, what,
                          share_embedding=True)
