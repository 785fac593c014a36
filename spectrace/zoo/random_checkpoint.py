"""Random-weight checkpoints at real shapes, in the real config and key layouts: tests and GPU runs
get Llama 3.x and Qwen3 models, and the draft heads published for them, without a download.

    python -m spectrace.zoo.random_checkpoint --shape llama-3.1-8b --device cuda OUT
    python -m spectrace.zoo.random_checkpoint --shape qwen3-8b --tiny OUT     # the family, small

OUT/target        the model, written by transformers (config.json with its RoPE, sharded
                  safetensors, generation_config.json), with a byte-level BPE tokenizer of the
                  model's vocabulary, its special tokens at their real ids, and a chat template
                  in the family's shape (Llama 3's headers; Qwen's ChatML)
OUT/draft         a standalone draft LM of the same tokenizer (Llama-3.2-1B's shape for 3.1-8B,
                  Qwen3-0.6B's for Qwen3-8B, else the target's with 2 layers)
OUT/eagle3        EAGLE-3 as SafeAILab ships it: pytorch_model.bin, `midlayer.*`, a 32000-token draft
                  vocabulary (d2t offsets, t2d), plain RoPE with theta 10000, no embedding
OUT/eagle3-sglang the same head as SpecForge exports it for SGLang: LlamaForCausalLMEagle3,
                  eagle_config's aux ids (SGLang's rule: the output of layers 1, L//2-1, L-4)
OUT/eagle3-speculators   as vLLM's speculators writes it: Eagle3Speculator, transformer_layer_config
OUT/eagle         EAGLE-1 for Llama 3 (EAGLE-LLaMA3-Instruct-8B's layout: fc without bias, its own
                  embedding, RoPE theta of the target without scaling), pytorch_model.bin
OUT/{mtp,frozen_kv_mtp,medusa,dflash}   spectrace's own formats of those drafters (the embedded ones')

The published layouts are written here from their documented key lists, not from spectrace's
classes, so loading them tests the loaders. `--tiny` keeps each family's traits (llama3 RoPE,
tied or untied head, Qwen3's q/k norm and a head_dim that is not hidden / heads, GQA) at a few
MB; `--layers` and `--vocab` override one field.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from spectrace.loading.formats import FORMATS

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
_LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, max_position_embeddings=131072,
              rms_norm_eps=1e-5, rope_parameters=LLAMA3_ROPE, bos_token_id=128000,
              eos_token_id=[128001, 128008, 128009], attention_bias=False, mlp_bias=False, hidden_act="silu")
_QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, max_position_embeddings=40960,
              rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
              bos_token_id=151643, eos_token_id=151645, attention_bias=False, hidden_act="silu")
_QWEN2 = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], max_position_embeddings=32768, rms_norm_eps=1e-6,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, bos_token_id=151643,
              eos_token_id=151645, hidden_act="silu", use_sliding_window=False)  # q/k/v bias: Qwen2's own
_MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=32768,
                max_position_embeddings=32768, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                "rope_theta": 1000000.0}, bos_token_id=1, eos_token_id=2, hidden_act="silu", sliding_window=None)
SHAPES = {  # config.json fields of the published models (docs/models.md cites them)
    "llama-3.1-8b": dict(_LLAMA, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "llama-3.2-1b": dict(_LLAMA, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                         rope_parameters={**LLAMA3_ROPE, "factor": 32.0}),
    "qwen3-8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "qwen3-0.6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen2.5-7b": dict(_QWEN2, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, head_dim=128, tie_word_embeddings=False),
    "qwen2.5-0.5b": dict(_QWEN2, vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True),
    "mistral-7b": dict(_MISTRAL, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),  # v0.3
}
DRAFT_OF = {"llama-3.1-8b": "llama-3.2-1b", "qwen3-8b": "qwen3-0.6b", "qwen2.5-7b": "qwen2.5-0.5b"}
# --tiny: 8 layers (EAGLE-3's taps 2, 4, 5 distinct); Qwen3's head_dim 32 != 64 / 4
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=1024)
DRAFT_VOCAB = 32000  # the published EAGLE-3 heads' draft_vocab_size



def _head_names() -> dict[str, tuple[str, str]]:
    """OUT's drafter directories, one per checkpoint format (loading/formats.py) and layout:
    name -> (format, layout). The plain LM's is `draft`; a format's first layout takes its bare name."""
    names = {}
    for fmt, row in FORMATS.items():
        for i, layout in enumerate(row.layouts or ("",)):
            names["draft" if fmt == "lm" else fmt + (f"-{layout}" if i else "")] = (fmt, layout)
    return names


HEADS = _head_names()


def shape_config(shape: str, tiny: bool, layers: int | None, vocab: int | None) -> dict:
    cfg = dict(SHAPES[shape])
    if tiny:
        cfg.update(TINY, head_dim=32 if cfg["model_type"] == "qwen3" else 16)
    cfg.update({k: v for k, v in (("num_hidden_layers", layers), ("vocab_size", vocab)) if v})
    if cfg["model_type"] == "mistral":  # <unk>, <s>, </s> first, as Mistral's tokenizer has them
        return cfg
    specials = 256 if cfg["model_type"] == "llama" else 293  # Llama 3: ids from 128000; Qwen: from 151643
    base = cfg["vocab_size"] - specials
    if cfg["model_type"] == "llama":
        cfg.update(bos_token_id=base, eos_token_id=[base + 1, base + 8, base + 9])
    else:
        cfg.update(bos_token_id=base, eos_token_id=base + 2)
    return cfg


# ---- the tokenizer -----------------------------------------------------------------------------

LLAMA_CHAT = ("{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December "
              "2023\\nToday Date: 26 Jul 2024\\n\\n<|eot_id|>' }}{%- for message in messages %}{{- '<|start_header_id|>' + "
              "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
              "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
MISTRAL_CHAT = ("{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}{{- '[INST] ' + "
                "message['content'] + '[/INST]' }}{%- else %}{{- message['content'] + eos_token }}{%- endif %}"
                "{%- endfor %}")
QWEN_CHAT = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
             "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def special_tokens(cfg: dict) -> list[str]:
    """The family's special tokens, in id order from the first id past the regular vocabulary."""
    if cfg["model_type"] == "llama":
        names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
        return names + [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + 256 - len(names))]
    if cfg["model_type"] == "mistral":
        return ["<unk>", "<s>", "</s>"]
    return ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_tokenizer(cfg: dict, out: Path) -> None:
    """A byte-level BPE of the model's regular vocabulary: the embedded tokenizer's merges, cut or
    extended with merges of pieces it already has, then the family's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from spectrace.zoo import TARGET_DIR

    base = json.loads((TARGET_DIR / "tokenizer.json").read_text())["model"]
    specials = special_tokens(cfg)
    first = cfg["model_type"] == "mistral"  # its special tokens come first, the others' after the vocabulary
    size = cfg["vocab_size"] - len(specials) if first else cfg["bos_token_id"]  # the regular vocabulary
    pieces = [p for p, _ in sorted(base["vocab"].items(), key=lambda kv: kv[1]) if not p.startswith("<|")][:size]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [m for m in base["merges"] if m[0] + m[1] in vocab]
    i = 0
    while len(pieces) < size:  # new pieces: each of the first pieces followed by another
        a, b = pieces[257 + i % 1024], pieces[256 + i // 1024 % (len(pieces) - 256)]
        i += 1
        if a + b not in vocab:
            vocab[a + b] = len(pieces)
            pieces.append(a + b)
            merges.append([a, b])
    if first:
        vocab = {**{t: i for i, t in enumerate(specials)}, **{p: i + len(specials) for p, i in vocab.items()}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    llama = cfg["model_type"] == "llama"
    if llama:  # Llama 3's tokenizer puts <|begin_of_text|> before every text
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", size)])
    if first:  # Mistral's tokenizer puts <s> before every text too
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    eos = specials[9] if llama else specials[2]
    chat = LLAMA_CHAT if llama else MISTRAL_CHAT if first else QWEN_CHAT
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[1] if first else specials[0],
                                   eos_token=eos, unk_token="<unk>" if first else None, chat_template=chat)
    fast.save_pretrained(out)


# ---- models ------------------------------------------------------------------------------------

def write_target(cfg: dict, out: Path, dtype, device) -> None:
    """The model by transformers: its config class, its initialisation, its save (5 GB shards)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures")}
    config = AutoConfig.for_model(cfg["model_type"], **fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(bos_token_id=cfg["bos_token_id"], eos_token_id=cfg["eos_token_id"],
                                               do_sample=True, temperature=0.6, top_p=0.9)
    model.save_pretrained(out, max_shard_size="5GB")
    write_tokenizer(cfg, out)


def _random(shapes: dict, dtype, device, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Normal(0, 0.02) matrices, ones for norm weights (as transformers initialises them)."""
    return {k: torch.ones(s, dtype=dtype, device=device) if k.endswith("norm.weight") else
            (torch.randn(s, generator=gen) * 0.02).to(device, dtype) for k, s in shapes.items()}


def llama_layer(prefix: str, c: dict, width: int, input_norm: bool = True) -> dict:
    """A Llama decoder layer's weight shapes; q/k/v read `width` (2H in EAGLE-3's layer)."""
    H, D = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    shapes = {"self_attn.q_proj.weight": (q, width), "self_attn.k_proj.weight": (kv, width),
              "self_attn.v_proj.weight": (kv, width), "self_attn.o_proj.weight": (H, q),
              "mlp.gate_proj.weight": (c["intermediate_size"], H), "mlp.up_proj.weight": (c["intermediate_size"], H),
              "mlp.down_proj.weight": (H, c["intermediate_size"]), "post_attention_layernorm.weight": (H,)}
    if input_norm:
        shapes["input_layernorm.weight"] = (H,)
    return {prefix + k: v for k, v in shapes.items()}


def head_config(cfg: dict, **extra) -> dict:
    """A one-layer Llama config at the target's width, as the published heads carry."""
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "rms_norm_eps", "bos_token_id", "eos_token_id", "hidden_act")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **{k: cfg[k] for k in keep},
            "num_hidden_layers": 1, "max_position_embeddings": 2048,
            "tie_word_embeddings": False, "torch_dtype": "float16", **extra}


def write_eagle3(cfg: dict, out: Path, layout: str, dtype, device, gen) -> None:
    """One EAGLE-3 head, three ways of writing it down."""
    from safetensors.torch import save_file

    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    draft_vocab = min(DRAFT_VOCAB, V // 2)
    head = head_config(cfg, draft_vocab_size=draft_vocab)
    prefix = "layers.0." if layout == "speculators" else "midlayer."
    shapes = {"fc.weight": (H, 3 * H), **llama_layer(prefix, head, 2 * H), prefix + "hidden_norm.weight": (H,),
              "norm.weight": (H,), "lm_head.weight": (draft_vocab, H)}
    state = _random(shapes, dtype, device, gen)
    used = torch.sort(torch.randperm(V, generator=gen)[:draft_vocab]).values  # the draft vocabulary's target ids
    state["d2t"] = (used - torch.arange(draft_vocab)).to(device)  # offsets: target id = draft id + d2t
    state["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, used, True).to(device)
    out.mkdir(parents=True, exist_ok=True)
    if layout == "safeailab":
        torch.save({k: v.cpu() for k, v in state.items()}, out / "pytorch_model.bin")
        config = head
    elif layout == "sglang":
        config = {**head, "architectures": ["LlamaForCausalLMEagle3"], "rope_theta": 10000.0, "rope_scaling": None,
                  "target_hidden_size": H,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, L // 2 - 1, L - 4]}}
    else:
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "speculators_version": "0.3.0", "draft_vocab_size": draft_vocab, "norm_before_residual": False,
                  "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": None,
                  "transformer_layer_config": {**{k: v for k, v in head.items() if k != "architectures"},
                                               "rope_theta": 10000.0, "rope_scaling": None},
                  "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                                         "verifier": {"name_or_path": None, "architectures": cfg["architectures"]}}}
    if layout != "safeailab":
        save_file({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_eagle1(cfg: dict, out: Path, dtype, device, gen) -> None:
    """EAGLE-LLaMA3-Instruct-8B's layout: fc over [embedding; feature] without bias, a layer with no
    input_layernorm, its own copy of the embedding, no lm_head; pytorch_model.bin."""
    H = cfg["hidden_size"]
    head = head_config(cfg, bias=False, rope_theta=cfg["rope_parameters"]["rope_theta"])
    shapes = {"embed_tokens.weight": (cfg["vocab_size"], H), "fc.weight": (H, 2 * H),
              **llama_layer("layers.0.", head, H, input_norm=False)}
    out.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.cpu() for k, v in _random(shapes, dtype, device, gen).items()}, out / "pytorch_model.bin")
    (out / "config.json").write_text(json.dumps(head, indent=2) + "\n")


def write_own_format(kind: str, target_dir: Path, out: Path, dtype) -> None:
    """MTP, FROZEN_KV_MTP, Medusa and DFLASH as spectrace's embedded drafters are written (their
    training script's configs), with random weights."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from spectrace.core.config import ModelConfig
    from spectrace.core.drafters.dflash import DFlashDraftModel, build_target_layer_ids
    from spectrace.core.drafters.medusa import MedusaHeads
    from spectrace.zoo import train_eagle

    target_hf = AutoConfig.from_pretrained(target_dir)
    if kind == "medusa":
        config = {"architectures": ["MedusaModel"], "medusa_num_heads": train_eagle.MEDUSA_HEADS,
                  "medusa_num_layers": 1, "hidden_size": target_hf.hidden_size, "vocab_size": target_hf.vocab_size}
        head = MedusaHeads(target_hf.hidden_size, target_hf.vocab_size, train_eagle.MEDUSA_HEADS)
    else:
        hf = train_eagle.head_config(target_hf, kind)
        if kind == "dflash":
            L = target_hf.num_hidden_layers
            ids = build_target_layer_ids(L, train_eagle.DFLASH_LAYERS)
            hf.block_size, hf.num_target_layers = train_eagle.DFLASH_BLOCK, L
            hf.dflash_config = {"mask_token_id": 5, "target_layer_ids": ids}
            head = DFlashDraftModel(ModelConfig.from_json(hf.to_dict()), ids, train_eagle.DFLASH_BLOCK, 5)
        else:
            head = train_eagle.new_head(kind, hf, target_hf)
        config = hf.to_dict()
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(dtype) if v.is_floating_point() else v).contiguous() for k, v in head.state_dict().items()}
    save_file(state, out / ("medusa_lm_head.safetensors" if kind == "medusa" else "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def make(shape: str, out: Path, heads=tuple(HEADS), tiny=False, layers=None, vocab=None, dtype=torch.bfloat16,
         device="cpu", seed=0) -> Path:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = shape_config(shape, tiny, layers, vocab)
    write_target(cfg, out / "target", dtype, device)
    for name in heads:
        fmt, layout = HEADS[name]
        if fmt == "lm":
            draft = shape_config(DRAFT_OF.get(shape, shape), tiny, None if shape in DRAFT_OF else 2, vocab)
            write_target(draft, out / name, dtype, device)
        elif fmt == "eagle3":
            write_eagle3(cfg, out / name, layout, dtype, device, gen)
        elif fmt == "eagle":
            write_eagle1(cfg, out / name, dtype, device, gen)
        else:
            write_own_format(fmt, out / "target", out / name, dtype)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectrace.zoo.random_checkpoint", description=__doc__.split("\n")[0])
    ap.add_argument("--shape", required=True, choices=list(SHAPES))
    ap.add_argument("--heads", nargs="*", default=list(HEADS), choices=list(HEADS), help="drafters to write (default: all)")
    ap.add_argument("--tiny", action="store_true", help="the family's traits at a few MB")
    ap.add_argument("--layers", type=int, help="the target's num_hidden_layers")
    ap.add_argument("--vocab", type=int, help="vocab_size")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="cpu", help="where the weights are made (cuda: an 8B model in seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    make(args.shape, args.out, args.heads, args.tiny, args.layers, args.vocab, getattr(torch, args.dtype), args.device,
         args.seed)
    print(f"wrote {args.out}: target{''.join(f', {h}' for h in args.heads)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
