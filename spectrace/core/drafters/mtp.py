"""NEXTN / MTP: a DeepSeek-V3-style multi-token-prediction module as the draft head.

    x = eh_proj([enorm(embed(x_{t+1})); hnorm(h_t)])   a full decoder block   shared_head.norm
and the target's lm_head (shared, not stored). SGLang resolves NEXTN to its EAGLE worker, so
this head drafts trees exactly as EAGLE does (drafters/eagle_worker.py: EagleDrafter); only the head
differs. With one MTP module, deeper tree levels reuse it on its own normed output, as SGLang's
NextN draft loop does. Checkpoint keys: `embed_tokens`, `enorm`, `hnorm`, `eh_proj`,
`shared_head.norm` and `layers.0.*` (DeepSeek's `model.layers.{L}.` prefix removed).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from spectrace.core.config import ModelConfig
from spectrace.errors import SpectraceError
from spectrace.core.drafters.eagle import DraftHead
from spectrace.core.checkpoint import finish_loading, read_checkpoint
from spectrace.core.model import Attention, CausalLM, DecoderLayer, RMSNorm, RotaryEmbedding


class MtpHead(DraftHead):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.enorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(H, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(cfg, Attention(cfg, 0))])
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    def layer_input(self, input_ids, features):
        x = self.eh_proj(torch.cat([self.enorm(self.embed_tokens(input_ids)), self.hnorm(features)],
                                   dim=-1))
        return self.layers[0].input_layernorm(x), x

    def finish(self, h):
        return self.shared_head.norm(h)


def load_mtp(path: str | Path, target: CausalLM) -> MtpHead:
    raw, state = read_checkpoint(path)
    cfg = ModelConfig.from_json(raw)
    H = target.config.hidden_size
    eh = state.get("eh_proj.weight")
    if eh is None or tuple(eh.shape) != (H, 2 * H) or cfg.vocab_size != target.config.vocab_size:
        raise SpectraceError(f"MTP checkpoint {path} does not fit the target (hidden size {H}, "
                             f"vocabulary {target.config.vocab_size})")
    return finish_loading(lambda: MtpHead(cfg), state, target, path, "MTP module",
                          share_embedding=True)
