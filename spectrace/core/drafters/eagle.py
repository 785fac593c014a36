"""EAGLE (EAGLE-1 head, drafting EAGLE-2 trees): a one-layer head that extrapolates the target's
features.

The head reads pairs (feature f_t, token x_{t+1}): f_t is the target's last hidden state (after
its final norm, what its lm_head reads) at position t, and the pair sits at position t of the
head's own KV. One decoder layer turns fc([embed(x_{t+1}); f_t]) into h_t, an estimate of
f_{t+1}; the target's lm_head on h_t gives the draft distribution of x_{t+2}. Deeper levels of
the tree feed the head its own h instead of a target feature.

    prefill       pairs (f_0, x_1) .. (f_{L-1}, x_L): the prompt shifted by one, ending with the
                  first generated token
    DRAFT_EXTEND  pairs (f_root, d_1) .. (f_{d_c}, bonus): the accepted rows' features with the
                  step's accept_tokens, so the head's KV always matches the target's
Checkpoint: SafeAILab's EAGLE-1 layout (`fc.{weight,bias}`, `layers.0.*` without
`input_layernorm`, `embed_tokens.weight`), a Llama config of one layer; no lm_head of its own.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from spectrace.core.batch import ForwardBatch
from spectrace.core.config import ModelConfig, SpectraceError
from spectrace.core.drafters.scratch import TreeScratch
from spectrace.core.kv import KVCache
from spectrace.core.model import (CausalLM, DecoderLayer, KVCacheOwner, RotaryEmbedding, check_keys,
                                   read_checkpoint)
from spectrace.core.tree import DraftTree, beam_features, draft_tree


class EagleHead(nn.Module, KVCacheOwner):
    """The EAGLE-1 head; MTP and EAGLE-3 heads subclass it and change `layer_input`, `finish`
    and `compute_logits`, the three places where they differ."""

    capture_layers: tuple[int, ...] = ()  # target layers whose inputs are the features; () = last hidden

    def __init__(self, cfg: ModelConfig, fc_bias: bool = True):
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.fc = nn.Linear(2 * H, H, bias=fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(cfg, 0)])
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE's layer 0 has none: fc output is the input
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    def layer_input(self, input_ids: torch.Tensor, features: torch.Tensor):
        """(attention input, residual) of the decoder layer from tokens and features one position back."""
        x = self.fc(torch.cat([self.embed_tokens(input_ids), features], dim=-1))
        return self.layers[0].input_layernorm(x), x

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """What the next tree level is fed: EAGLE-1 uses the layer output as is."""
        return h

    def compute_logits(self, h: torch.Tensor, target_lm_head: nn.Module) -> torch.Tensor:
        """(N, target vocab) draft logits of what `forward` returned: EAGLE-1 reads the target's lm_head."""
        return target_lm_head(h).float()

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv: KVCache, features: torch.Tensor) -> torch.Tensor:
        """features (N, F): the target's (or the head's own) hidden state one position back.
        Returns h (N, H), fed to the next level and read by `compute_logits`."""
        layer = self.layers[0]
        attn_in, x = self.layer_input(batch.input_ids, features)
        cos, sin = self.rotary_emb(batch.positions, x.dtype)
        x = x + layer.self_attn(attn_in, cos, sin, batch, kv)
        return self.finish(x + layer.mlp(layer.post_attention_layernorm(x)))


def load_eagle(path: str | Path, target: CausalLM) -> EagleHead:
    """Strict: every key of the EAGLE-1 layout must be there and nothing else
    (`embed_tokens.weight` may be absent: it is the target's, as EAGLE's own loader assumes)."""
    hf, state = read_checkpoint(path)
    cfg = ModelConfig.from_hf(hf)
    H = target.config.hidden_size
    fc = state.get("fc.weight")
    if fc is None or tuple(fc.shape) != (cfg.hidden_size, 2 * H) or cfg.hidden_size != H:
        shape = None if fc is None else tuple(fc.shape)
        raise SpectraceError(f"EAGLE checkpoint {path} does not fit the target: fc.weight is {shape}, "
                             f"expected ({H}, {2 * H}) for hidden size {H}")
    if cfg.vocab_size != target.config.vocab_size:
        raise SpectraceError(f"EAGLE checkpoint {path} has vocabulary {cfg.vocab_size}, the target {target.config.vocab_size}")
    head = EagleHead(cfg, fc_bias="fc.bias" in state)
    check_keys(head, state, path, "EAGLE-1 head", optional=["embed_tokens.weight"])
    state.setdefault("embed_tokens.weight", target.model.embed_tokens.weight.detach().cpu())
    head.load_state_dict(state)
    p = target.lm_head.weight
    return head.to(device=p.device, dtype=p.dtype).eval()


class EagleDrafter:
    algo = "eagle"

    def __init__(self, head: EagleHead, target: CausalLM, kv: KVCache, num_steps: int, topk: int = 1,
                 num_draft_tokens: int | None = None, trace_topk: int = 5):
        self.head, self.lm_head, self.kv, self.trace_topk = head, target.lm_head, kv, trace_topk
        self.capture_layers = head.capture_layers
        self.temperature = 1.0  # q = softmax(logits / T); the engine sets T when drafts are sampled
        self.num_steps, self.topk = num_steps, topk
        self.num_draft_tokens = num_draft_tokens or num_steps + 1
        self.next_probs: dict[int, torch.Tensor] = {}  # req -> (vocab,) draft distribution after the root
        self.last_hidden: dict[int, torch.Tensor] = {}  # req -> (H,) the head's h at the root

    @torch.no_grad()
    def _probs(self, h: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.head.compute_logits(h, self.lm_head) / self.temperature, dim=-1)

    def _extend(self, items: list[tuple[int, list[int], torch.Tensor]]) -> None:
        batch = ForwardBatch.build(self.kv, [(req, self.kv.seq_lens[req], toks) for req, toks, _ in items])
        h = self.head(batch, self.kv, torch.cat([f for _, _, f in items]))
        end = 0
        for req, toks, _ in items:
            self.kv.commit(req, self.kv.seq_lens[req], len(toks), list(range(len(toks))))
            end += len(toks)
            self.last_hidden[req] = h[end - 1]
            self.next_probs[req] = self._probs(h[end - 1])

    def draft_extend_for_prefill(self, items: list[tuple[int, list[int], torch.Tensor]]) -> None:
        """items: (req, prompt + first token, target features of the prompt rows (L, H))."""
        self._extend([(req, toks[1:], f) for req, toks, f in items])

    def draft_extend(self, items: list[tuple[int, list[int], torch.Tensor]]) -> None:
        """items: (req, accept_tokens, target features of the accepted rows: root .. last correct)."""
        self._extend(items)

    def draft(self, reqs: list[int], root_tokens: list[int], target_seq_lens: list[int],
              sampled=None) -> DraftTree:
        K = self.topk
        # the head's KV ends at the root's position: level-0 pairs (h_root, d) sit right there
        scratch = TreeScratch(self.kv, reqs, K, self.num_steps, [self.kv.seq_lens[r] for r in reqs])
        h_prev = torch.stack([self.last_hidden[r] for r in reqs])  # (bs, H)

        def forward_beams(i, input_ids, parent_beam):
            nonlocal h_prev
            feats = beam_features(h_prev, i, parent_beam, K)
            h_prev = self.head(scratch.batch(i, input_ids, parent_beam), self.kv, feats)  # (bs*K, H)
            return self._probs(h_prev)

        first = torch.stack([self.next_probs[r] for r in reqs])
        tree = draft_tree(first, forward_beams, torch.tensor(root_tokens, device=first.device),
                          target_seq_lens, K, self.num_steps, self.num_draft_tokens, self.trace_topk,
                          sampled)
        scratch.release()
        return tree

    def release(self, req: int) -> None:
        self.kv.release(req)
        self.next_probs.pop(req, None)
        self.last_hidden.pop(req, None)
