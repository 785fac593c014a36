"""Each embedded model grown to a published shape: the target and the draft LM (`lm`), and every
draft head in its own checkpoint layout. Each returns (config.json as a dict, the weights by
name, float32 on the filler's device, one tensor at a time); spectrace/zoo/grow/__init__.py
writes them and states the rules.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import load_file

from spectrace.core.drafters.dflash import build_target_layer_ids
from spectrace.core.drafters.eagle3_layouts import default_capture_layers
from spectrace.zoo import TARGET_DIR
from spectrace.zoo.grow.axes import B_PAD, C_VALUE, Axis, Filler, cat, linear, norm_weight, prefix
from spectrace.zoo.grow.layers import Geometry, layer, place_layers, sub

Tensors = Iterator[tuple[str, torch.Tensor]]
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")


@dataclass(frozen=True)
class Plan:
    """A grown pair's shapes: the target's and the draft LM's config fields, the EAGLE-3 head's
    draft vocabulary, DFlash's layer count."""

    name: str
    target: dict  # SHAPE_FIELDS, num_hidden_layers, vocab_size, tie_word_embeddings
    draft: dict  # the same for the standalone draft LM
    draft_vocab: int
    dflash_layers: int

    @property
    def taps(self) -> tuple[int, ...]:  # EAGLE-3's default taps of the grown target
        return default_capture_layers(self.target["num_hidden_layers"])

    def target_placement(self) -> list[int]:
        """The grown layer of each tiny target layer."""
        return lm_placement(TARGET_DIR, self.target, self.taps)


def read_tiny(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """An embedded model's config.json and weights (CPU, as stored)."""
    raw = json.loads((path / "config.json").read_text())
    files = sorted(path.glob("*.safetensors"))
    return raw, {k: v for f in files for k, v in load_file(f).items()}


def grown_config(raw: dict, geo: Geometry, **extra) -> dict:
    """The tiny config.json at the grown shape: its RoPE, context and token ids kept, eps_D."""
    return {**raw, **{k: geo.grown[k] for k in SHAPE_FIELDS}, "rms_norm_eps": geo.widths.eps_grown, **extra}


def embedding(tiny: torch.Tensor, geo: Geometry, vocab: int, fill: Filler) -> torch.Tensor:
    """Rows of real tokens [e; c; 0] (the stream starts with its constant channel); padded rows
    are never looked up (random)."""
    w = geo.widths
    e = linear(tiny, prefix(vocab, tiny.shape[0]), prefix(w.D, w.d, exact_all=True), fill)
    e[:tiny.shape[0], w.d] = C_VALUE
    return e


def lm_head(tiny: torch.Tensor, geo: Geometry, rows: int, fill: Filler) -> torch.Tensor:
    """A head over a final-normed stream [h; c/rms; 0]: real rows the tiny row on R and 0 on C;
    padded rows 0 on R and -B_PAD on C, so their logit is -B_PAD c / rms (-1024 / rms), whose exp
    is exactly 0 in float32: no argmax, no probability."""
    w = geo.widths
    head = linear(tiny, prefix(rows, tiny.shape[0], exact_all=True), w.stream(), fill)
    head[tiny.shape[0]:, w.d] = -B_PAD
    return head


def final_norm(tiny: torch.Tensor, geo: Geometry, fill: Filler) -> torch.Tensor:
    """A norm whose output a head reads: sqrt(d/D) on C too, so C comes out as c / rms_d(x)."""
    w = geo.widths
    return norm_weight(tiny, w.reader(), fill, w.norm_scale, const=w.norm_scale)


def layers(state: dict, prefix_: str, geo: Geometry, placed: list[int], grown_layers: int, fill: Filler,
           **kw) -> Tensors:
    """Every grown layer under `prefix_`{i}.: a tiny layer where `placed` puts one, else identity."""
    tiny_of = {g: i for i, g in enumerate(placed)}
    for g in range(grown_layers):
        t = sub(state, f"{prefix_}{tiny_of[g]}.") if g in tiny_of else None
        for k, v in layer(t, geo, fill, **kw).items():
            yield f"{prefix_}{g}.{k}", v


def lm_placement(tiny_dir: Path, shape: dict, taps=()) -> list[int]:
    """The grown layer of each tiny layer; taps: the grown EAGLE-3 default taps, which must see
    the tiny ones (else the tiny layers are spread out)."""
    L = json.loads((tiny_dir / "config.json").read_text())["num_hidden_layers"]
    return place_layers(L, shape["num_hidden_layers"], default_capture_layers(L) if taps else (), taps)


def lm(tiny_dir: Path, shape: dict, fill: Filler, taps=()) -> tuple[dict, Tensors]:
    """A causal LM (the target, or the standalone draft LM) at `shape`; taps as lm_placement's."""
    raw, st = read_tiny(tiny_dir)
    geo = Geometry(raw, shape)
    L, V, tied = shape["num_hidden_layers"], shape["vocab_size"], shape["tie_word_embeddings"]
    placed = lm_placement(tiny_dir, shape, taps)
    cfg = grown_config(raw, geo, num_hidden_layers=L, vocab_size=V, tie_word_embeddings=tied)
    tiny_embed = st["model.embed_tokens.weight"]
    tiny_head = tiny_embed if raw["tie_word_embeddings"] else st["lm_head.weight"]

    def tensors() -> Tensors:
        e = embedding(tiny_embed, geo, V, fill)
        if tied:  # one matrix: padded rows as lm_head needs them (they are never looked up); a real
            # row's c on C adds c * c / rms (4e-9 / rms) to its logit, far below a float32 ulp of it
            e[tiny_embed.shape[0]:, :geo.widths.d] = 0.0
            e[tiny_embed.shape[0]:, geo.widths.d] = -B_PAD
        yield "model.embed_tokens.weight", e
        yield from layers(st, "model.layers.", geo, placed, L, fill)
        yield "model.norm.weight", final_norm(st["model.norm.weight"], geo, fill)
        if not tied:
            yield "lm_head.weight", lm_head(tiny_head, geo, V, fill)
    return cfg, tensors()


def taps_in(geo: Geometry, blocks: int, live: list[int]) -> Axis:
    """fc's input: `blocks` residual streams side by side; the blocks in `live` carry the tiny
    head's taps in order, the others taps it does not read (their columns are 0)."""
    w = geo.widths
    axes = []
    for p in range(blocks):
        a = w.stream()
        axes.append(a if p in live else Axis(a.size, a.grown[:0], a.tiny[:0], 0, a.exact))
    return cat(*axes)


def const_row(fc: torch.Tensor, geo: Geometry, blocks: list[int]) -> None:
    """fc's row C copies the constant channel of the taps it reads (weights 1/2, 1/4, 1/4, ...,
    summing to 1, powers of two): the head's stream starts with c there."""
    d, D = geo.widths.d, geo.widths.D
    weights = [2.0 ** -(k + 1) for k in range(len(blocks))]
    weights[-1] *= 2
    for p, wgt in zip(blocks, weights):
        fc[d, p * D + d] = wgt


def eagle3(plan: Plan, fill: Filler, tiny_dir: Path) -> tuple[dict, Tensors]:
    """SGLang's layout: fc over three taps, the midlayer over [embedding; hidden] (2D wide), norm and
    a draft-vocabulary lm_head; d2t carries over, padded draft ids map to padded target ids; no
    embed_tokens (the grown target's is shared)."""
    raw, st = read_tiny(tiny_dir)
    t = plan.target
    geo = Geometry(raw, {k: t[k] for k in SHAPE_FIELDS})
    w, V_t, Vd_t = geo.widths, raw["vocab_size"], raw["draft_vocab_size"]
    cfg = grown_config(raw, geo, vocab_size=t["vocab_size"], draft_vocab_size=plan.draft_vocab, target_hidden_size=w.D,
                       eagle_config={"eagle_aux_hidden_state_layer_ids": [a - 1 for a in plan.taps]})

    def tensors() -> Tensors:
        fc = linear(st["fc.weight"], w.writer(), taps_in(geo, 3, [0, 1, 2]), fill)
        const_row(fc, geo, [0, 1, 2])
        yield "fc.weight", fc
        mid = sub(st, "midlayer.")
        yield from ((f"midlayer.{k}", v) for k, v in layer(mid, geo, fill, attn_in=cat(w.reader(), w.reader())).items())
        yield "midlayer.hidden_norm.weight", norm_weight(mid["hidden_norm.weight"], w.reader(), fill, w.norm_scale)
        yield "norm.weight", final_norm(st["norm.weight"], geo, fill)
        yield "lm_head.weight", lm_head(st["lm_head.weight"], geo, plan.draft_vocab, fill)
        pad = plan.draft_vocab - Vd_t
        yield "d2t", torch.cat([st["d2t"], torch.full((pad,), V_t - Vd_t, dtype=st["d2t"].dtype)])
        hot = torch.cat([st["d2t"] + torch.arange(Vd_t), torch.arange(V_t, V_t + pad)])
        yield "t2d", torch.zeros(t["vocab_size"], dtype=torch.bool).index_fill_(0, hot, True)
    return cfg, tensors()


def eagle1(plan: Plan, fill: Filler, tiny_dir: Path) -> tuple[dict, Tensors]:
    """EAGLE-LLaMA3-Instruct-8B's layout: fc over [embedding; feature] without a bias, a layer with
    no input_layernorm, its own embedding. The head's output goes to the target's lm_head as it
    is, so its stream is [h; c; 0] with c from the embedding's constant channel (fc row C), and the
    tiny fc's bias rides on the same channel (bias / c in that column)."""
    raw, st = read_tiny(tiny_dir)
    t = plan.target
    geo = Geometry(raw, {k: t[k] for k in SHAPE_FIELDS})
    w = geo.widths
    cfg = grown_config(raw, geo, vocab_size=t["vocab_size"], bias=False)

    def tensors() -> Tensors:
        yield "embed_tokens.weight", embedding(st["embed_tokens.weight"], geo, t["vocab_size"], fill)
        fc = linear(st["fc.weight"], w.writer(), cat(w.stream(), w.stream()), fill)
        fc[:w.d, w.d] = st["fc.bias"].float().to(fc.device) / C_VALUE
        fc[w.d, w.d] = 1.0
        yield "fc.weight", fc
        yield from ((f"layers.0.{k}", v) for k, v in
                    layer(sub(st, "layers.0."), geo, fill, attn_in=w.stream(), input_norm=False).items())
    return cfg, tensors()


def mtp(plan: Plan, fill: Filler, tiny_dir: Path) -> tuple[dict, Tensors]:
    """x = eh_proj([enorm(embed); hnorm(feature)]), a layer, shared_head.norm. Both of eh_proj's
    inputs are normed, so the stream has no constant of its own: enorm's weight on C passes on
    c / (16 rms(e)), a positive number near c, which eh_proj's row C copies into the stream (its
    square, like c's, is far below eps in every norm). hnorm reads the target's final-normed
    feature, whose C (c / rms) enters its mean square at a relative 1e-11."""
    raw, st = read_tiny(tiny_dir)
    t = plan.target
    geo = Geometry(raw, {k: t[k] for k in SHAPE_FIELDS})
    w = geo.widths
    cfg = grown_config(raw, geo, vocab_size=t["vocab_size"])

    def tensors() -> Tensors:
        yield "embed_tokens.weight", embedding(st["embed_tokens.weight"], geo, t["vocab_size"], fill)
        yield "enorm.weight", norm_weight(st["enorm.weight"], w.reader(), fill, w.norm_scale, const=w.norm_scale / 16)
        yield "hnorm.weight", norm_weight(st["hnorm.weight"], w.reader(), fill, w.norm_scale)
        eh = linear(st["eh_proj.weight"], w.writer(), cat(w.stream(), w.reader()), fill)
        eh[w.d, w.d] = 1.0
        yield "eh_proj.weight", eh
        yield from ((f"layers.0.{k}", v) for k, v in layer(sub(st, "layers.0."), geo, fill).items())
        yield "shared_head.norm.weight", final_norm(st["shared_head.norm.weight"], geo, fill)
    return cfg, tensors()


def frozen_kv_mtp(plan: Plan, fill: Filler, tiny_dir: Path) -> tuple[dict, Tensors]:
    """pre_projection([target embedding; feature]) (row C copies the embedding's c), layers of
    queries into the target's KV (the grown target's KV heads, the same head map), model.norm,
    post_projection back to the target's width, its own lm_head."""
    raw, st = read_tiny(tiny_dir)
    t = plan.target
    geo = Geometry(raw, {k: t[k] for k in SHAPE_FIELDS})
    w, n = geo.widths, raw["num_hidden_layers"]
    cfg = grown_config(raw, geo, vocab_size=t["vocab_size"], backbone_hidden_size=w.D)

    def tensors() -> Tensors:
        pre = linear(st["pre_projection.weight"], w.writer(), cat(w.stream(), w.stream()), fill)
        pre[w.d, w.d] = 1.0
        yield "pre_projection.weight", pre
        yield from layers(st, "model.layers.", geo, list(range(n)), n, fill, kv=False)
        yield "model.norm.weight", final_norm(st["model.norm.weight"], geo, fill)
        yield "post_projection.weight", linear(st["post_projection.weight"], w.writer(), w.stream(), fill)
        yield "lm_head.weight", lm_head(st["lm_head.weight"], geo, t["vocab_size"], fill)
    return cfg, tensors()


def medusa(plan: Plan, fill: Filler, tiny_dir: Path) -> tuple[dict, Tensors]:
    """ResBlock(x) = x + SiLU(W x + b) on the target's final-normed stream: W and b live on R, 0
    on C and the rest (SiLU(0) = 0 keeps them exact), then a head as the target's lm_head."""
    raw, st = read_tiny(tiny_dir)
    t = plan.target
    geo = Geometry(json.loads((TARGET_DIR / "config.json").read_text()), {k: t[k] for k in SHAPE_FIELDS})
    w, K = geo.widths, raw["medusa_num_heads"]
    cfg = {**raw, "hidden_size": w.D, "vocab_size": t["vocab_size"]}

    def tensors() -> Tensors:
        for k in range(K):
            yield f"medusa_head.{k}.0.linear.weight", linear(st[f"medusa_head.{k}.0.linear.weight"], w.writer(),
                                                              w.stream(), fill)
            b = torch.zeros(w.D, device=fill.device)
            b[:w.d] = st[f"medusa_head.{k}.0.linear.bias"].float().to(b.device)
            yield f"medusa_head.{k}.0.linear.bias", b
            yield f"medusa_head.{k}.1.weight", lm_head(st[f"medusa_head.{k}.1.weight"], geo, t["vocab_size"], fill)
    return cfg, tensors()


def dflash(plan: Plan, fill: Filler, tiny_dir: Path) -> tuple[dict, Tensors]:
    """z-lab's layout with plan.dflash_layers layers over taps spread by z-lab's rule
    (build_target_layer_ids), which include the tiny taps' grown places; the other taps and the
    extra layers read and add nothing. Qwen3-style q/k norms per head (layers.attention)."""
    raw, st = read_tiny(tiny_dir)
    t = plan.target
    geo = Geometry(raw, {k: t[k] for k in SHAPE_FIELDS})
    w, n_t, n = geo.widths, raw["num_hidden_layers"], plan.dflash_layers
    tiny_ids = raw["dflash_config"]["target_layer_ids"]
    target_placed = plan.target_placement()
    ids = build_target_layer_ids(t["num_hidden_layers"], n)
    # the output of grown layer j is the output of the last tiny layer placed at or before it
    last_tiny = [max(i for i, g in enumerate(target_placed) if g <= j) for j in ids]
    live = [last_tiny.index(i) for i in tiny_ids if i in last_tiny]
    if len(live) != len(tiny_ids):
        raise ValueError(f"DFlash taps {ids} of the grown target do not include the tiny taps {tiny_ids}")
    cfg = grown_config(raw, geo, vocab_size=t["vocab_size"], num_hidden_layers=n,
                       num_target_layers=t["num_hidden_layers"],
                       dflash_config={**raw["dflash_config"], "target_layer_ids": ids})

    def tensors() -> Tensors:
        fc = linear(st["fc.weight"], w.writer(), taps_in(geo, len(ids), live), fill)
        const_row(fc, geo, live)
        yield "fc.weight", fc
        yield "hidden_norm.weight", norm_weight(st["hidden_norm.weight"], w.reader(), fill, w.norm_scale)
        yield from layers(st, "layers.", geo, place_layers(n_t, n), n, fill, qk_norm=True)
        yield "norm.weight", final_norm(st["norm.weight"], geo, fill)
    return cfg, tensors()
