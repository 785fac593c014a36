"""One run from user options to trace: load models, check inputs, generate, write the summary."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from spectrace.core.adaptive import AdaptiveConfig
from spectrace.core.config import SpectraceError
from spectrace.core.drafters.dflash import DFlashDraftModel, DFlashDrafter, load_dflash
from spectrace.core.drafters.eagle import EagleDrafter, EagleHead, load_eagle
from spectrace.core.drafters.eagle3 import load_eagle3
from spectrace.core.drafters.frozen_kv_mtp import FrozenKVMtpDrafter, FrozenKVMtpHead, load_frozen_kv_mtp
from spectrace.core.drafters.medusa import (DEFAULT_CHOICES, MC_SIM_7B_63, MedusaDrafter, MedusaHeads, load_choices,
                                           load_medusa)
from spectrace.core.drafters.mtp import load_mtp
from spectrace.core.drafters.ngram import NgramDrafter, TrieNgramDrafter
from spectrace.core.drafters.standalone import StandaloneDrafter
from spectrace.core.engine import ALGOS, Engine, Request, SpecConfig
from spectrace.core.model import CausalLM, load_model, weights_digest
from spectrace.core.ngram.trie import TrieConfig
from spectrace.core.trace import SCHEMA, TraceError, TraceWriter
from spectrace.zoo import DFLASH_DIR, DRAFT_DIR, EAGLE3_DIR, EAGLE_DIR, FROZEN_KV_MTP_DIR, MEDUSA_DIR, MTP_DIR, TARGET_DIR
from spectrace.zoo.prompts import HELD_OUT_PROMPTS

DEFAULT_DRAFTS = {"standalone": DRAFT_DIR, "eagle": EAGLE_DIR, "eagle3": EAGLE3_DIR, "nextn": MTP_DIR,
                  "mtp": MTP_DIR, "frozen_kv_mtp": FROZEN_KV_MTP_DIR, "medusa": MEDUSA_DIR, "dflash": DFLASH_DIR}
# SGLang's resolution: NEXTN (and an MTP module) runs through the EAGLE worker
RESOLVED = {"none": "NONE", "standalone": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "nextn": "EAGLE",
            "mtp": "EAGLE", "frozen_kv_mtp": "FROZEN_KV_MTP", "ngram": "NGRAM", "medusa": "MEDUSA", "dflash": "DFLASH"}
MODEL_FREE = ("none", "ngram")  # algorithms without a draft model
# draft heads that read target features, by --algo
HEAD_LOADERS = {"eagle": load_eagle, "eagle3": load_eagle3, "nextn": load_mtp, "mtp": load_mtp,
                "frozen_kv_mtp": load_frozen_kv_mtp, "medusa": load_medusa, "dflash": load_dflash}


@dataclass
class RunConfig:
    algo: str = "standalone"
    num_steps: int | None = None  # None: SGLang's automatic choice (see spec_defaults)
    topk: int | None = None
    num_draft_tokens: int | None = None
    prompts: list[str] = field(default_factory=list)
    batch: int | None = None
    max_new_tokens: int = 64
    target_model: str = str(TARGET_DIR)
    draft_model: str | None = None  # default: the embedded drafter of the algorithm
    trace: str | None = None  # default: runs/<time>-<algo>.jsonl
    acceptance: str | None = None  # None: greedy at temperature 0, target_only otherwise (SGLang)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    prompt_lookup_min: int | None = None  # n-gram; both None: 5 and 5, one None: the other's value (vLLM)
    prompt_lookup_max: int | None = None
    ngram_match: str = "first"
    ngram_style: str = "vllm"
    ngram_trie: TrieConfig = field(default_factory=TrieConfig)
    adaptive: bool = False
    medusa_choices: str | None = None  # a JSON file of Medusa choices; default: the first 24 of mc_sim_7b_63
    commit_style: str = "sglang"
    device: str = "cpu"
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on GPU


@dataclass
class RunResult:
    requests: list[Request]
    texts: list[str]
    metrics: dict
    trace_path: Path
    spec: SpecConfig


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_prompts(prompts: list[str], batch: int | None) -> list[str]:
    """`--batch N` tops the given prompts up with built-in held-out prompts of other lengths."""
    if batch is None:
        return list(prompts) or HELD_OUT_PROMPTS[:1]
    if batch < 1:
        raise SpectraceError("--batch must be at least 1")
    if batch < len(prompts):
        raise SpectraceError(f"--batch {batch} is smaller than the {len(prompts)} prompts given")
    extra = [HELD_OUT_PROMPTS[i % len(HELD_OUT_PROMPTS)] for i in range(batch - len(prompts))]
    return list(prompts) + extra


def dflash_shape(cfg: RunConfig, draft: DFlashDraftModel) -> tuple[int, int, int]:
    """SGLang: num_draft_tokens = the block size (a given value must match it), topk 1; here
    num_steps = block size - 1 bounds the walk (SGLang sets 1 and verifies the whole block)."""
    B = draft.block_size
    if cfg.topk not in (None, 1) or cfg.num_draft_tokens not in (None, B) or cfg.num_steps not in (None, B - 1):
        raise SpectraceError(f"DFLASH drafts one block of {B} tokens (its block_size): --num-draft-tokens must be {B}, "
                             f"--num-steps {B - 1} and --topk 1, or left out")
    return B - 1, 1, B


def spec_defaults(cfg: RunConfig, target_arch: str) -> tuple[int, int, int | None]:
    """(num_steps, topk, num_draft_tokens) as SGLang's `_auto_choose_speculative_params` picks
    them when none is given: (5, 4, 8) on Llama targets, except for STANDALONE, else (3, 1, 4).
    Values given are kept; topk 1 then forces num_draft_tokens = num_steps + 1."""
    if cfg.algo == "medusa":  # the static tree's depth, widest rank and size
        if (cfg.num_steps, cfg.topk, cfg.num_draft_tokens) != (None, None, None):
            raise SpectraceError("Medusa's tree is given by --medusa-choices: --num-steps, --topk and "
                                 "--num-draft-tokens do not apply")
        choices = medusa_choices(cfg)
        return max(map(len, choices)), max(max(c) for c in choices) + 1, len(choices) + 1
    if cfg.algo == "ngram" and cfg.ngram_style == "sglang":
        # SGLang: topk = max_bfs_breadth, n = 12, num_steps = n // topk (unused by its n-gram verify,
        # whose accept width is n); here num_steps bounds the walk, so n - 1
        n = cfg.num_draft_tokens or 12
        return n - 1, cfg.ngram_trie.max_bfs_breadth, n
    if cfg.algo == "ngram":  # a chain of k = num_steps copied tokens
        steps, topk, n = 5, 1, 6
    elif cfg.adaptive:  # SGLang: topk 1, the middle tier
        tiers = AdaptiveConfig().candidate_steps
        steps, topk, n = tiers[len(tiers) // 2], 1, tiers[len(tiers) // 2] + 1
    elif cfg.algo != "standalone" and target_arch == "LlamaForCausalLM":
        steps, topk, n = 5, 4, 8
    else:
        steps, topk, n = 3, 1, 4
    if cfg.num_steps is None and cfg.topk is None and cfg.num_draft_tokens is None:
        return steps, topk, n
    return (cfg.num_steps if cfg.num_steps is not None else steps,
            cfg.topk if cfg.topk is not None else topk, cfg.num_draft_tokens)


def medusa_choices(cfg: RunConfig) -> list[list[int]]:
    return load_choices(cfg.medusa_choices) if cfg.medusa_choices else MC_SIM_7B_63[:DEFAULT_CHOICES]


def ngram_lookup(cfg: RunConfig) -> dict:
    """vLLM's SpeculativeConfig: both None -> 5 and 5; one None -> it copies the other."""
    lo, hi = cfg.prompt_lookup_min, cfg.prompt_lookup_max
    lo, hi = (lo if lo is not None else hi), (hi if hi is not None else lo)
    return {"prompt_lookup_min": lo if lo is not None else 5, "prompt_lookup_max": hi if hi is not None else 5}


def validate(cfg: RunConfig) -> None:
    if cfg.algo not in ALGOS:
        raise SpectraceError(f"unknown --algo {cfg.algo!r} (available: {', '.join(ALGOS)})")
    if cfg.num_steps is not None and cfg.num_steps < 1:
        raise SpectraceError(f"--num-steps must be at least 1, got {cfg.num_steps}")
    if cfg.topk is not None and cfg.topk < 1:
        raise SpectraceError(f"--topk must be at least 1, got {cfg.topk}")
    if cfg.max_new_tokens < 1:
        raise SpectraceError(f"--max-new-tokens must be at least 1, got {cfg.max_new_tokens}")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise SpectraceError("--device cuda asked for, but torch sees no GPU")
    if cfg.dtype is not None and cfg.dtype not in DTYPES:
        raise SpectraceError(f"unknown --dtype {cfg.dtype!r} (choose from {', '.join(DTYPES)})")


def check_model_dir(path: str, flag: str) -> None:
    if not Path(path).is_dir():
        raise SpectraceError(f"{flag} {path}: no such directory")
    if not (Path(path) / "config.json").is_file():
        raise SpectraceError(f"{flag} {path}: not a Hugging Face model directory (no config.json)")


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:  # local files only: spectrace never reaches for a model hub
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise SpectraceError(f"no usable tokenizer in {path}: {str(e).splitlines()[0]}") from None


def load_drafter_model(algo: str, path: str, target: CausalLM, tok, dtype, device):
    """The draft LM (standalone) or the draft head that reads target features (the others)."""
    if algo == "standalone":
        draft = load_model(path, dtype, device)
        check_vocab(target, draft, tok, path)
        return draft
    return HEAD_LOADERS[algo](path, target).to(dtype)


def check_vocab(target: CausalLM, draft: CausalLM, tok, draft_path: str) -> None:
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise SpectraceError(f"draft vocabulary ({dv} tokens) differs from the target's ({tv})")
    if (Path(draft_path) / "tokenizer.json").is_file():
        if load_tokenizer(draft_path).get_vocab() != tok.get_vocab():
            raise SpectraceError("draft tokenizer differs from the target's: same size, other tokens")


def _architecture(path: str) -> str:
    import json

    return (json.loads((Path(path) / "config.json").read_text()).get("architectures") or [""])[0]


def model_identity(path: str, model) -> dict:
    ident = {"path": str(path), "weights_sha256": weights_digest(Path(path)), "class": type(model).__name__,
             "params": sum(p.numel() for p in model.parameters()), "dtype": str(next(model.parameters()).dtype)}
    if isinstance(model, MedusaHeads):  # no transformer layers: heads over the target's hidden state
        return {**ident, "model_type": "medusa", "heads": model.num_heads, "layers_per_head": model.num_layers}
    c = model.config
    return {**ident, "model_type": c.model_type, "layers": len(model.layers), "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size}


def _max_steps(spec: SpecConfig) -> int:
    """The deepest chain or tree a step may draft: num_steps, or the top tier of adaptive steps."""
    return max(AdaptiveConfig().candidate_steps + [spec.num_steps]) if spec.adaptive else spec.num_steps


def _lookahead(spec: SpecConfig) -> int:
    """Positions past the committed ones a step may reach: the root and num_steps levels."""
    return _max_steps(spec) + 1 if spec.algo != "none" else 1


def _scratch_columns(spec: SpecConfig) -> int:
    """`req_to_token` columns past the committed ones a step may map: the verify tree's nodes
    (target) or the draft's [topk][step] scratch (draft)."""
    steps = _max_steps(spec)
    return max(spec.num_draft_tokens, steps + 1, spec.topk * (steps - 1) + 1) + 1


def _context(target: CausalLM, draft) -> int:
    return min(m.config.max_position_embeddings for m in (target, draft) if hasattr(m, "config"))  # Medusa has none


def build_engine(target: CausalLM, draft: CausalLM | None, spec: SpecConfig, prompt_ids: list[list[int]],
                 eos_token_ids, trace: TraceWriter | None = None) -> Engine:
    """An engine whose KV pools hold every request at full length at once."""
    columns = _context(target, draft) + _scratch_columns(spec)
    num_slots = sum(len(p) + spec.max_new_tokens + _scratch_columns(spec) for p in prompt_ids)
    drafter = None
    shape = (spec.num_steps, spec.topk, spec.num_draft_tokens, spec.trace_topk)
    if isinstance(draft, DFlashDraftModel):
        drafter = DFlashDrafter(draft, target, spec.trace_topk)
    elif isinstance(draft, MedusaHeads):
        drafter = MedusaDrafter(draft, spec.medusa_choices, spec.trace_topk)
    elif spec.algo == "ngram" and spec.ngram_style == "sglang":
        drafter = TrieNgramDrafter(spec.num_draft_tokens, spec.ngram_trie, target.lm_head.weight.device)
    elif spec.algo == "ngram":
        drafter = NgramDrafter(spec.num_steps, spec.prompt_lookup_min, spec.prompt_lookup_max, spec.ngram_match,
                               target.config.max_position_embeddings, target.lm_head.weight.device)
    elif isinstance(draft, FrozenKVMtpHead):  # no draft KV: it reads the target's
        drafter = FrozenKVMtpDrafter(draft, target, *shape)
    elif draft is not None:
        draft_kv = draft.new_kv_cache("draft", spec.commit_style, num_slots, len(prompt_ids), columns)
        if isinstance(draft, EagleHead):  # EAGLE, EAGLE-3 and NEXTN/MTP heads
            drafter = EagleDrafter(draft, target, draft_kv, *shape)
        else:
            drafter = StandaloneDrafter(draft, draft_kv, *shape)
    return Engine(target, spec, eos_token_ids, drafter, trace, num_slots, len(prompt_ids), columns)


def run(cfg: RunConfig) -> RunResult:
    validate(cfg)
    prompts = resolve_prompts(cfg.prompts, cfg.batch)
    trace_path = Path(cfg.trace or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.algo}.jsonl")
    draft_path = str(cfg.draft_model or DEFAULT_DRAFTS.get(cfg.algo, ""))
    check_model_dir(cfg.target_model, "--target-model")
    if cfg.algo not in MODEL_FREE:
        check_model_dir(draft_path, "--draft-model")
    tok = load_tokenizer(cfg.target_model)

    def token_text(i: int) -> str:
        return tok.decode([i])

    # open the trace first: a path that cannot be written fails before any model work
    try:
        writer = TraceWriter(trace_path, token_text)
    except TraceError as e:
        raise SpectraceError(str(e)) from None
    header_written = False
    try:
        dtype = DTYPES[cfg.dtype] if cfg.dtype else (torch.float32 if cfg.device == "cpu" else torch.bfloat16)
        target = load_model(cfg.target_model, dtype, cfg.device)
        draft = None
        if cfg.algo not in MODEL_FREE:
            draft = load_drafter_model(cfg.algo, draft_path, target, tok, dtype, cfg.device)
        ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
        if isinstance(draft, DFlashDraftModel):
            num_steps, topk, n = dflash_shape(cfg, draft)
        else:
            num_steps, topk, n = spec_defaults(cfg, _architecture(cfg.target_model))
        spec = SpecConfig(algo=cfg.algo, num_steps=num_steps, topk=topk, num_draft_tokens=n,
                          max_new_tokens=cfg.max_new_tokens, commit_style=cfg.commit_style,
                          acceptance=cfg.acceptance, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                          seed=cfg.seed, threshold_single=cfg.threshold_single, threshold_acc=cfg.threshold_acc,
                          **ngram_lookup(cfg), ngram_match=cfg.ngram_match, ngram_style=cfg.ngram_style,
                          ngram_trie=cfg.ngram_trie, adaptive=cfg.adaptive,
                          medusa_choices=medusa_choices(cfg) if cfg.algo == "medusa" else None)
        context = _context(target, draft)
        for i, p in enumerate(ids):
            if not p:
                raise SpectraceError(f"prompt {i} is empty")
            need = len(p) + cfg.max_new_tokens + _lookahead(spec)
            if need > context:
                raise SpectraceError(
                    f"prompt {i} is {len(p)} tokens: with --max-new-tokens {cfg.max_new_tokens} it needs "
                    f"{need} positions, more than the model's context of {context}")
        eos = target.config.eos_token_ids or ((tok.eos_token_id,) if tok.eos_token_id is not None else ())
        engine = build_engine(target, draft, spec, ids, eos, writer)

        models = {"target": model_identity(cfg.target_model, target)}
        if draft is not None:
            models["draft"] = model_identity(draft_path, draft)
        header = {"kind": "header", "schema": SCHEMA,
                  "config": {**asdict(cfg), "prompts": prompts, "draft_model": draft_path,
                             "num_steps": spec.num_steps, "topk": spec.topk,
                             "num_draft_tokens": spec.num_draft_tokens, "acceptance": spec.acceptance,
                             "resolved_algorithm": RESOLVED[cfg.algo]},
                  "models": models, "eos_token_ids": sorted(engine.eos), "device": cfg.device,
                  "torch": torch.__version__}
        writer.write(header, [t for p in ids for t in p])
        header_written = True
        reqs, metrics = engine.generate(ids)
        texts = [tok.decode(r.output_ids) for r in reqs]
        summary = {"kind": "summary", "metrics": metrics, "requests": [
            {"request": r.req, "prompt_ids": r.prompt_ids, "output_ids": r.output_ids,
             "prompt_text": prompts[r.req], "output_text": texts[r.req], "finish_reason": r.finish_reason}
            for r in reqs]}
        writer.write(summary, [t for r in reqs for t in r.output_ids])
    finally:
        writer.close()
        if not header_written:  # refused before the run began: leave no empty trace behind
            trace_path.unlink(missing_ok=True)
    return RunResult(reqs, texts, metrics, trace_path, spec)
