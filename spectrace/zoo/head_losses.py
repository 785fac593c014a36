"""The embedded heads' training losses (zoo/train_eagle.py trains with them).

Drafting feeds a head its own outputs from the second tree level on, so training unrolls the same
way: EAGLE-3's training-time test. Level j (1-based) at anchor t reads token x_{t+j} with the
target feature f_t (level 1) or level j-1's output at the same anchor, and predicts the target's
distribution after x_{t+j}. Attention sees what it sees while drafting a chain:
    EAGLE-1, MTP, EAGLE-3  level-1 keys at anchors <= t (the committed prefix, read from target
                           features) and the keys of levels 2..j at anchor t only (the path's
                           ancestors in the scratch KV); level j sits at position t + j - 1
    FROZEN_KV_MTP          the target's last-layer keys at positions <= t; every level sits at t + 1
Losses: EAGLE-1 and MTP: KL(target || head) + smooth-L1 regression of the output on f_{t+j}
(EAGLE-1's feature loss); EAGLE-3: cross-entropy against the target restricted to the draft
vocabulary, where the target's argmax lies in it (SafeAILab's `traineagle3`); FROZEN_KV_MTP: KL.
Medusa heads do not unroll: head k reads the target's h_t and learns KL against the target's
distribution for x_{t+k+2} (self-distillation), all heads weighted alike. DFLASH: blocks
[x_a, MASK, ...] at random anchors a, attending to the target features of positions < a (as
when drafting after committing x_{<a}); block row k learns KL against the target's distribution
for x_{a+k}, every row weighted alike.
The training forward is dense; tests check it equals the paged forward the engine runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from spectrace.core.drafters.dflash import DFlashDraftModel
from spectrace.core.drafters.eagle import EagleHead
from spectrace.core.drafters.frozen_kv_mtp import FrozenKVMtpHead
from spectrace.core.drafters.medusa import MedusaHeads
from spectrace.core.model import apply_rope

DFLASH_ANCHORS = 16  # DFLASH's training blocks per sequence


def _attend(q, keys, values, diag=()):
    """q (B, n, h, d) at anchors 0..n-1; keys/values (B, n, kvh, d) visible at anchors <= the
    query's; diag: (k, v) pairs seen only at the query's own anchor. Returns (B, n, h, d)."""
    B, n, h, d = q.shape
    group = h // keys.shape[2]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, keys.repeat_interleave(group, 2)) * d ** -0.5
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    extra = [torch.einsum("bqhd,bqhd->bhq", q, k.repeat_interleave(group, 2)).unsqueeze(-1) * d ** -0.5
             for k, _ in diag]
    probs = torch.softmax(torch.cat([scores, *extra], dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", probs[..., :n], values.repeat_interleave(group, 2))
    for i, (_, v) in enumerate(diag):
        out = out + probs[..., n + i].transpose(1, 2).unsqueeze(-1) * v.repeat_interleave(group, 2)
    return out


def eagle_level(head: EagleHead, ids, feats, j: int, past: list):
    """Level j of an EAGLE-1 / MTP / EAGLE-3 head: ids (B, n), feats (B, n, F) -> (B, n, H).
    `past` collects each level's (k, v): level 1's are the prefix, later ones the ancestors."""
    B, n = ids.shape
    layer = head.layers[0]
    attn = layer.self_attn
    attn_in, x = head.layer_input(ids, feats)
    cos, sin = head.rotary_emb(torch.arange(n, device=ids.device) + j - 1, x.dtype)  # (n, 1, d)
    q = apply_rope(attn.q_proj(attn_in).view(B, n, attn.num_heads, attn.head_dim), cos, sin)
    k = apply_rope(attn.k_proj(attn_in).view(B, n, attn.num_kv_heads, attn.head_dim), cos, sin)
    v = attn.v_proj(attn_in).view(B, n, attn.num_kv_heads, attn.head_dim)
    past.append((k, v))
    o = _attend(q, *past[0], past[1:])
    x = x + attn.o_proj(o.reshape(B, n, -1))
    return head.finish(x + layer.mlp(layer.post_attention_layernorm(x)))


def frozen_level(head: FrozenKVMtpHead, embeds, feats, target_k, target_v):
    """One level of the FROZEN_KV_MTP assistant, every anchor t at position t + 1 over the target's
    keys at positions <= t: embeds, feats (B, n, H_t); target_k/v (B, n, kvh, d) post-RoPE.
    Returns (hidden fed forward (B, n, H_t), logits (B, n, V))."""
    B, n = feats.shape[:2]
    x = head.pre_projection(torch.cat([embeds, feats], dim=-1))
    cos, sin = head.rotary_emb(torch.arange(n, device=x.device) + 1, x.dtype)
    for layer in head.model.layers:
        attn = layer.self_attn
        q = apply_rope(attn.q_proj(layer.input_layernorm(x)).view(B, n, attn.num_heads, attn.head_dim), cos, sin)
        x = x + attn.o_proj(_attend(q, target_k, target_v).reshape(B, n, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = head.model.norm(x)
    return head.post_projection(x), head.lm_head(x)


def medusa_losses(heads: MedusaHeads, feats, target_logits):
    """Head k on h_t against the target's distribution after x_{t+k+1}: per head (KL, agreement)."""
    T, out = feats.shape[1], []
    for k, head in enumerate(heads.medusa_head):
        logits, tgt = head(feats[:, :T - k - 1]).float(), target_logits[:, k + 1:].float()
        loss = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(tgt, -1), log_target=True,
                        reduction="none").sum(-1).mean()
        out.append((loss, (logits.argmax(-1) == tgt.argmax(-1)).float().mean()))
    return out


def dflash_losses(model: DFlashDraftModel, target, ids, feats, target_logits, gen: torch.Generator):
    """Blocks at DFLASH_ANCHORS random anchors per sequence: per block row (KL, agreement)."""
    N, T = ids.shape[0], feats.shape[1]
    B, A, dev = model.block_size, DFLASH_ANCHORS, feats.device
    anchors = torch.randint(1, T - B + 2, (N, A), generator=gen).to(dev)  # rows a .. a+B-2 have targets
    pos = torch.arange(T, device=dev)
    ctx_kv = [(k.repeat_interleave(A, 0), v.repeat_interleave(A, 0))
              for k, v in model.context_kv(feats, pos.expand(N, T))]
    ctx_mask = pos[None, :] < anchors.reshape(-1, 1)  # (N*A, T): the committed prefix only
    block_pos = anchors.reshape(-1, 1) + torch.arange(B, device=dev)  # (N*A, B)
    block = torch.full((N * A, B), model.mask_token_id, device=dev)
    block[:, 0] = torch.gather(ids, 1, anchors).reshape(-1)
    h = model(target.model.embed_tokens(block), block_pos, ctx_kv, ctx_mask)
    logits = target.lm_head(h[:, 1:]).float()  # (N*A, B-1, V): row k predicts x_{a+k}
    rows = block_pos[:, :-1].reshape(N, A * (B - 1))  # the target's prediction of x_{a+k} sits at a+k-1
    tgt = torch.gather(target_logits.float(), 1, rows[..., None].expand(-1, -1, target_logits.shape[-1]))
    tgt = tgt.view(N * A, B - 1, -1)
    kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(tgt, -1), log_target=True, reduction="none").sum(-1)
    agree = (logits.argmax(-1) == tgt.argmax(-1)).float()
    return [(kl[:, k].mean(), agree[:, k].mean()) for k in range(B - 1)]


def unrolled_losses(kind, head, target, ids, feats, target_logits, target_kv, unroll: int, reg_weight: float):
    """ids (B, T+1) tokens; feats (B, T, F) target features; target_logits (B, T, V) at each
    position; target_kv: the target's last-layer (k, v) (B, T, kvh, d), for FROZEN_KV_MTP.
    Returns per-level (loss, top-1 agreement with the target)."""
    n = feats.shape[1] - unroll  # anchors every level has a target for
    inputs, past, out = feats[:, :n], [], []
    for j in range(1, unroll + 1):
        tok, tgt = ids[:, j:j + n], target_logits[:, j:j + n].float()
        if kind == "frozen_kv_mtp":
            h, logits = frozen_level(head, target.model.embed_tokens(tok), inputs, *(t[:, :n] for t in target_kv))
        else:
            h = eagle_level(head, tok, inputs, j, past)
            logits = head.compute_logits(h, target.lm_head)
        agree = (logits.argmax(-1) == tgt.argmax(-1)).float().mean()
        if kind == "eagle3":  # cross-entropy over the draft vocabulary where the target's choice is in it
            hot = head.hot_token_id
            p = torch.softmax(tgt[..., hot], -1)
            ce = -(p * F.log_softmax(head.lm_head(head.norm(h)).float(), -1)).sum(-1)
            keep = head.t2d[tgt.argmax(-1)].float()
            loss = (ce * keep).sum() / keep.sum().clamp(min=1)
        else:
            loss = F.kl_div(F.log_softmax(logits.float(), -1), F.log_softmax(tgt, -1), log_target=True,
                            reduction="none").sum(-1).mean()
            if kind in ("eagle", "mtp"):
                loss = loss + reg_weight * F.smooth_l1_loss(h.float(), feats[:, j:j + n].float())
        out.append((loss, agree))
        inputs = h
    return out
