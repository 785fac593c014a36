"""EAGLE-3: the head reads the target's low, middle and high features and drafts over its own,
smaller vocabulary.

    features   the residual stream entering target layers 2, L//2 and L-3, concatenated (3 H_t):
               `CausalLM.forward(capture_layers=...)`, as SGLang's `set_eagle3_layers_to_capture`
    fc         3 H_t -> H, applied only to target features; deeper tree levels feed the head its
               own H-wide output, which skips fc (SGLang: `if hidden.shape[-1] != embeds.shape[-1]`)
    midlayer   q/k/v read cat(input_layernorm(embed(x)), hidden_norm(h)) (2H wide); the residual
               stream is h; the rest is a Llama layer
    head       lm_head(norm(h)) over draft_vocab_size tokens; draft id i is target id i + d2t[i]
               (SGLang's hot_token_id); other target ids get -inf, as in vLLM

Unlike EAGLE-1, the level output fed forward is taken before `norm` (SafeAILab's `cnets.Model`
returns both). Checkpoints: SafeAILab's, SGLang/SpecForge's and vLLM speculators' layouts
(drafters/eagle3_layouts.py), `embed_tokens.weight` optional (the target's is shared).
With `norm_before_residual` (speculators' option) the residual stream is hidden_norm(h).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from spectrace.core.checkpoint import finish_loading, read_checkpoint
from spectrace.core.config import ModelConfig
from spectrace.core.drafters.eagle import DraftHead
from spectrace.core.drafters.eagle3_layouts import read_layout, rename
from spectrace.core.model import Attention, CausalLM, DecoderLayer, RMSNorm, RotaryEmbedding
from spectrace.errors import SpectraceError


class Eagle3Head(DraftHead):
    def __init__(self, cfg: ModelConfig, draft_vocab_size: int, target_hidden_size: int,
                 capture_layers: tuple[int, ...], norm_before_residual: bool = False):
        super().__init__()
        self.config = cfg
        self.norm_before_residual = norm_before_residual
        H = cfg.hidden_size
        self.capture_layers = tuple(capture_layers)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.fc = nn.Linear(len(capture_layers) * target_hidden_size, H, bias=False)
        self.midlayer = DecoderLayer(cfg, Attention(cfg, 0))
        attn = self.midlayer.self_attn  # q/k/v read [embedding; feature]: twice as wide
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * H, old.out_features, bias=old.bias is not None))
        self.midlayer.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    @property
    def layers(self):  # one pool layer for the draft KV, as for EAGLE-1
        return [self.midlayer]

    @property
    def hot_token_id(self) -> torch.Tensor:
        """Target id of each draft id."""
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    def layer_input(self, input_ids, features):
        h = self.fc(features) if features.shape[-1] != self.config.hidden_size else features
        emb = self.midlayer.input_layernorm(self.embed_tokens(input_ids))
        normed = self.midlayer.hidden_norm(h)
        return torch.cat([emb, normed], dim=-1), normed if self.norm_before_residual else h

    @property
    def vocab_ids(self) -> torch.Tensor:
        return self.hot_token_id

    def vocab_logits(self, h, target_lm_head=None):
        return self.lm_head(self.norm(h))  # (..., draft vocab)

    def compute_logits(self, h, target_lm_head=None):
        draft_logits = self.vocab_logits(h).float()
        logits = draft_logits.new_full((*h.shape[:-1], self.config.vocab_size), float("-inf"))
        logits[..., self.hot_token_id] = draft_logits
        return logits


def load_eagle3(path: str | Path, target: CausalLM) -> Eagle3Head:
    """Strict loading of any of the three layouts: every weight the layout names, nothing else,
    each of the shape the config gives; one line for a head made for another target."""
    raw, stored = read_checkpoint(path)
    tc = target.config
    layout = read_layout(raw, tc.num_hidden_layers, path)
    cfg, weights = ModelConfig.from_json(layout.layer_config), rename(stored, layout, path)
    Ht, capture, draft_vocab = tc.hidden_size, layout.capture_layers, layout.draft_vocab_size
    if cfg.num_hidden_layers != 1:
        raise SpectraceError(f"EAGLE-3 checkpoint {path}: num_hidden_layers is "
                             f"{cfg.num_hidden_layers}; spectrace "
                             "runs one-layer heads, as SGLang does")
    fc = weights.get("fc.weight")
    want = (cfg.hidden_size, len(capture) * Ht)
    if layout.target_hidden_size != Ht:
        raise SpectraceError(f"EAGLE-3 checkpoint {path} does not fit the target: "
                             f"it was made for a target of hidden size "
                             f"{layout.target_hidden_size}; this target's is {Ht}")
    if fc is None or tuple(fc.shape) != want:
        shape = None if fc is None else tuple(fc.shape)
        eagle1 = shape == (cfg.hidden_size, 2 * Ht)  # fc over [embedding; one feature]
        raise SpectraceError(f"EAGLE-3 checkpoint {path} does not fit the target: its "
                             f"fc.weight is {shape}, and over the target's {len(capture)} "
                             f"feature taps of width {Ht} it must be {want}"
                             + (" (an fc over two hidden widths is an EAGLE-1 "
                                "head: use --algo eagle)" if eagle1 else ""))
    if cfg.vocab_size != tc.vocab_size:
        raise SpectraceError(f"EAGLE-3 checkpoint {path} has vocabulary {cfg.vocab_size}, the "
                             f"target {tc.vocab_size}")
    if any(not 0 <= i < tc.num_hidden_layers for i in capture):
        raise SpectraceError(f"EAGLE-3 checkpoint {path} taps the inputs of layers "
                             f"{list(capture)}; the target has {tc.num_hidden_layers}")
    # no vocabulary map: the identity
    whole_vocab = draft_vocab == cfg.vocab_size and "d2t" not in weights
    if whole_vocab:
        weights.pop("t2d", None)
    head = finish_loading(lambda: Eagle3Head(cfg, draft_vocab, Ht, capture,
                                             layout.norm_before_residual),
                          weights, target, path, f"EAGLE-3 head ({layout.name} layout)",
                          share_embedding=cfg.hidden_size == Ht,
                          optional=("d2t", "t2d") if whole_vocab else ())
    if whole_vocab:
        head.d2t.zero_()
        head.t2d.fill_(True)
    hot = head.hot_token_id
    if hot.min() < 0 or hot.max() >= cfg.vocab_size or not head.t2d[hot].all():
        raise SpectraceError(f"EAGLE-3 checkpoint {path}: d2t maps "
                             f"draft ids outside the vocabulary or t2d")
    return head
