"""Train the embedded EAGLE-1 head (or, with --kind mtp, the NEXTN/MTP module) against the
embedded target (frozen).

    python -m spectrace.zoo.train_eagle --stdlib corpus/Lib --out spectrace/zoo/models/tiny-eagle
    python -m spectrace.zoo.train_eagle --kind mtp --stdlib corpus/Lib --out spectrace/zoo/models/tiny-mtp

The head reads (feature f_t, token x_{t+1}) and learns to produce f_{t+1}: a KL loss to the
target's next-token distribution through the target's lm_head, plus EAGLE's smooth-L1 feature
regression. Drafting feeds the head its own outputs from the second tree level on, so training
unrolls the same way (`--unroll` levels, each fed the previous level's outputs), a small version
of EAGLE-3's training-time test. The training forward is dense (one causal sequence per row);
tests check it equals the paged forward the engine runs.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from spectrace.core.config import ModelConfig
from spectrace.core.drafters.eagle import EagleHead
from spectrace.core.drafters.mtp import MtpHead
from spectrace.core.model import rotate_half
from spectrace.zoo import TARGET_DIR, corpus
from spectrace.zoo.train import token_stream


def head_config(target_hf):
    """The head's config: the target's shapes with one layer (EAGLE-1's config.json layout)."""
    from transformers import LlamaConfig

    d = target_hf.to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id", "head_dim")
    cfg = LlamaConfig(**{k: d[k] for k in keep if k in d}, num_hidden_layers=1,
                      rope_theta=ModelConfig.from_hf(target_hf).rope_theta, tie_word_embeddings=False)
    cfg.architectures = ["LlamaForCausalLM"]
    return cfg


def dense_forward(head: EagleHead, ids: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """The head over whole sequences, causal, no KV cache: ids (B, T), feats (B, T, H) -> (B, T, H)."""
    B, T = ids.shape
    layer, attn = head.layers[0], head.layers[0].self_attn
    x = head.fuse(ids, feats)
    cos, sin = head.rotary_emb(torch.arange(T, device=ids.device), x.dtype)  # (T, 1, d)
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(B, T, attn.num_heads, attn.head_dim)
    k = attn.k_proj(h).view(B, T, attn.num_kv_heads, attn.head_dim)
    v = attn.v_proj(h).view(B, T, attn.num_kv_heads, attn.head_dim)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    group = attn.num_heads // attn.num_kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    x = x + attn.o_proj(o.transpose(1, 2).reshape(B, T, -1))
    return head.finish(x + layer.mlp(layer.post_attention_layernorm(x)))


def unrolled_losses(head, lm_head, ids, feats, target_logp, unroll: int, reg_weight: float):
    """Level 1 reads target features; level j >= 2 reads level j-1's outputs, one position on.
    ids (B, T+1) tokens; feats (B, T, H) target features; target_logp (B, T, V) at each position.
    Returns per-level (loss, top-1 agreement with the target)."""
    T = feats.shape[1]
    out, inputs = [], feats[:, :-1]
    for j in range(1, unroll + 1):
        n = T - j  # pairs (f_t, x_{t+1}) for t < n, at level j
        h = dense_forward(head, ids[:, j:j + n], inputs[:, :n])
        logp = F.log_softmax(lm_head(h).float(), -1)
        tgt = target_logp[:, j:j + n]  # the target's distribution after x_{t+1}
        kl = F.kl_div(logp, tgt, log_target=True, reduction="none").sum(-1).mean()
        reg = F.smooth_l1_loss(h.float(), feats[:, j:j + n].float())
        agree = (logp.argmax(-1) == tgt.argmax(-1)).float().mean()
        out.append((kl + reg_weight * reg, agree))
        inputs = h[:, :-1]  # the next level continues from this level's outputs
    return out


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

    cfg = head_config(target.config)
    head = (MtpHead if args.kind == "mtp" else EagleHead)(ModelConfig.from_hf(cfg)).to(device)
    head.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight)
    head.embed_tokens.weight.requires_grad_(False)  # EAGLE keeps the target's embedding frozen
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)

    def batch_from(stream, starts):
        x = torch.stack([stream[s:s + args.seq_len + 1] for s in starts]).long().to(device)
        with torch.no_grad(), amp:
            out = target(x[:, :-1], output_hidden_states=True)
        return x, out.hidden_states[-1].float(), F.log_softmax(out.logits.float(), -1)

    def evaluate():
        g = torch.Generator().manual_seed(1)
        starts = torch.randint(0, len(heldout_ids) - args.seq_len - 1, (32,), generator=g)
        head.eval()
        with torch.no_grad(), amp:
            x, f, lp = batch_from(heldout_ids, starts)
            res = unrolled_losses(head, target.lm_head, x, f, lp, args.unroll, args.reg_weight)
        head.train()
        return [round(a.item(), 4) for _, a in res]

    gen = torch.Generator().manual_seed(args.seed)
    history, t0 = [], time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=gen)
        x, f, lp = batch_from(train_ids, starts)
        with amp:
            res = unrolled_losses(head, target.lm_head, x, f, lp, args.unroll, args.reg_weight)
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
    cfg.save_pretrained(out)
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    report = {"model": args.kind, "params": sum(p.numel() for p in head.parameters()),
              "trainable_params": sum(p.numel() for p in params), "target": str(args.target),
              "training": {"steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
                           "unroll": args.unroll, "reg_weight": args.reg_weight, "seed": args.seed,
                           "seconds": round(time.time() - t0, 1),
                           "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                           "history": history},
              "heldout_agreement": history[-1]["heldout_agreement"],
              "command": "python -m spectrace.zoo.train_eagle " + " ".join(sys.argv[1:])}
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    write_card(report, out)
    print(f"saved {out}")
    return report


def write_card(report: dict, out: Path) -> None:
    t = report["training"]
    agree = ", ".join(f"level {i + 1}: {a:.3f}" for i, a in enumerate(report["heldout_agreement"]))
    what = {
        "eagle": "EAGLE-1 head of spectrace, trained against `{t}` (frozen): fc over [embedding; target "
                 "feature] (2H -> H, with bias), one Llama decoder layer without input_layernorm",
        "mtp": "NEXTN/MTP module of spectrace (DeepSeek-V3 style), trained against `{t}` (frozen): eh_proj "
               "over [enorm(embedding); hnorm(target feature)], one Llama decoder layer, shared_head.norm",
    }[report["model"]].format(t=report["target"])
    (out / "README.md").write_text(f"""# {out.name}

The embedded {what}, the target's embedding (a frozen copy) and the target's lm_head (not stored).
{report['params']:,} parameters ({report['trainable_params']:,} trained); bf16 weights.

- **Corpus**: the target's (see its card), train split.
- **Training**: {t['steps']} AdamW steps of {t['batch']} x {t['seq_len']} tokens, lr {t['lr']} (cosine), loss =
  KL(target || head) + {t['reg_weight']} x smooth-L1 feature regression, unrolled over {t['unroll']} levels
  (level j >= 2 reads level j-1's outputs), seed {t['seed']}; {t['seconds']} s on {t['device']}.
- **Held-out**: teacher-forced top-1 agreement with the target's argmax, {agree}.
- **Reproduce**: `{report['command']}`.
""")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectrace.zoo.train_eagle")
    ap.add_argument("--kind", choices=["eagle", "mtp"], default="eagle")
    ap.add_argument("--stdlib", type=Path, default=corpus.default_stdlib())
    ap.add_argument("--target", default=str(TARGET_DIR))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--unroll", type=int, default=3)
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
