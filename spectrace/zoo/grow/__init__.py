"""Grown pairs: checkpoints of a published shape whose function is the embedded pair's, so that a
speed-up measured at that shape comes with the embedded pair's real acceptance.

    python -m spectrace.zoo.grow --shape llama-3.1-8b --device cuda OUT
    python -m spectrace.zoo.grow --shape small OUT        # a CPU size (hidden 512, 10 layers)

OUT/target is Llama-3.1-8B's shape (hidden 4096, 32 layers, 32 / 8 heads, head_dim 128, MLP 14336,
vocabulary 128256, untied: the published model's bytes) computing tiny-target; OUT/draft is
Llama-3.2-1B's (tied) computing tiny-draft; OUT/eagle3 (SGLang's layout, fc 3 x 4096 -> 4096, draft
vocabulary 32000), OUT/eagle (EAGLE-LLaMA3-Instruct-8B's), OUT/mtp, OUT/frozen_kv_mtp, OUT/medusa and
OUT/dflash (5 layers) compute the embedded drafters; all load through the normal loaders.

The rules (d, D: tiny and grown hidden size; R = dims [0, d), C = dim d, Z = the rest):
1. Residual stream X = [x; c; 0], c = 2^-14: real tokens' embedding rows are [e; c; 0]; o_proj,
   down_proj and fc write R only, so X[C] == c and X[Z] == 0 exactly, in any dtype.
2. RMSNorm over D: mean_D(X^2) + eps_D = (d/D)(mean_d(x^2) + eps) with eps_D = (d eps - c^2) / D,
   so every norm weight is sqrt(d/D) times the tiny one on R (1/4 at 8B: exact in bfloat16).
   Norms that matrices read are 0 on C; norms a head reads (final norms) are sqrt(d/D) on C, so
   their output there is c / rms_d(x) > 0.
3. Readers (q/k/v, gate/up, fc, lm_head) see exact 0 outside R (and C): those columns are random.
   Rows that must output exactly 0 are 0 only where their input is not.
4. Heads: grown KV head K is tiny KV head K // (8/4); each grown group's q slots repeat the tiny
   group's q heads (4 copies at 8B) and o_proj divides each copy by 4. Every head is live.
5. Head dims: tiny RoPE pair (i, i + 16) goes to grown pair (4i, 4i + 64), whose frequency under
   the same theta is bit-identical: plain RoPE with the tiny theta 10000 (not Llama 3.1's llama3
   scaling, whose frequencies are not on the tiny grid) and the tiny context (512). k and v are 0
   on the extra dims; q's live rows carry sqrt(128/32) = 2 for the larger softmax scale.
6. MLP: extra units have up_proj 0 on R, so silu(gate) * 0 == 0.
7. Extra layers are identity layers: v_proj and up_proj 0 on R, everything else random, placed
   so that EAGLE-3's default taps (inputs of 2, L//2, L-3) see the tiny taps (2, 4, 5): at 32
   layers the tiny layers sit at 0, 1, 2, 9, 16, 29, 30, 31.
8. Padded vocabulary rows are 0 on R and -2^24 on C: their logit is -1024 / rms, whose exp is
   exactly 0 in float32 (no argmax, no probability under any sampling).
9. Per-head RMSNorm (DFlash's q/k norms): the extra head dims are 0 and q/k carry
   t = sqrt((d/D)(D_h/d_h)) (1/2 at 8B), so the head's eps is eps_D; the weights take the rest.
Each drafter's own rules are in models.py. What this cannot do: grow into a model with a per-head
q/k RMSNorm that the tiny one lacks (Qwen3-8B from the tiny Llama: rms_128(q) is not a linear
function of the tiny q), or be exact in bfloat16 where a ratio is not a power of four (the 1B
draft's head_dim 64 over 32 needs q * sqrt(2): exact in float32, rounded in bfloat16).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from spectrace.zoo import DFLASH_DIR, DRAFT_DIR, EAGLE3_DIR, EAGLE_DIR, FROZEN_KV_MTP_DIR, MEDUSA_DIR, MTP_DIR, TARGET_DIR
from spectrace.zoo.grow import models
from spectrace.zoo.grow.axes import B_PAD, C_VALUE, Filler
from spectrace.zoo.grow.models import Plan
from spectrace.zoo.random_checkpoint import SHAPES

_KEEP = (*models.SHAPE_FIELDS, "num_hidden_layers", "vocab_size", "tie_word_embeddings")
PLANS = {
    "llama-3.1-8b": Plan("llama-3.1-8b", {k: SHAPES["llama-3.1-8b"][k] for k in _KEEP},
                         {k: SHAPES["llama-3.2-1b"][k] for k in _KEEP}, draft_vocab=32000, dflash_layers=5),
    # a CPU size with every rule at work: copied heads, spread head dims, identity layers
    "small": Plan("small", dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=10, num_attention_heads=16,
                                num_key_value_heads=8, head_dim=64, vocab_size=8192, tie_word_embeddings=False),
                  dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=64, vocab_size=8192, tie_word_embeddings=True),
                  draft_vocab=4096, dflash_layers=5),
}
# the directory each grown model goes to (random_checkpoint's names), its maker and embedded model
HEADS = {"draft": None, "eagle3": (models.eagle3, EAGLE3_DIR), "eagle": (models.eagle1, EAGLE_DIR),
         "mtp": (models.mtp, MTP_DIR), "frozen_kv_mtp": (models.frozen_kv_mtp, FROZEN_KV_MTP_DIR),
         "medusa": (models.medusa, MEDUSA_DIR), "dflash": (models.dflash, DFLASH_DIR)}
SHARD_BYTES = 5 * 2 ** 30


def write(out: Path, config: dict, tensors: models.Tensors, dtype: torch.dtype, name: str = "model") -> dict:
    """config.json and the weights as safetensors in `dtype` (5 GiB shards and an index past that),
    a tensor at a time; returns the parameter and exact-zero counts."""
    out.mkdir(parents=True, exist_ok=True)
    shards, shard, size, params, zeros = [], {}, 0, 0, 0

    def flush():
        if shard:
            shards.append(dict(shard))
            save_file(shard, out / f"{name}-{len(shards):05d}.safetensors", metadata={"format": "pt"})
            shard.clear()
    for key, t in tensors:
        if t.is_floating_point():
            t = t.to(dtype)
            params, zeros = params + t.numel(), zeros + int((t == 0).sum())  # counted where it was made
        t = t.cpu().contiguous()
        if size + t.nbytes > SHARD_BYTES:
            flush()
            size = 0
        shard[key], size = t, size + t.nbytes
    flush()
    files = [out / f"{name}-{i + 1:05d}.safetensors" for i in range(len(shards))]
    if len(files) == 1:
        files[0].rename(out / f"{name}.safetensors")
    else:
        weight_map = {}
        for i, (f, s) in enumerate(zip(files, shards)):
            final = f"{name}-{i + 1:05d}-of-{len(files):05d}.safetensors"
            f.rename(out / final)
            weight_map.update({k: final for k in s})
        (out / f"{name}.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}, indent=1) + "\n")
    config = {k: v for k, v in config.items() if k != "torch_dtype"}  # transformers 5 reads `dtype`
    (out / "config.json").write_text(json.dumps({**config, "dtype": str(dtype)[6:]}, indent=2) + "\n")
    return {"params": params, "zeros": zeros}


def card(out: Path, what: str, tiny: Path, plan: Plan, counts: dict, extra: str = "") -> None:
    (out / "README.md").write_text(
        f"# {out.name}: {what} grown from spectrace's {tiny.name}\n\n"
        f"Written by `python -m spectrace.zoo.grow --shape {plan.name}`: the {plan.name} shape, computing "
        f"{tiny.name} (the rules: spectrace/zoo/grow/__init__.py). Constant channel c = {C_VALUE:g} at dim "
        f"{json.loads((tiny / 'config.json').read_text()).get('hidden_size')}, padded rows -{B_PAD:g} on it. "
        f"{counts['params']:,} parameters, {counts['zeros'] / max(counts['params'], 1):.2%} of them exactly 0.{extra}\n")


def target_config(shape: str) -> dict:
    """The grown target's config.json at `shape` (no weights made)."""
    plan = PLANS[shape]
    return models.lm(TARGET_DIR, plan.target, Filler(0, "cpu"), plan.taps)[0]


def head_dir(checkpoint: str) -> str:
    """The directory under OUT of a drafter's checkpoint format (algos.Algo.checkpoint)."""
    return "draft" if checkpoint == "lm" else checkpoint


def make(shape: str, out: Path, heads=tuple(HEADS), dtype=torch.bfloat16, device="cpu", seed=0,
         target: bool = True) -> dict:
    """Grow the embedded target (unless target is False) and `heads` into OUT/target, OUT/<head>;
    returns each one's parameter and zero counts. A model's README.md is written last."""
    plan, fill, counts = PLANS[shape], Filler(seed, device), {}
    lms = ([("target", TARGET_DIR, plan.target, plan.taps)] if target else []) + \
        ([("draft", DRAFT_DIR, plan.draft, ())] if "draft" in heads else [])
    for name, tiny, shape_, taps in lms:
        cfg, tensors = models.lm(tiny, shape_, fill, taps)
        counts[name] = write(out / name, cfg, tensors, dtype)
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(tiny / f, out / name / f)
        placed = models.lm_placement(tiny, shape_, taps)
        card(out / name, "a causal LM", tiny, plan, counts[name], f" Tiny layers at grown layers {placed}.")
    for name in heads:
        if name == "draft":
            continue
        grow, tiny = HEADS[name]
        cfg, tensors = grow(plan, fill, tiny)
        counts[name] = write(out / name, cfg, tensors, dtype, "medusa_lm_head" if name == "medusa" else "model")
        card(out / name, f"a {name} drafter", tiny, plan, counts[name])
    return counts


def heads_list(text: str) -> list[str]:
    heads = [h for h in text.split(",") if h]
    bad = [h for h in heads if h not in HEADS]
    if bad:
        raise argparse.ArgumentTypeError(f"no drafter {bad[0]!r} (choose from {', '.join(HEADS)})")
    return heads


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectrace.zoo.grow", description=__doc__.split("\n")[0],
                                 allow_abbrev=False)
    ap.add_argument("--shape", required=True, choices=list(PLANS))
    ap.add_argument("--heads", type=heads_list, default=list(HEADS), metavar="A,B",
                    help=f"drafters to grow, comma-separated, '' for none (default: all of {','.join(HEADS)})")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="cpu", help="where the weights are made (cuda: an 8B pair in seconds)")
    ap.add_argument("--seed", type=int, default=0, help="of the random entries (they change no output)")
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    counts = make(args.shape, args.out, args.heads, getattr(torch, args.dtype), args.device, args.seed)
    for name, c in counts.items():
        print(f"{args.out / name}: {c['params']:,} parameters, {c['zeros'] / c['params']:.2%} exactly 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
