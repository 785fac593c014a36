"""Fused twins of core/model.py's layer pieces, for the fast engine: fewer kernels per layer.

A tiny model's forward on a GPU is bound by how many kernels it launches, not by arithmetic:
the explicit decoder layer issues about 45 (RMSNorm alone is seven element-wise ops, RoPE six per
tensor), and a CUDA graph only removes the launch cost, not the kernels. `fuse(model)` gives each
layer's modules a fused forward, as vLLM's CustomOp gives a module a `forward_cuda` beside its
`forward_native`:

    RMSNorm    rms_norm: one kernel per row
    residual   add_rms_norm: a residual add and the next norm in one kernel (vLLM's and SGLang's
               fused_add_rmsnorm), so a decoder layer adds nothing outside its norms
    EAGLE-3    the head's input (the token's embedding and the feature, each normed, side by
               side) in one kernel: eagle3_input
    RoPE       cos and sin looked up in a table over the run's positions (SGLang's
               cos_sin_cache): one kernel per forward instead of seven
    Attention  one GEMM over [q; k; v] weights, then split_rope: the split, Qwen3's per-head
               q/k norms, RoPE of q and k, and the new K/V written into the KV pool, in one
               kernel (v copied out contiguous, as the attention twins read it)
    MLP        one GEMM over [gate; up] weights, silu_mul in one kernel, then down
    Linear     one row (a batch-1 decode): a weight-streaming GEMV (kernels/gemv.py), which for a
               small model also does the add and norm before QKV and gate-up (norm_linear) and
               silu_mul before down (three kernels a layer fewer); 2-16 rows: the same stream
               on the tensor cores (rows_linear); more: cuBLAS (F.linear). So do the linears
               called as modules: a draft head's fc and lm_head, the target's lm_head a drafter reads

Each kernel rounds where the explicit ops round (to the model dtype after each torch op), so in
float32 they agree to the ulp of exp/sqrt, and in bfloat16 almost always bit for bit
(tests/test_fused.py). The fused weights are the old ones' storage: q_proj.weight and the rest
become views into [q; k; v], so the explicit forward still reads the same numbers.
"""
from __future__ import annotations

import types

import torch
import torch.nn as nn
import triton
import triton.language as tl

from spectrace.core.drafters.eagle import DraftHead
from spectrace.core.drafters.eagle3 import Eagle3Head
from spectrace.core.model import MLP, Attention, CausalLM, ForwardOutput, RMSNorm, RotaryEmbedding
from spectrace.kernels import gemv
from spectrace.kernels.gemv import linear as streaming_linear
from spectrace.kernels.matmul import invariant_linear
from spectrace.kernels.pdl import launch_options, wait_first
from spectrace.kernels.rounding import rounded


@triton.jit
def _rms_norm_kernel(x, weight, out, eps, H: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_first(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    v = tl.load(x + row * H + offs, mask=ok, other=0.0).to(tl.float32)
    normed = v * tl.rsqrt(tl.sum(v * v, axis=0) / H + eps)
    normed = rounded(normed, out.dtype.element_ty)  # x.to(dtype), as RMSNorm rounds before the weight
    w = tl.load(weight + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + row * H + offs, (w * normed).to(out.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm.forward: x (..., H) -> weight * (x / rms(x)), normalised in float32."""
    shape = x.shape
    x = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(x)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](x, weight, out, eps, H=x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]),
                                        **launch_options(x))
    return out.view(shape)


@triton.jit
def _add_rms_norm_kernel(x, delta, weight, total, out, eps, H: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_first(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    v = tl.load(x + row * H + offs, mask=ok, other=0.0).to(tl.float32)
    v = rounded(v + tl.load(delta + row * H + offs, mask=ok, other=0.0).to(tl.float32), total.dtype.element_ty)
    tl.store(total + row * H + offs, v.to(total.dtype.element_ty), mask=ok)  # x + delta, as the residual add rounds
    normed = rounded(v * tl.rsqrt(tl.sum(v * v, axis=0) / H + eps), out.dtype.element_ty)
    w = tl.load(weight + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + row * H + offs, (w * normed).to(out.dtype.element_ty), mask=ok)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, norm(x + delta)) of (N, H) rows in one kernel: a decoder layer's residual add
    and the norm after it. delta None: (x, norm(x))."""
    if delta is None:
        return x, rms_norm(x, norm.weight, norm.eps)
    x, delta = x.contiguous(), delta.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    if x.shape[0]:
        _add_rms_norm_kernel[(x.shape[0],)](x, delta, norm.weight, total, out, norm.eps, H=x.shape[1],
                                            BLOCK=triton.next_power_of_2(x.shape[1]), **launch_options(x))
    return total, out


@triton.jit
def _eagle3_input_kernel(ids, embed, h, in_weight, hidden_weight, out, residual, in_eps, hidden_eps,
                         H: tl.constexpr, BLOCK: tl.constexpr, NORM_RESIDUAL: tl.constexpr, PDL: tl.constexpr):
    wait_first(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    e = tl.load(embed + tl.load(ids + row) * H + offs, mask=ok, other=0.0).to(tl.float32)  # the token's embedding
    e = rounded(e * tl.rsqrt(tl.sum(e * e, axis=0) / H + in_eps), out.dtype.element_ty)
    w = tl.load(in_weight + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + row * 2 * H + offs, (w * e).to(out.dtype.element_ty), mask=ok)
    v = tl.load(h + row * H + offs, mask=ok, other=0.0).to(tl.float32)
    v = rounded(v * tl.rsqrt(tl.sum(v * v, axis=0) / H + hidden_eps), out.dtype.element_ty)
    normed = (tl.load(hidden_weight + offs, mask=ok, other=0.0).to(tl.float32) * v).to(out.dtype.element_ty)
    tl.store(out + row * 2 * H + H + offs, normed, mask=ok)
    if NORM_RESIDUAL:
        tl.store(residual + row * H + offs, normed, mask=ok)


def eagle3_input(ids: torch.Tensor, embed: torch.Tensor, h: torch.Tensor, input_norm: RMSNorm, hidden_norm: RMSNorm,
                 norm_before_residual: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Eagle3Head.layer_input after fc, in one kernel: ids (N,), h (N, H) -> (cat(input_norm(
    embed[ids]), hidden_norm(h)) (N, 2H), the residual stream: h, or with norm_before_residual
    hidden_norm(h)). Four kernels before (the embedding's gather, two norms, the cat), two of
    them torch's, which a PDL launch cannot overlap."""
    N, H = h.shape
    h = h.contiguous()
    out = h.new_empty(N, 2 * H)
    residual = h.new_empty(N, H) if norm_before_residual else h
    if N:
        _eagle3_input_kernel[(N,)](ids, embed, h, input_norm.weight, hidden_norm.weight, out, residual, input_norm.eps,
                                   hidden_norm.eps, H=H, BLOCK=triton.next_power_of_2(H),
                                   NORM_RESIDUAL=norm_before_residual, **launch_options(h))
    return out, residual


@triton.jit
def _split_rope_kernel(qkv, cos, sin, cos_stride, q, k, v, slots, k_cache, v_cache, q_norm, k_norm, eps,
                       NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                       WRITE_KV: tl.constexpr, QK_NORM: tl.constexpr, PDL: tl.constexpr):
    wait_first(PDL)
    t, head = tl.program_id(0), tl.program_id(1)  # one token's one head of q, k or v
    j = tl.arange(0, BLOCK)
    ok = j < D
    width: tl.constexpr = (NQ + 2 * NKV) * D
    x = tl.load(qkv + t * width + head * D + j, mask=ok, other=0.0)
    if WRITE_KV:
        slot = tl.load(slots + t)
    if head >= NQ + NKV:  # v: copied as is
        tl.store(v + (t * NKV + head - NQ - NKV) * D + j, x, mask=ok)
        if WRITE_KV:
            tl.store(v_cache + (slot * NKV + head - NQ - NKV) * D + j, x, mask=ok)
    else:  # x * cos + rotate_half(x) * sin, rounded after each op as the explicit tensors are
        half: tl.constexpr = D // 2
        pj = (j + half) % D
        partner = tl.load(qkv + t * width + head * D + pj, mask=ok, other=0.0)
        if QK_NORM:  # Qwen3: the head RMS-normalised first (RMSNorm over d), its partner with the same rms
            xf = x.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
            w = q_norm if head < NQ else k_norm
            x = (tl.load(w + j, mask=ok, other=0.0).to(tl.float32) * rounded(xf * rstd, x.dtype)).to(x.dtype)
            partner = (tl.load(w + pj, mask=ok, other=0.0).to(tl.float32)
                       * rounded(partner.to(tl.float32) * rstd, x.dtype)).to(x.dtype)
        rotated = tl.where(j < half, -partner, partner)
        c = tl.load(cos + t * cos_stride + j, mask=ok, other=0.0).to(tl.float32)
        s = tl.load(sin + t * cos_stride + j, mask=ok, other=0.0).to(tl.float32)
        # torch rounds x * cos and rotate_half(x) * sin to the dtype before adding them
        xc = rounded(x.to(tl.float32) * c, x.dtype)
        rs = rounded(rotated.to(tl.float32) * s, x.dtype)
        y = (xc + rs).to(x.dtype)
        if head < NQ:
            tl.store(q + (t * NQ + head) * D + j, y, mask=ok)
        else:
            tl.store(k + (t * NKV + head - NQ) * D + j, y, mask=ok)
            if WRITE_KV:
                tl.store(k_cache + (slot * NKV + head - NQ) * D + j, y, mask=ok)


def split_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
               head_dim: int, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
               slots: torch.Tensor | None = None, head_norms: tuple[RMSNorm, RMSNorm] | None = None):
    """qkv (N, (h + 2 kvh) d) -> q (N, h, d), k (N, kvh, d) with RoPE applied (cos, sin (N, 1, d),
    rows of any stride), v (N, kvh, d): core/model.py's apply_rope on q_proj and k_proj outputs,
    and v_proj's. Given k_cache, v_cache (num_slots, kvh, d) and slots (N,), k and v are also
    written to those slots: TokenToKVPool.write in the same kernel. head_norms: Qwen3's (q_norm,
    k_norm), applied to each head before RoPE (Attention.head_norms)."""
    N = qkv.shape[0]
    q = qkv.new_empty(N, num_heads, head_dim)
    k, v = qkv.new_empty(2, N, num_kv_heads, head_dim)
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    write = slots is not None
    q_norm, k_norm = head_norms or (None, None)
    if N:
        _split_rope_kernel[(N, num_heads + 2 * num_kv_heads)](
            qkv.contiguous(), cos, sin, cos.stride(0), q, k, v, slots if write else qkv, k_cache if write else qkv,
            v_cache if write else qkv, q_norm.weight if head_norms else qkv, k_norm.weight if head_norms else qkv,
            q_norm.eps if head_norms else 0.0, NQ=num_heads, NKV=num_kv_heads, D=head_dim,
            BLOCK=triton.next_power_of_2(head_dim), WRITE_KV=write, QK_NORM=head_norms is not None,
            **launch_options(qkv))
    return q, k, v


@triton.jit
def _silu_mul_kernel(gate_up, out, I: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_first(PDL)
    row, block = tl.program_id(0), tl.program_id(1)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    ok = offs < I
    g = tl.load(gate_up + row * 2 * I + offs, mask=ok, other=0.0)
    u = tl.load(gate_up + row * 2 * I + I + offs, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    silu = rounded(gf / (1.0 + tl.exp(-gf)), g.dtype)  # F.silu, in float32, rounded to the dtype
    tl.store(out + row * I + offs, (silu * u.to(tl.float32)).to(g.dtype), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (..., 2I) = [gate | up] -> silu(gate) * up (..., I): the SwiGLU between MLP's GEMMs
    (DFLASH's block runs (bs, block, H) through the layers, the others (N, H))."""
    lead, I = gate_up.shape[:-1], gate_up.shape[-1] // 2
    gate_up = gate_up.reshape(-1, 2 * I).contiguous()
    N = gate_up.shape[0]
    out = gate_up.new_empty(N, I)
    if N:
        _silu_mul_kernel[(N, triton.cdiv(I, 1024))](gate_up, out, I=I, BLOCK=1024, **launch_options(gate_up))
    return out.view(*lead, I)


# ---- the modules' fused forwards ----------------------------------------------------------------

def _rms_norm_forward(self: RMSNorm, x):
    return rms_norm(x, self.weight, self.eps)


def _attention_forward(self: Attention, x, cos, sin, batch, kv, linear=streaming_linear):
    return _attend(self, linear(x, self.qkv_weight, self.qkv_bias), cos, sin, batch, kv, linear)


def _attend(self: Attention, qkv, cos, sin, batch, kv, linear):
    """The attention from its [q; k; v] projection (N, (h + 2 kvh) d): RoPE and the KV write,
    the attention, o_proj."""
    from spectrace.core.model import ATTENTION

    N = qkv.shape[0]
    q, k, v = split_rope(qkv, cos, sin, self.num_heads, self.num_kv_heads, self.head_dim, kv.pool.k[self.layer_id],
                         kv.pool.v[self.layer_id], batch.out_cache_loc,
                         (self.q_norm, self.k_norm) if hasattr(self, "q_norm") else None)
    out = ATTENTION[kv.backend](q, k, v, batch, kv, self.layer_id)
    return linear(out.view(N, self.num_heads * self.head_dim), self.o_proj.weight, self.o_proj.bias)


def _mlp_forward(self: MLP, x, linear=streaming_linear):
    return _down(self, linear(x, self.gate_up_weight, self.gate_up_bias), linear)


def _down(self: MLP, gate_up, linear):
    """down_proj(silu(gate) * up) of the [gate | up] projection; one kernel where the GEMV folds it."""
    if linear is streaming_linear and gemv.folds(gate_up, self.down_proj.weight):
        return gemv.silu_linear(gate_up, self.down_proj.weight, self.down_proj.bias)
    return linear(silu_mul(gate_up), self.down_proj.weight, self.down_proj.bias)


def norm_linear(x, delta, norm: RMSNorm, weight, bias, linear) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, linear(norm(x + delta))): a residual add, the norm after it and the linear that
    reads it (delta None: (x, linear(norm(x)))); one kernel where the GEMV folds them (gemv.folds)."""
    if linear is streaming_linear and gemv.folds(x, weight):
        return gemv.norm_linear(x, delta, norm.weight, norm.eps, weight, bias)
    x, normed = add_rms_norm(x, delta, norm)
    return x, linear(normed, weight, bias)


def _rotary_forward(self: RotaryEmbedding, positions, dtype):
    """RotaryEmbedding.forward from its table: (N, 1, d) views of one lookup."""
    if self.cos_sin.dtype != dtype:  # the table is the model's dtype; another one computes
        return RotaryEmbedding.forward(self, positions, dtype)
    cs = self.cos_sin[positions]  # (N, 2, d)
    return cs[:, :1], cs[:, 1:]


def _causal_lm_forward(self: CausalLM, batch, kv, capture_layers=(), last_only=False) -> ForwardOutput:
    """CausalLM.forward with each residual add inside the next norm (add_rms_norm), and that norm
    inside the linear after it where the GEMV folds it (norm_linear): the residual stream x, and
    `delta`, the block output still to be added to it.

    batch.batch_invariant (--deterministic): a fast engine's batch is already one decode row per
    token (fast/batch.py: decode_rows_batch), and every linear layer is then the fixed-tile one
    (kernels/matmul.py); an explicit engine's batch takes the explicit forward's row-by-row passes."""
    if batch.batch_invariant and "branch" not in batch.attn_metadata and len(batch.input_ids) > 1:
        return CausalLM.forward(self, batch, kv, capture_layers, last_only)
    linear = invariant_linear if batch.batch_invariant else streaming_linear
    x = self.model.embed_tokens(batch.input_ids)  # (N, H)
    cos, sin = self.model.rotary_emb(batch.positions, x.dtype)
    aux, delta = [], None
    for i, layer in enumerate(self.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        x, qkv = norm_linear(x, delta, layer.input_layernorm, attn.qkv_weight, attn.qkv_bias, linear)
        if i in capture_layers:  # the residual stream entering layer i
            aux.append(x)
        x, gate_up = norm_linear(x, _attend(attn, qkv, cos, sin, batch, kv, linear), layer.post_attention_layernorm,
                                 mlp.gate_up_weight, mlp.gate_up_bias, linear)
        delta = _down(mlp, gate_up, linear)
    x, normed = add_rms_norm(x, delta, self.model.norm)
    rows = normed[torch.tensor(batch.extend_lens, device=x.device).cumsum(0) - 1] if last_only else normed
    return ForwardOutput(linear(rows, self.lm_head.weight, self.lm_head.bias).float(), normed, aux)


def _draft_head_forward(self: DraftHead, batch, kv, features):
    """DraftHead.forward with the attention's residual add inside post_attention_layernorm."""
    layer = self.layers[0]
    attn_in, x = self.layer_input(batch.input_ids, features)
    cos, sin = self.rotary_emb(batch.positions, x.dtype)
    x, normed = add_rms_norm(x, layer.self_attn(attn_in, cos, sin, batch, kv), layer.post_attention_layernorm)
    return self.finish(x + layer.mlp(normed))


def _eagle3_layer_input(self: Eagle3Head, input_ids, features):
    """Eagle3Head.layer_input: fc (target features only), then eagle3_input."""
    h = self.fc(features) if features.shape[-1] != self.config.hidden_size else features
    mid = self.midlayer
    return eagle3_input(input_ids, self.embed_tokens.weight, h, mid.input_layernorm, mid.hidden_norm,
                        self.norm_before_residual)


def _linear_forward(self: nn.Linear, x):
    return streaming_linear(x, self.weight, self.bias)


def _concat(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) over the linears' outputs; each linear's parameters become views of it."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = torch.cat([lin.bias.detach() for lin in linears]) if linears[0].bias is not None else None
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[start:start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:start + rows], requires_grad=False)
        start += rows
    return weight, bias


def is_fused(model: nn.Module) -> bool:
    """Whether fuse() gave `model` its fused forward."""
    return "forward" in vars(model)


def fuse(model: nn.Module, positions: int | None = None) -> nn.Module:
    """Give every RMSNorm, Attention and MLP of `model`, and the model itself (a CausalLM or a
    DraftHead), its fused forward (once; in place). RoPE tables cover `positions` (default: the
    model's context; a run gives the positions it reaches: Llama 3.1's 131072 would cost 64 MB a
    model), in the model's dtype, on its device; a later call that reaches further grows them."""
    p = next(model.parameters())
    positions = positions or model.config.max_position_embeddings
    for m in model.modules():
        if isinstance(m, RotaryEmbedding) and len(getattr(m, "cos_sin", ())) < positions:
            every = torch.arange(positions, device=p.device)
            m.cos_sin = torch.cat(RotaryEmbedding.forward(m, every, p.dtype), dim=1)  # (P, 2, d)
            m.forward = types.MethodType(_rotary_forward, m)
        if "forward" in vars(m):
            continue
        if isinstance(m, CausalLM):
            m.forward = types.MethodType(_causal_lm_forward, m)
        elif isinstance(m, DraftHead):
            m.forward = types.MethodType(_draft_head_forward, m)
            if isinstance(m, Eagle3Head):
                m.layer_input = types.MethodType(_eagle3_layer_input, m)
        elif isinstance(m, RMSNorm):
            m.forward = types.MethodType(_rms_norm_forward, m)
        elif isinstance(m, Attention):
            m.qkv_weight, m.qkv_bias = _concat([m.q_proj, m.k_proj, m.v_proj])
            m.forward = types.MethodType(_attention_forward, m)
        elif isinstance(m, MLP):
            m.gate_up_weight, m.gate_up_bias = _concat([m.gate_proj, m.up_proj])
            m.forward = types.MethodType(_mlp_forward, m)
        elif isinstance(m, nn.Linear):  # called as a module: a head's fc and lm_head, the lm_head a drafter reads
            m.forward = types.MethodType(_linear_forward, m)
    return model
