"""Train an embedded model (the target LM or the standalone draft LM) on the pinned corpus.

Models are plain `transformers` Llama checkpoints, so they load anywhere a Hugging Face directory
loads; spectrace's own explicit forward is tested against them. The reproducing commands (run on
one H200; see the model cards for the numbers they gave):

    python -m spectrace.zoo.train --model target --stdlib corpus/Lib --out spectrace/zoo/models/tiny-target
    python -m spectrace.zoo.train --model draft --stdlib corpus/Lib --out spectrace/zoo/models/tiny-draft \
        --teacher spectrace/zoo/models/tiny-target

The draft learns from the data and, with `--teacher`, from the target's next-token distribution
(loss = (1 - a) * cross-entropy + a * KL(target || draft)): a draft LM is worth what it agrees
with its target, not what it scores on the data. `--smoke` trains a toy for a few steps on CPU.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from spectrace.zoo import corpus
from spectrace.zoo.prompts import HELD_OUT_PROMPTS
from spectrace.zoo.tokenizer import TOKENIZER_DIR

# Shapes of the embedded family. The target has 8 layers so EAGLE-3's taps (2, L//2, L-3) differ.
ARCHS = {
    "target": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=4, intermediate_size=704),
    "draft": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=352),
    "smoke": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64),
}
CONTEXT = 512


def llama_config(arch: str, vocab_size: int, eos_id: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, max_position_embeddings=CONTEXT, rms_norm_eps=1e-5,
                       rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=eos_id,
                       eos_token_id=eos_id, **ARCHS[arch])


def token_stream(tokenizer, texts: list[str], eos_id: int) -> torch.Tensor:
    """All files as one stream of ids, each file followed by EOS."""
    ids = []
    for enc in tokenizer(texts)["input_ids"]:
        ids.extend(enc)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.int32)


def heldout_loss(model, stream: torch.Tensor, seq_len: int, device, max_windows: int = 256) -> float:
    """Mean next-token cross-entropy over non-overlapping windows of the held-out stream."""
    n = min((len(stream) - 1) // seq_len, max_windows)
    x = stream[: n * seq_len + 1].long()
    inputs = x[:-1].view(n, seq_len)
    labels = x[1:].view(n, seq_len)
    total = 0.0
    model.eval()
    with torch.no_grad():
        for i in range(0, n, 32):
            logits = model(inputs[i:i + 32].to(device)).logits.float()
            total += F.cross_entropy(logits.flatten(0, 1), labels[i:i + 32].to(device).flatten(),
                                     reduction="sum").item()
    model.train()
    return total / (n * seq_len)


def greedy_samples(model, tokenizer, device, max_new_tokens: int = 48) -> list[dict]:
    model.eval()
    out = []
    for prompt in HELD_OUT_PROMPTS[:4]:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]], device=device)
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        out.append({"prompt": prompt, "continuation": tokenizer.decode(gen[0, ids.shape[1]:])})
    model.train()
    return out


def train(args) -> dict:
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    eos_id = tokenizer.eos_token_id
    texts = corpus.load(args.stdlib)
    if args.smoke:
        texts = {k: v[:8] for k, v in texts.items()}
    train_ids = token_stream(tokenizer, texts["train"], eos_id)
    heldout_ids = token_stream(tokenizer, texts["heldout"], eos_id)
    print(f"tokens: train {len(train_ids):,}, held-out {len(heldout_ids):,}", flush=True)

    config = llama_config("smoke" if args.smoke else args.model, len(tokenizer), eos_id)
    model = LlamaForCausalLM(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    teacher = None
    if args.teacher:
        teacher = LlamaForCausalLM.from_pretrained(args.teacher, dtype=torch.float32).to(device).eval()

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 20)

    def lr_at(step):  # linear warm-up, cosine decay to 10%
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    gen = torch.Generator().manual_seed(args.seed)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    best = {"loss": float("inf"), "step": 0, "state": None}
    history = []
    t0 = time.time()
    for step in range(args.steps):
        starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s:s + args.seq_len + 1] for s in starts]).long().to(device)
        inputs, labels = x[:, :-1], x[:, 1:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with amp:
            logits = model(inputs).logits.float()
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            if teacher is not None:
                with torch.no_grad():
                    t_logp = F.log_softmax(teacher(inputs).logits.float(), -1)
                kl = F.kl_div(F.log_softmax(logits, -1), t_logp, log_target=True, reduction="batchmean") / args.seq_len
                loss = (1 - args.distill) * loss + args.distill * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            with amp:
                hl = heldout_loss(model, heldout_ids, args.seq_len, device)
            history.append({"step": step + 1, "train_loss": round(loss.item(), 4), "heldout_loss": round(hl, 4)})
            print(f"step {step + 1}: train {loss.item():.3f} held-out {hl:.3f} ({time.time() - t0:.0f}s)", flush=True)
            if hl < best["loss"]:  # early stopping: keep the best held-out checkpoint
                best = {"loss": hl, "step": step + 1,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    train_s = time.time() - t0

    model.load_state_dict(best["state"])
    model = model.to(torch.bfloat16)  # shipped weights are bf16: half the bytes in git
    out = Path(args.out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # the card reports the shipped (bf16-rounded) weights, evaluated in fp32
    model = model.float()
    final = heldout_loss(model, heldout_ids, args.seq_len, device)
    manifest_sha = hashlib.sha256(corpus.MANIFEST.read_bytes()).hexdigest()
    report = {
        "model": args.model, "params": n_params, "config": ARCHS["smoke" if args.smoke else args.model],
        "vocab_size": len(tokenizer), "context": CONTEXT,
        "corpus": {"manifest_sha256": manifest_sha, "train_files": len(texts["train"]),
                   "heldout_files": len(texts["heldout"]), "train_tokens": len(train_ids),
                   "heldout_tokens": len(heldout_ids)},
        "training": {"steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
                     "weight_decay": args.weight_decay, "seed": args.seed, "best_step": best["step"],
                     "teacher": args.teacher, "distill": args.distill if args.teacher else 0.0,
                     "seconds": round(train_s, 1), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                     "history": history},
        "heldout_loss": round(final, 4), "heldout_ppl": round(math.exp(final), 2),
        "command": "python -m spectrace.zoo.train " + " ".join(sys.argv[1:]),
        "samples": greedy_samples(model, tokenizer, device),
    }
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    write_card(report, out)
    print(f"saved {out}: {n_params:,} params, best step {best['step']}, held-out ppl {math.exp(final):.2f}")
    return report


def write_card(report: dict, out: Path) -> None:
    """The model card: what the model is, what it was trained on, how to rebuild it, how good it is."""
    t, c = report["training"], report["corpus"]
    arch = ", ".join(f"{k} {v}" for k, v in report["config"].items())
    samples = "\n\n".join(f"```python\n{s['prompt']}\u2502{s['continuation']}\n```" for s in report["samples"])
    teacher = f", distilled from `{t['teacher']}` with weight {t['distill']}" if t["teacher"] else ""
    (out / "README.md").write_text(f"""# {out.name}

An embedded {report['model']} model of spectrace: a Llama-architecture causal LM ({report['params']:,}
parameters; {arch}; vocabulary {report['vocab_size']}, byte-level BPE; context {report['context']};
tied embeddings; bf16 weights) trained from scratch on source code. It exists so that speculative
decoding runs with no download; it is not a useful code model.

- **Corpus**: CPython 3.11.7's standard library, pinned by path and SHA-256 in
  `spectrace/zoo/corpus_manifest.tsv` (sha256 `{c['manifest_sha256'][:16]}...`): {c['train_files']} training
  files ({c['train_tokens']:,} tokens) and {c['heldout_files']} held-out files ({c['heldout_tokens']:,} tokens),
  split by a hash of the path.
- **Training**: {t['steps']} AdamW steps of {t['batch']} x {t['seq_len']} tokens, lr {t['lr']} (cosine),
  weight decay {t['weight_decay']}, seed {t['seed']}{teacher}; the checkpoint with the best held-out loss
  (step {t['best_step']}) is kept. {t['seconds']} s on {t['device']}.
- **Held-out**: loss {report['heldout_loss']} nats/token, perplexity **{report['heldout_ppl']}** (the shipped bf16
  weights, evaluated in fp32).
- **Reproduce**: `{report['command']}` (after `python -m spectrace.zoo.corpus pack --stdlib
  <CPython 3.11.7 Lib/> --out corpus/Lib`).

Greedy continuations of held-out prompts (the bar marks where the prompt ends):

{samples}
""")


def refresh_card(out: Path) -> None:
    """Regenerate the samples (greedy, CPU, the current built-in prompts) and the card of a
    trained model directory, without training."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    report = json.loads((out / "train_report.json").read_text())
    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    report["samples"] = greedy_samples(model, AutoTokenizer.from_pretrained(out), torch.device("cpu"))
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    write_card(report, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectrace.zoo.train")
    ap.add_argument("--model", choices=["target", "draft"], required=True)
    ap.add_argument("--stdlib", type=Path, default=corpus.default_stdlib())
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--teacher", type=str, default=None, help="target model dir to distil from")
    ap.add_argument("--distill", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=CONTEXT)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="toy shapes and 8 files: a seconds-long check")
    ap.add_argument("--card-only", action="store_true", help="rewrite samples and card of --out; no training")
    args = ap.parse_args(argv)
    if args.card_only:
        refresh_card(args.out)
        return 0
    if args.out.exists() and not args.smoke:
        shutil.rmtree(args.out)
    try:
        train(args)
    except corpus.CorpusError as e:
        print(f"train: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
