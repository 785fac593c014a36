"""Train the embedded draft heads against the embedded target (frozen): the EAGLE-1 head, the
NEXTN/MTP module, the EAGLE-3 head, the FROZEN_KV_MTP assistant, the Medusa heads and the
DFLASH block drafter.

    python -m spectrace.zoo.train_eagle --kind eagle --stdlib corpus/Lib --out spectrace/zoo/models/tiny-eagle
    python -m spectrace.zoo.train_eagle --kind mtp --stdlib corpus/Lib --out spectrace/zoo/models/tiny-mtp
    python -m spectrace.zoo.train_eagle --kind eagle3 --stdlib corpus/Lib --out spectrace/zoo/models/tiny-eagle3
    python -m spectrace.zoo.train_eagle --kind frozen_kv_mtp --stdlib corpus/Lib --out spectrace/zoo/models/tiny-frozen-kv-mtp
    python -m spectrace.zoo.train_eagle --kind medusa --stdlib corpus/Lib --out spectrace/zoo/models/tiny-medusa
    python -m spectrace.zoo.train_eagle --kind dflash --stdlib corpus/Lib --out spectrace/zoo/models/tiny-dflash

What each head learns, and how training unrolls it as drafting does: zoo/head_losses.py.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from spectrace.core.config import ModelConfig
from spectrace.core.drafters.dflash import DFlashDraftModel, build_target_layer_ids
from spectrace.core.drafters.eagle import EagleHead
from spectrace.core.drafters.eagle3 import Eagle3Head
from spectrace.core.drafters.eagle3_layouts import default_capture_layers
from spectrace.core.drafters.frozen_kv_mtp import FrozenKVMtpHead
from spectrace.core.drafters.medusa import MedusaHeads
from spectrace.core.drafters.mtp import MtpHead
from spectrace.loading.formats import FORMATS
from spectrace.zoo.head_losses import dflash_losses, medusa_losses, unrolled_losses
from spectrace.zoo import TARGET_DIR, corpus
from spectrace.zoo.train import token_stream

KINDS = tuple(fmt for fmt in FORMATS if fmt != "lm")  # every head's format (train.py trains the plain LMs)
MEDUSA_HEADS = 3  # the default tree (the first 24 Medusa choices) is 3 deep
DFLASH_LAYERS, DFLASH_BLOCK = 3, 8  # draft layers (taps 1, 3, 5), block size


def head_config(target_hf, kind: str, draft_vocab_size: int | None = None):
    """The head's config.json: the target's shapes, one layer (two for the FROZEN_KV_MTP
    assistant), plus the fields each format adds."""
    from transformers import LlamaConfig

    d = target_hf.to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id", "head_dim")
    extra = {}
    L = target_hf.num_hidden_layers
    if kind == "eagle3":  # ids i mean "the output of layer i": layer i + 1's input is captured
        extra = {"draft_vocab_size": draft_vocab_size,
                 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in default_capture_layers(L)]}}
    if kind == "frozen_kv_mtp":
        extra = {"backbone_hidden_size": target_hf.hidden_size}
    layers = {"frozen_kv_mtp": 2, "dflash": DFLASH_LAYERS}.get(kind, 1)
    cfg = LlamaConfig(**{k: d[k] for k in keep if k in d}, num_hidden_layers=layers,
                      rope_theta=ModelConfig.from_json(target_hf.to_dict()).rope_theta, tie_word_embeddings=False, **extra)
    cfg.architectures = [{"eagle3": "LlamaForCausalLMEagle3", "frozen_kv_mtp": "FrozenKVMtpForCausalLM",
                          "dflash": "DFlashDraftModel"}.get(
        kind, "LlamaForCausalLM")]
    return cfg


def new_head(kind: str, hf_cfg, target_cfg, d2t=None, t2d=None):
    cfg = ModelConfig.from_json(hf_cfg.to_dict())
    if kind == "eagle3":
        head = Eagle3Head(cfg, len(d2t), target_cfg.hidden_size, default_capture_layers(target_cfg.num_hidden_layers))
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
        return head
    if kind == "frozen_kv_mtp":
        return FrozenKVMtpHead(cfg, target_cfg.hidden_size, target_cfg.num_hidden_layers - 1)
    return (MtpHead if kind == "mtp" else EagleHead)(cfg)


def draft_vocab(train_ids: torch.Tensor, vocab_size: int, size: int):
    """EAGLE-3's draft vocabulary: the `size` most frequent training tokens, in id order.
    Returns d2t (draft id -> target id offset), t2d (target id in the draft vocab) and coverage."""
    counts = torch.bincount(train_ids.long(), minlength=vocab_size)
    used = torch.sort(torch.topk(counts, size).indices).values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(size), t2d, counts[used].sum().item() / counts.sum().item()


def train(args) -> dict:
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    target = LlamaForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(args.target)
    texts = corpus.load(args.stdlib)
    if args.smoke:
        texts = {k: v[:8] for k, v in texts.items()}
    train_ids = token_stream(tok, texts["train"], tok.eos_token_id)
    heldout_ids = token_stream(tok, texts["heldout"], tok.eos_token_id)

    d2t = t2d = None
    coverage = None
    if args.kind == "eagle3":
        d2t, t2d, coverage = draft_vocab(train_ids, target.config.vocab_size, args.draft_vocab)
        print(f"draft vocabulary: {args.draft_vocab} tokens cover {coverage:.3f} of the training tokens")
    if args.kind == "medusa":  # Medusa's own config.json; each head's lm_head starts as the target's
        cfg = {"architectures": ["MedusaModel"], "medusa_num_heads": MEDUSA_HEADS, "medusa_num_layers": 1,
               "hidden_size": target.config.hidden_size, "vocab_size": target.config.vocab_size,
               "base_model_name_or_path": _shown_path(args.target)}
        head = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], MEDUSA_HEADS).to(device)
        for h in head.medusa_head:
            h[-1].weight.data.copy_(target.lm_head.weight)
    elif args.kind == "dflash":  # the mask token: the rarest token of the training data
        cfg = head_config(target.config, "dflash")
        L = target.config.num_hidden_layers
        mask_id = int(torch.argmin(torch.bincount(train_ids.long(), minlength=target.config.vocab_size)))
        layer_ids = build_target_layer_ids(L, DFLASH_LAYERS)
        cfg.block_size, cfg.num_target_layers = DFLASH_BLOCK, L
        cfg.dflash_config = {"mask_token_id": mask_id, "target_layer_ids": layer_ids}
        head = DFlashDraftModel(ModelConfig.from_json(cfg.to_dict()), layer_ids, DFLASH_BLOCK, mask_id).to(device)
    else:
        cfg = head_config(target.config, args.kind, args.draft_vocab)
        head = new_head(args.kind, cfg, target.config, d2t, t2d).to(device)
    if hasattr(head, "embed_tokens"):  # EAGLE heads keep a frozen copy of the target's embedding
        head.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight)
        head.embed_tokens.weight.requires_grad_(False)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    capture = getattr(head, "capture_layers", ())

    def batch_from(stream, starts):
        """Tokens (B, T+1) and the target's features, logits and last-layer KV over the first T."""
        x = torch.stack([stream[s:s + args.seq_len + 1] for s in starts]).long().to(device)
        with torch.no_grad(), amp:
            out = target(x[:, :-1], output_hidden_states=True, use_cache=args.kind == "frozen_kv_mtp")
        hs = out.hidden_states  # hs[i]: the input of layer i; hs[-1]: after the final norm
        feats = torch.cat([hs[i] for i in capture], -1) if capture else hs[-1]
        kv = None
        if args.kind == "frozen_kv_mtp":
            layer = (getattr(out, "cache", None) or out.past_key_values).layers[-1]
            kv = (layer.keys.transpose(1, 2), layer.values.transpose(1, 2))  # (B, T, kvh, d)
        return x, feats.float(), out.logits, kv

    def losses(batch):
        x, f, logits, kv = batch
        if args.kind == "medusa":
            return medusa_losses(head, f, logits)
        if args.kind == "dflash":
            return dflash_losses(head, target, x[:, :-1], f, logits, loss_gen)
        return unrolled_losses(args.kind, head, target, x, f, logits, kv, args.unroll, args.reg_weight)

    loss_gen = torch.Generator().manual_seed(args.seed + 1)  # DFLASH's anchors

    def evaluate():
        g = torch.Generator().manual_seed(1)
        starts = torch.randint(0, len(heldout_ids) - args.seq_len - 1, (32,), generator=g)
        head.eval()
        with torch.no_grad(), amp:
            res = losses(batch_from(heldout_ids, starts))
        head.train()
        return [round(a.item(), 4) for _, a in res]

    gen = torch.Generator().manual_seed(args.seed)
    history, t0 = [], time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=gen)
        batch = batch_from(train_ids, starts)
        with amp:
            res = losses(batch)
            loss = sum(l for l, _ in res) / len(res)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            agree = evaluate()
            history.append({"step": step + 1, "loss": round(loss.item(), 4), "heldout_agreement": agree})
            print(f"step {step + 1}: loss {loss.item():.3f} held-out top-1 agreement per level {agree} "
                  f"({time.time() - t0:.0f}s)", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v).contiguous().cpu()
             for k, v in head.state_dict().items()}
    if args.kind == "medusa":
        (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
        save_file(state, out / "medusa_lm_head.safetensors", metadata={"format": "pt"})
    else:
        cfg.save_pretrained(out)
        save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    report = {"model": args.kind, "params": sum(p.numel() for p in head.parameters()),
              "trainable_params": sum(p.numel() for p in params), "target": _shown_path(args.target),
              "training": {"steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
                           "unroll": args.unroll if args.kind not in ("medusa", "dflash") else None, "reg_weight": args.reg_weight, "seed": args.seed,
                           "seconds": round(time.time() - t0, 1),
                           "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                           "history": history},
              "capture_layers": list(capture) or None,
              "draft_vocab": {"size": args.draft_vocab, "train_coverage": round(coverage, 4)} if coverage else None,
              "heldout_agreement": history[-1]["heldout_agreement"],
              "command": "python -m spectrace.zoo.train_eagle " + " ".join(sys.argv[1:])}
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    write_card(report, out)
    print(f"saved {out}")
    return report


def _shown_path(path) -> str:
    """A path as the card shows it: relative to the working directory when under it."""
    p = Path(path).resolve()
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(path)


CARDS = {  # (what the head is, what it shares with the target, its loss)
    "eagle": ("EAGLE-1 head: fc over [embedding; target feature] (2H -> H, with bias), one Llama decoder "
              "layer without input_layernorm",
              "the target's embedding (a frozen copy) and the target's lm_head (not stored)",
              "KL(target || head) + {reg} x smooth-L1 regression on the next target feature"),
    "mtp": ("NEXTN/MTP module (DeepSeek-V3 style): eh_proj over [enorm(embedding); hnorm(target feature)], "
            "one Llama decoder layer, shared_head.norm",
            "the target's embedding (a frozen copy) and the target's lm_head (not stored)",
            "KL(target || head) + {reg} x smooth-L1 regression on the next target feature"),
    "eagle3": ("EAGLE-3 head: fc over the target's features entering layers {taps} (3H -> H), a midlayer whose "
               "q/k/v read [input_layernorm(embedding); hidden_norm(feature)], norm and its own lm_head over "
               "a draft vocabulary of {vocab} tokens (d2t / t2d maps; {cov:.1%} of training tokens)",
               "the target's embedding (a frozen copy)",
               "cross-entropy against the target restricted to the draft vocabulary, where the target's argmax "
               "is in it"),
    "frozen_kv_mtp": ("FROZEN_KV_MTP assistant (Gemma 4 assistant data flow, Llama blocks): pre_projection over "
                      "[target embedding; hidden] (2H -> H), two Llama blocks whose attention has queries only "
                      "and reads the target's last-layer KV, norm, post_projection (H -> H) and its own lm_head",
                      "the target's embedding and KV (read, not stored)", "KL(target || head)"),
    "dflash": (f"DFLASH block drafter ({DFLASH_LAYERS} Qwen3-shaped layers with q/k norms, no causal mask in the "
               f"block, context K/V from fc over the target's hidden states entering layers {{taps}}, block size "
               f"{DFLASH_BLOCK})",
               "the target's embedding and lm_head (not stored)",
               "KL(target || draft) at every row of blocks [x_a, MASK, ...] at 16 random anchors per sequence"),
    "medusa": (f"Medusa heads ({MEDUSA_HEADS} heads, each ResBlock(H) then its own lm_head, public Medusa layout)",
               "the target's last hidden state (read, not stored)",
               "KL(target || head k) for the token k + 2 ahead, heads weighted alike"),
}


def write_card(report: dict, out: Path) -> None:
    t = report["training"]
    agree = ", ".join(f"level {i + 1}: {a:.3f}" for i, a in enumerate(report["heldout_agreement"]))
    vocab = report.get("draft_vocab") or {}
    what, shares, loss = CARDS[report["model"]]
    unrolled = (f"unrolled over {t['unroll']} levels as the head drafts (EAGLE-3's\n  training-time test: level j >= 2 "
                f"reads level j-1's outputs), " if t["unroll"] else "")
    what = what.format(taps=report.get("capture_layers"), vocab=vocab.get("size"), cov=vocab.get("train_coverage", 0))
    (out / "README.md").write_text(f"""# {out.name}

The embedded {what}, trained by spectrace against `{report['target']}` (frozen). It uses {shares}.
{report['params']:,} parameters ({report['trainable_params']:,} trained); bf16 weights.

- **Corpus**: the target's (see its card), train split.
- **Training**: {t['steps']} AdamW steps of {t['batch']} x {t['seq_len']} tokens, lr {t['lr']} (cosine), loss =
  {loss.format(reg=t['reg_weight'])}, {unrolled}seed {t['seed']}; {t['seconds']} s on {t['device']}.
- **Held-out**: teacher-forced top-1 agreement with the target's argmax, {agree}.
- **Reproduce**: `{report['command']}`.
""")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectrace.zoo.train_eagle")
    ap.add_argument("--kind", choices=KINDS, default="eagle")
    ap.add_argument("--stdlib", type=Path, default=corpus.default_stdlib())
    ap.add_argument("--target", default=str(TARGET_DIR))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--unroll", type=int, default=5, help="levels of the training-time test")
    ap.add_argument("--draft-vocab", type=int, default=3072, help="EAGLE-3's draft vocabulary size")
    ap.add_argument("--reg-weight", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="8 files, a few steps: a seconds-long check")
    args = ap.parse_args(argv)
    try:
        train(args)
    except corpus.CorpusError as e:
        print(f"train_eagle: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
