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
then run the EAGLE loop (select_top_k_tokens, organize_draft_results, build_tree) on the
assistant's own hidden states; siblings never see each other, so no scratch KV is needed.

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
import torch.nn.functional as F

from spectrace.core.config import ModelConfig, SpectraceError
from spectrace.core.kv import KVCache
from spectrace.core.model import MLP, CausalLM, RMSNorm, RotaryEmbedding, check_keys, read_checkpoint, rotate_half
from spectrace.core.tree import DraftTree, beam_features, draft_tree


class FrozenKVAttention(nn.Module):
    """Queries of the assistant against the target's keys and values of one layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.o_bias)

    def forward(self, x, cos, sin, kv: KVCache, kv_layer: int, rows: list[tuple[int, int, int]]):
        """rows: (request, target KV length, n query rows) in row order; no mask: every query
        sees the whole committed prefix and nothing else."""
        q = self.q_proj(x).view(x.shape[0], self.num_heads, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        out, row = torch.empty_like(q), 0
        group = self.num_heads // self.num_kv_heads
        for req, seq_len, n in rows:
            slots = kv.req_to_token[req, :seq_len]
            keys = kv.pool.k[kv_layer, slots].repeat_interleave(group, dim=1)  # (S, h, d)
            values = kv.pool.v[kv_layer, slots].repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[row:row + n], keys) * self.head_dim ** -0.5
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out[row:row + n] = torch.einsum("hqk,khd->qhd", probs, values)
            row += n
        return self.o_proj(out.view(x.shape[0], -1))


class FrozenKVLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = FrozenKVAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class FrozenKVMtpHead(nn.Module):
    capture_layers: tuple[int, ...] = ()  # reads the target's last hidden state

    def __init__(self, cfg: ModelConfig, backbone_hidden_size: int, kv_layer: int):
        super().__init__()
        self.config, self.kv_layer = cfg, kv_layer
        H, Ht = cfg.hidden_size, backbone_hidden_size
        self.pre_projection = nn.Linear(2 * Ht, H, bias=False)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(FrozenKVLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.model.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_projection = nn.Linear(H, Ht, bias=False)
        self.lm_head = nn.Linear(H, cfg.vocab_size, bias=False)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

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
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, kv, self.kv_layer, rows)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.model.norm(x)
        return self.post_projection(x), self.lm_head(x).float()


def load_frozen_kv_mtp(path: str | Path, target: CausalLM) -> FrozenKVMtpHead:
    hf, state = read_checkpoint(path)
    cfg, tc = ModelConfig.from_hf(hf), target.config
    Ht = getattr(hf, "backbone_hidden_size", None)
    pre = state.get("pre_projection.weight")
    if Ht != tc.hidden_size or pre is None or tuple(pre.shape) != (cfg.hidden_size, 2 * tc.hidden_size):
        raise SpectraceError(f"FROZEN_KV_MTP checkpoint {path} does not fit the target: backbone_hidden_size "
                             f"{Ht}, pre_projection {None if pre is None else tuple(pre.shape)}; the target's "
                             f"hidden size is {tc.hidden_size}")
    if (cfg.head_dim, cfg.num_key_value_heads) != (tc.head_dim, tc.num_key_value_heads) or cfg.vocab_size != tc.vocab_size:
        raise SpectraceError(f"FROZEN_KV_MTP checkpoint {path} cannot read the target's KV: head_dim "
                             f"{cfg.head_dim}, {cfg.num_key_value_heads} KV heads, vocabulary {cfg.vocab_size}; the "
                             f"target has {tc.head_dim}, {tc.num_key_value_heads}, {tc.vocab_size}")
    head = FrozenKVMtpHead(cfg, Ht, kv_layer=tc.num_hidden_layers - 1)
    check_keys(head, state, path, "FROZEN_KV_MTP assistant")
    head.load_state_dict(state)
    p = target.lm_head.weight
    return head.to(device=p.device, dtype=p.dtype).eval()


class FrozenKVMtpDrafter:
    algo = "frozen_kv_mtp"
    kv = None  # no draft KV: the point of FROZEN_KV_MTP
    capture_layers: tuple[int, ...] = ()

    def __init__(self, head: FrozenKVMtpHead, target: CausalLM, num_steps: int, topk: int = 1,
                 num_draft_tokens: int | None = None, trace_topk: int = 5):
        self.head, self.embed, self.trace_topk = head, target.model.embed_tokens, trace_topk
        self.num_steps, self.topk = num_steps, topk
        self.num_draft_tokens = num_draft_tokens or num_steps + 1
        self.target_kv: KVCache | None = None
        self.temperature = 1.0  # q = softmax(logits / T); the engine sets T when drafts are sampled
        self.seed_feature: dict[int, torch.Tensor] = {}  # req -> (H_t,) target feature of the root's row

    def bind_target_kv(self, kv: KVCache) -> None:
        self.target_kv = kv

    def draft_extend_for_prefill(self, items) -> None:
        """items: (req, prompt + first token, target features of the prompt rows): the last row
        produced the first token."""
        for req, _, f in items:
            self.seed_feature[req] = f[-1]

    def draft_extend(self, items) -> None:
        """items: (req, accept_tokens, features of the accepted rows): the last produced the bonus.
        Nothing runs: there is no assistant KV to extend."""
        self.draft_extend_for_prefill(items)

    def draft(self, reqs: list[int], root_tokens: list[int], target_seq_lens: list[int],
              sampled=None) -> DraftTree:
        K, device = self.topk, self.head.lm_head.weight.device

        def run(input_ids, features, n):  # n rows per request, all at the root's position
            positions = torch.tensor([p for p in target_seq_lens for _ in range(n)], device=device)
            rows = [(r, L, n) for r, L in zip(reqs, target_seq_lens)]
            h, logits = self.head(self.embed(input_ids), features, positions, self.target_kv, rows)
            return h, torch.softmax(logits / self.temperature, dim=-1)

        roots = torch.tensor(root_tokens, device=device)
        h_prev, first = run(roots, torch.stack([self.seed_feature[r] for r in reqs]), 1)  # the seed

        def forward_beams(i, input_ids, parent_beam):
            nonlocal h_prev
            h_prev, probs = run(input_ids, beam_features(h_prev, i, parent_beam, K), K)
            return probs

        return draft_tree(first, forward_beams, roots, target_seq_lens, K, self.num_steps,
                          self.num_draft_tokens, self.trace_topk,
                          sampled)

    def release(self, req: int) -> None:
        self.seed_feature.pop(req, None)
