"""A Llama decoder layer grown: its attention heads, head dims and MLP units placed by the rules
(spectrace/zoo/grow/__init__.py), or an identity layer that adds exactly nothing.

`Geometry` is one model's shapes, tiny and grown; `layer` returns a grown layer's weights under
the tiny layer's names (`self_attn.q_proj.weight`, ...), float32 on the filler's device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spectrace.zoo.grow.axes import Axis, Filler, Widths, gqa_map, heads, linear, norm_weight, prefix


@dataclass(frozen=True)
class Geometry:
    tiny: dict  # the tiny model's config.json
    grown: dict  # the grown shape: hidden_size, intermediate_size, heads, KV heads, head_dim

    def __post_init__(self):
        t, g = self.tiny, self.grown
        if g["head_dim"] % t["head_dim"] or g["hidden_size"] <= t["hidden_size"]:
            raise ValueError(f"cannot grow hidden {t['hidden_size']} / head_dim {t['head_dim']} to "
                             f"{g['hidden_size']} / {g['head_dim']}: a larger hidden size and a multiple head_dim")
        if g["intermediate_size"] < t["intermediate_size"]:
            raise ValueError(f"cannot grow an MLP of {t['intermediate_size']} units to {g['intermediate_size']}")

    @property
    def widths(self) -> Widths:
        return Widths(self.tiny["hidden_size"], self.grown["hidden_size"], self.tiny["rms_norm_eps"])

    def _gqa(self):
        t, g = self.tiny, self.grown
        return gqa_map(t["num_attention_heads"], t["num_key_value_heads"], g["num_attention_heads"],
                       g["num_key_value_heads"])

    def q(self, exact_all: bool = False) -> Axis:
        q_of, _, _ = self._gqa()
        return heads(self.grown["num_attention_heads"], self.grown["head_dim"], q_of, self.tiny["head_dim"],
                     self.tiny["num_attention_heads"], exact_all)

    def kv(self) -> Axis:
        _, kv_of, _ = self._gqa()
        return heads(self.grown["num_key_value_heads"], self.grown["head_dim"], kv_of, self.tiny["head_dim"],
                     self.tiny["num_key_value_heads"], exact_all=True)

    @property
    def copies(self) -> int:
        return self._gqa()[2]

    @property
    def head_ratio(self) -> int:
        return self.grown["head_dim"] // self.tiny["head_dim"]

    def mlp(self, exact_all: bool) -> Axis:
        return prefix(self.grown["intermediate_size"], self.tiny["intermediate_size"], exact_all)


def attention(t: dict | None, geo: Geometry, fill: Filler, attn_in: Axis, kv: bool = True,
              qk_norm: bool = False) -> dict[str, torch.Tensor]:
    """q/k/v/o (and Qwen3-style q_norm/k_norm) of a grown attention reading `attn_in`.

    Scores: a grown head's q.k over head_dim D_h sums the tiny head's d_h products (the extra dims
    are 0 in k) and is scaled by D_h^-1/2, not d_h^-1/2: q's live rows are multiplied by
    sqrt(D_h/d_h) (2 at 128 over 32: exact in bfloat16). Under a per-head RMSNorm, q and k are
    normalised over D_h dims, d_h of them live: the extra dims must be 0, the projections are
    scaled by t = sqrt((d/D)(D_h/d_h)) so that the head's eps is the model's eps_D, and the norm
    weights carry the sqrt(D_h/d_h) instead. o_proj divides each copy of a head by the copies.
    t None: an identity layer's attention, whose v is 0 on every input it reads."""
    ratio = geo.head_ratio
    q_axis, kv_axis = geo.q(exact_all=qk_norm), geo.kv()
    out = {}
    if t is None:
        out["self_attn.q_proj.weight"] = fill(q_axis.size, attn_in.size)
        if kv:
            out["self_attn.k_proj.weight"] = fill(kv_axis.size, attn_in.size)
            out["self_attn.v_proj.weight"] = linear(None, kv_axis, attn_in, fill)
        out["self_attn.o_proj.weight"] = fill(geo.grown["hidden_size"], q_axis.size)
        if qk_norm:
            out["self_attn.q_norm.weight"] = fill(geo.grown["head_dim"], mean=1.0)
            out["self_attn.k_norm.weight"] = fill(geo.grown["head_dim"], mean=1.0)
        return out
    w = geo.widths
    proj = math.sqrt(w.d / w.D * ratio) if qk_norm else 1.0
    out["self_attn.q_proj.weight"] = linear(t["self_attn.q_proj.weight"], q_axis, attn_in, fill,
                                            proj if qk_norm else math.sqrt(ratio))
    if kv:
        out["self_attn.k_proj.weight"] = linear(t["self_attn.k_proj.weight"], kv_axis, attn_in, fill, proj)
        out["self_attn.v_proj.weight"] = linear(t["self_attn.v_proj.weight"], kv_axis, attn_in, fill)
    out["self_attn.o_proj.weight"] = linear(t["self_attn.o_proj.weight"], w.writer(), geo.q(), fill,
                                            1.0 / geo.copies)
    if qk_norm:  # per head dim: the tiny head's dims at their grown positions, the rest free
        dims = heads(1, geo.grown["head_dim"], [0], geo.tiny["head_dim"], 1, exact_all=False)
        for name, scale in (("q_norm", 1.0), ("k_norm", 1.0 / math.sqrt(ratio))):
            g = fill(geo.grown["head_dim"], mean=1.0)
            g[dims.grown.to(g.device)] = scale * t[f"self_attn.{name}.weight"].to(g.device, torch.float32)
            out[f"self_attn.{name}.weight"] = g
    return out


def mlp(t: dict | None, geo: Geometry, fill: Filler) -> dict[str, torch.Tensor]:
    """SwiGLU grown: extra units have up_proj 0 on R, so silu(gate) * 0 == 0; gate and down_proj
    are free there. An identity layer's up_proj is 0 on R for every unit."""
    w = geo.widths
    I = geo.grown["intermediate_size"]
    if t is None:
        return {"mlp.gate_proj.weight": fill(I, w.D), "mlp.up_proj.weight": linear(None, geo.mlp(True), w.reader(), fill),
                "mlp.down_proj.weight": fill(w.D, I)}
    return {"mlp.gate_proj.weight": linear(t["mlp.gate_proj.weight"], geo.mlp(False), w.reader(), fill),
            "mlp.up_proj.weight": linear(t["mlp.up_proj.weight"], geo.mlp(True), w.reader(), fill),
            "mlp.down_proj.weight": linear(t["mlp.down_proj.weight"], w.writer(), geo.mlp(False), fill)}


def layer(t: dict | None, geo: Geometry, fill: Filler, attn_in: Axis | None = None, input_norm: bool = True,
          kv: bool = True, qk_norm: bool = False) -> dict[str, torch.Tensor]:
    """A grown decoder layer (t: the tiny layer's weights, None for an identity layer). Reader norms
    are sqrt(d/D) times the tiny weight on R and 0 on the constant channel, so it never reaches a
    matrix. attn_in: what q/k/v read (default: the normed residual)."""
    w = geo.widths
    out = attention(t, geo, fill, attn_in or w.reader(), kv, qk_norm)
    out.update(mlp(t, geo, fill))
    norms = ("input_layernorm", "post_attention_layernorm") if input_norm else ("post_attention_layernorm",)
    for name in norms:
        out[f"{name}.weight"] = norm_weight(None if t is None else t[f"{name}.weight"], w.reader(), fill,
                                            w.norm_scale)
    return out


def sub(state: dict[str, torch.Tensor], prefix_: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix_`, the prefix removed (a layer's weights out of a state dict)."""
    return {k[len(prefix_):]: v for k, v in state.items() if k.startswith(prefix_)}


def place_layers(tiny_layers: int, grown_layers: int, tiny_taps=(), grown_taps=()) -> list[int]:
    """Grown layer of each tiny layer. A tap (the residual entering a layer) must see the same
    stream in both: the tiny layers before tiny tap a sit before grown tap A, the rest at or after
    it; within each stretch the tiny layers are spread out, the grown layers between them identity."""
    bounds = list(zip((0, *tiny_taps, tiny_layers), (0, *grown_taps, grown_layers)))
    placed = []
    for (t0, g0), (t1, g1) in zip(bounds, bounds[1:]):
        m, span = t1 - t0, g1 - g0
        if m > span:
            raise ValueError(f"cannot place tiny layers {t0}..{t1 - 1} in grown layers {g0}..{g1 - 1}")
        placed += [g0 + k * span // m for k in range(m)]
    return placed
