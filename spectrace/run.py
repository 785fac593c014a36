"""One run from user options to trace (the application layer, above core, zoo and viz):
resolve and check the options, load the models, build the engine, generate, write the summary.

    cfg = RunConfig(algo="eagle", topk=4)      # the CLI's options, as data
    result = run(cfg)                          # the trace is at result.trace_path

Every option is checked once: the run's own here (`RunConfig.check`), the engine's when its
SpecConfig is made, the drafters' by their own config (NgramConfig, Medusa choices). All of it
happens before any weights load, so a bad option costs no model loading.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

import torch

from spectrace import batch_policy
from spectrace.algos import ALGOS, DEFAULT_ALGO
from spectrace.core.adaptive import AdaptiveConfig
from spectrace.core.config import read_config_json
from spectrace.core.drafters.medusa import DEFAULT_CHOICES, MC_SIM_7B_63, MedusaTree, load_choices
from spectrace.core.drafters.ngram import NgramConfig
from spectrace.core.request import Request
from spectrace.core.model import CausalLM
from spectrace.core.ngram.trie import TrieConfig
from spectrace.core.probs import UNSEALED, ProbsRecorder, seal, sidecar_path
from spectrace.core.ranges import check_ranges
from spectrace.core.shape import resolve_shape
from spectrace.core.spec import SpecConfig
from spectrace.core.trace import SCHEMA, TraceError, TraceWriter, default_trace_path
from spectrace.engines import build_engine, context, kv_bytes, lookahead
from spectrace.errors import Interrupted, SpectraceError, first_line
from spectrace.loading.models import check_fits, find_model, load_models, model_identity
from spectrace.loading.tokenizer import Tokenizer, load_tokenizer
from spectrace.zoo import MODELS_DIR, TARGET_DIR
from spectrace.zoo.prompts import HELD_OUT_PROMPTS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# explicit: the reference; triton: the same engine, its hot operations through the Triton twins
# (kernels/backend.py); fast: the batched engine on the twins with CUDA graphs (fast/engine.py)
BACKENDS = ("explicit", "triton", "fast")
# What the trace keeps: full, every step record with the target's and drafter's top-k at each tree
# node; steps, the same records without the top-k lists; off, no trace file at all.
TRACE_LEVELS = {"full": 5, "steps": 0, "off": 0}  # -> SpecConfig.trace_topk
SMALL_MODEL = 50_000_000  # parameters; below this a CPU run uses one thread (see choose_threads)


@dataclass
class RunConfig:
    """A run's options as given (the CLI's, as data; the trace header records them). The fields it
    shares with SpecConfig keep their names and pass to it as they are (`resolve`), except the
    shape, which may be None here for SGLang's automatic choice: that needs the models' configs."""

    algo: str = DEFAULT_ALGO
    num_steps: int | None = None  # None: SGLang's automatic choice (core/shape.py)
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
    batch_policy: str | None = None  # the shape chosen by the number of requests (batch_policy.py)
    # a JSON file of Medusa choices, or the list itself (--speculative-config's chain); default: the
    # first 24 of mc_sim_7b_63
    medusa_choices: str | list | None = None
    commit_style: str = "sglang"
    device: str = "cpu"
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on GPU
    backend: str = "explicit"  # or "triton": the hot operations through spectrace/kernels
    trace_level: str = "full"  # TRACE_LEVELS
    deterministic: bool = False  # batch-invariant verify: output bit-identical to plain decoding's
    record_probs: bool = False  # a sidecar of every walk's distributions and random numbers (spectrace rejudge)
    raw_prompt: bool = False  # the prompt's text as it is, not through the target's chat template
    mem_fraction_static: float = 0.9  # SGLang's: the share of the device weights and KV caches may fill

    def check(self) -> None:
        """What only the run knows: where it runs and how many requests."""
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise SpectraceError(f"unknown --device {self.device!r} (cpu, or cuda / cuda:N with a GPU)")
        check_gpu(self.device)
        if self.backend not in BACKENDS:
            raise SpectraceError(f"unknown --backend {self.backend!r} (choose from {', '.join(BACKENDS)})")
        if self.backend in ("triton", "fast"):
            from spectrace.kernels import require
            require(self.device)
        if self.backend in ("triton", "fast") and self.device == "cpu" and self.dtype == "bfloat16":
            raise SpectraceError("--dtype bfloat16 on the CPU runs on --backend explicit: the Triton interpreter "
                                 "computes with numpy, which has no bfloat16 (use float32 or float16, or a GPU)")
        if self.deterministic and self.backend == "triton":
            raise SpectraceError("--deterministic runs on --backend explicit or fast: --backend triton's attention "
                                 "reduces over a verify's keys in its own tiling")
        if self.trace_level not in TRACE_LEVELS:
            raise SpectraceError(f"unknown --trace-level {self.trace_level!r} (choose from {', '.join(TRACE_LEVELS)})")
        if self.record_probs and (self.trace_level == "off" or self.algo == "none"):
            why = ("it is written beside the trace: --trace-level off writes none" if self.trace_level == "off" else
                   "--algo none verifies no drafts: there is nothing to re-judge")
            raise SpectraceError(f"--record-probs: {why}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise SpectraceError(f"unknown --dtype {self.dtype!r} (choose from {', '.join(DTYPES)})")
        check_ranges(seed=self.seed, top_k=self.top_k, batch=self.batch, mem_fraction_static=self.mem_fraction_static)
        for i, p in enumerate(self.prompts):
            try:
                p.encode("utf-8")
            except UnicodeEncodeError:
                raise SpectraceError(f"--prompt {i} is not valid UTF-8 text") from None
        if self.batch_policy is not None:
            batch_policy.check(self)
        if self.batch is not None and self.batch < len(self.prompts):
            raise SpectraceError(f"--batch {self.batch} is smaller than the {len(self.prompts)} prompts given")

    @property
    def torch_dtype(self) -> torch.dtype:
        """--dtype, else float32 on the CPU and bfloat16 on a GPU."""
        return DTYPES[self.dtype] if self.dtype else (torch.float32 if self.device == "cpu" else torch.bfloat16)

    @property
    def draft_path(self) -> str | None:
        """The drafter's directory: --draft-model, else the algorithm's embedded drafter; None for an
        algorithm that drafts without a model (bench's `none` row beside a --draft-model)."""
        algo = ALGOS.get(self.algo)  # SpecConfig names a bad algo
        if algo is None or algo.checkpoint is None:
            return None
        return self.draft_model or str(MODELS_DIR / algo.embedded)


RUN_FIELDS = {f.name for f in fields(RunConfig)}


def check_gpu(device: str) -> None:
    """One line where --device cuda names a GPU torch cannot see."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpectraceError("--device cuda asked for, but torch sees no GPU")


@dataclass
class RunResult:
    requests: list[Request]
    texts: list[str]
    metrics: dict
    trace_path: Path | None  # None at --trace-level off
    spec: SpecConfig
    policy: str | None = None  # with --batch-policy: what it chose, e.g. "batch 64: drafting off"
    load_s: float = 0.0  # seconds the models took to load (0 when they came from `loaded`)


# ---- options ---------------------------------------------------------------------------------

def resolve_prompts(prompts: list[str], batch: int | None) -> list[str]:
    """`--batch N` tops the given prompts up with built-in held-out prompts of other lengths."""
    if batch is None:
        return list(prompts) or HELD_OUT_PROMPTS[:1]
    return list(prompts) + [HELD_OUT_PROMPTS[i % len(HELD_OUT_PROMPTS)] for i in range(batch - len(prompts))]


def medusa_tree(cfg: RunConfig) -> MedusaTree:
    """--medusa-choices (default: the first 24 paths of mc_sim_7b_63), checked against the heads."""
    heads = read_config_json(cfg.draft_path).get("medusa_num_heads") or 0
    if isinstance(cfg.medusa_choices, list):  # --speculative-config's chain: one node per head
        if len(cfg.medusa_choices) > heads:
            raise SpectraceError(f"--speculative-config: num_speculative_tokens {len(cfg.medusa_choices)} is more "
                                 f"than the {heads} Medusa heads of {cfg.draft_path}")
        choices = cfg.medusa_choices
    else:
        choices = load_choices(cfg.medusa_choices) if cfg.medusa_choices else MC_SIM_7B_63[:DEFAULT_CHOICES]
    return MedusaTree.from_choices(choices, heads)


def ngram_config(cfg: RunConfig) -> NgramConfig:
    """vLLM's SpeculativeConfig for prompt lookup: both None -> 5 and 5; one None -> it copies the other."""
    lo, hi = cfg.prompt_lookup_min, cfg.prompt_lookup_max
    lo, hi = (lo if lo is not None else hi), (hi if hi is not None else lo)
    return NgramConfig(cfg.ngram_style, lo if lo is not None else 5, hi if hi is not None else 5, cfg.ngram_match,
                       cfg.ngram_trie)


def resolve(cfg: RunConfig) -> tuple[SpecConfig, dict]:
    """The engine's config and the drafter's options (build_engine's ngram, medusa_tree), each
    checked once, from the options and the models' config.json files (no weights)."""
    arch = (read_config_json(cfg.target_model).get("architectures") or [""])[0]
    tree = medusa_tree(cfg) if cfg.algo == "medusa" else None
    num_steps, topk, n = resolve_shape(cfg, arch, tree)
    given = {f.name: getattr(cfg, f.name) for f in fields(SpecConfig) if f.name in RUN_FIELDS}  # as given
    spec = SpecConfig(**{**given, "num_steps": num_steps, "topk": topk, "num_draft_tokens": n,
                         "trace_topk": TRACE_LEVELS[cfg.trace_level]})
    ngram = ngram_config(cfg) if cfg.algo == "ngram" else None
    if ngram is not None and ngram.style == "vllm" and spec.topk != 1:
        raise SpectraceError("vLLM's n-gram proposer drafts a chain: it needs --topk 1")
    return spec, {"medusa_tree": tree, "ngram": ngram}


# ---- models ----------------------------------------------------------------------------------

def choose_threads(target: CausalLM, device: str) -> int:
    """Intra-op threads for a CPU run. On models this small a matrix product takes microseconds,
    and torch's threads spend longer waking each other than computing, and thrash beside another
    busy process (docs/install.md: "A first run"). So a small model runs on one thread; a larger one
    keeps torch's choice, as does a run whose environment sets OMP_NUM_THREADS."""
    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ and \
            sum(p.numel() for p in target.parameters()) < SMALL_MODEL:
        torch.set_num_threads(1)
    return torch.get_num_threads()


# ---- the run ---------------------------------------------------------------------------------

def run(cfg: RunConfig, on_step=None, progress: Callable[[str], None] | None = None, probe=None,
        loaded: dict | None = None) -> RunResult:
    """on_step(record) sees every step record as it is made; progress(message) hears what the
    run is doing (loading, generating) before it is done; probe: bench --profile's PhaseProbe;
    loaded: models kept between runs of one process (bench's runs of an 8B model), by where they
    load from and how they run."""
    cfg.check()
    asked, cfg = cfg, batch_policy.apply(cfg, len(resolve_prompts(cfg.prompts, cfg.batch)))
    cfg = replace(cfg, target_model=find_model(cfg.target_model, "--target-model"),
                  draft_model=find_model(cfg.draft_path, "--draft-model") if cfg.draft_path else None)
    spec, options = resolve(cfg)
    prompts = resolve_prompts(cfg.prompts, cfg.batch)
    if cfg.backend == "fast":  # before any model is loaded
        from spectrace.fast.graphs import check_batch
        check_batch(len(prompts))
    trace_path = Path(cfg.trace) if cfg.trace else default_trace_path(cfg.algo)
    tok = load_tokenizer(cfg.target_model)
    writer = None
    if cfg.trace_level != "off":
        try:  # open the trace first: a path that cannot be written fails before any model work
            writer = TraceWriter(trace_path, tok.piece)
        except TraceError as e:
            raise SpectraceError(str(e)) from None
    probs = ProbsRecorder(sidecar_path(trace_path)) if cfg.record_probs else None
    header_written, say = False, progress or (lambda m: None)
    try:
        t0 = time.perf_counter()
        target, draft = load_models(cfg.target_model, cfg.draft_path, cfg.algo, tok, cfg.torch_dtype, cfg.device,
                                    cfg.backend, cfg.mem_fraction_static, progress, loaded)
        load_s = time.perf_counter() - t0
        ids = encode_prompts(tok, prompts, cfg.raw_prompt)
        check_fits(kv_bytes(target, draft, spec, ids), cfg.device, cfg.mem_fraction_static,
                   f"--batch {len(prompts)}: the KV caches")
        check_prompts(ids, spec, context(target), target, draft)
        check_topk(spec, target, draft)
        eos = eos_token_ids(cfg.target_model, target, tok)
        engine = build_engine(target, draft, spec, ids, eos, writer, on_step=on_step, backend=cfg.backend,
                              probs=probs, probe=probe, **options)
        threads = choose_threads(target, cfg.device)
        if writer:
            writer.write({**header(cfg, spec, prompts, target, draft, engine, threads, probs, asked, tok),
                          "run": writer.run_id}, [t for p in ids for t in p])
            header_written = True
        say(f"generating {cfg.max_new_tokens} tokens for {len(ids)} request(s)")
        reqs, metrics = engine.generate(ids)
        texts = [tok.decode(r.output_ids) for r in reqs]
        if writer is None:
            return RunResult(reqs, texts, metrics, None, spec, batch_policy.choice(asked, len(prompts)), load_s)
        writer.write({"kind": "summary", "metrics": metrics, "requests": [
            {"request": r.req_pool_idx, "prompt_ids": r.prompt_ids, "output_ids": r.output_ids,
             "prompt_text": prompts[r.req_pool_idx], "output_text": texts[r.req_pool_idx],
             "finish_reason": r.finish_reason} for r in reqs]}, [t for r in reqs for t in r.output_ids])
    except KeyboardInterrupt:
        if writer and header_written:  # the CLI says where the finished steps are
            raise Interrupted(trace_path) from None
        raise
    finally:
        if writer:
            writer.close()
            if not header_written:  # refused before the run began: leave no empty trace behind
                writer.discard()
            elif probs is not None and not writer.failed:  # also when interrupted: the steps recorded so far
                seal(trace_path, probs.save())
    return RunResult(reqs, texts, metrics, trace_path, spec, batch_policy.choice(asked, len(prompts)), load_s)


def check_topk(spec: SpecConfig, target: CausalLM, draft) -> None:
    """A draft level takes the topk best of the draft's vocabulary (EAGLE-3's own, smaller one),
    so topk cannot exceed it: refused before any KV is sized by it."""
    if not ALGOS[spec.algo].eagle_worker and spec.algo != "standalone":
        return
    vocab = len(draft.d2t) if hasattr(draft, "d2t") else target.config.vocab_size
    if spec.topk > vocab:
        raise SpectraceError(f"--topk {spec.topk} is more than the draft's vocabulary of {vocab} tokens")


def encode_prompts(tok: Tokenizer, prompts: list[str], raw: bool) -> list[list[int]]:
    """Each prompt as the target expects it: through its chat template when it has one (SGLang's
    chat endpoint), else as text (SGLang's /generate); `raw` sends the text as it is. Each text
    once: --batch repeats the held-out prompts."""
    encode = tok.encode if raw or not tok.has_chat_template else tok.chat
    once = {p: encode(p) for p in dict.fromkeys(prompts)}
    return [list(once[p]) for p in prompts]


def eos_token_ids(path: str, target: CausalLM, tok: Tokenizer) -> tuple[int, ...]:
    """Where a request stops: any of config.json's eos_token_id (Llama 3.1-Instruct lists three)
    and generation_config.json's, as transformers' generate stops; else the tokenizer's EOS."""
    ids = set(target.config.eos_token_ids)
    gen = Path(path) / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError) as e:
            raise SpectraceError(f"{gen}: not a JSON object ({first_line(e)})") from None
        eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in eos):
            raise SpectraceError(f"{gen}: eos_token_id must be a token id or a list of them")
        ids |= set(eos)
    if not ids and tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    return tuple(sorted(ids))


def check_prompts(ids: list[list[int]], spec: SpecConfig, context: int, target: CausalLM, draft) -> None:
    """Every prompt fits the target's context with the new tokens and a step's drafts, and its
    sliding window if it has one (Mistral): attention inside the window is exactly full attention,
    which is what the forward computes, so a run that would slide past it is refused."""
    windows = [(m.config.sliding_window, name) for m, name in ((target, "the target"), (draft, "the draft model"))
               if isinstance(m, CausalLM) and m.config.sliding_window]
    for i, p in enumerate(ids):
        if not p:
            raise SpectraceError(f"prompt {i} is empty")
        need = len(p) + spec.max_new_tokens + lookahead(spec)
        what = f"prompt {i} is {len(p)} tokens: with --max-new-tokens {spec.max_new_tokens} it needs {need} positions"
        if need > context:
            raise SpectraceError(f"{what}, more than the model's context of {context}")
        for window, name in windows:
            if need > window:
                raise SpectraceError(f"{what}, more than the {window}-token sliding window of {name} (inside it "
                                     "attention is full attention; spectrace does not slide past it)")


def header(cfg: RunConfig, spec: SpecConfig, prompts: list[str], target, draft, engine, threads: int,
           probs: ProbsRecorder | None, asked: RunConfig, tok: Tokenizer) -> dict:
    """The trace's first record: the resolved options (model directories as found, the names asked
    for beside them), the models' identities, how the prompts were encoded, with --record-probs
    the sidecar (its hash sealed in once it is saved), and with --batch-policy the algorithm asked
    for and what the policy chose for the batch."""
    models = {"target": model_identity(cfg.target_model, target, asked.target_model)}
    if draft is not None:
        models["draft"] = model_identity(cfg.draft_path, draft, asked.draft_model)
    extra = {"probs": {"file": probs.path.name, "sha256": UNSEALED}} if probs is not None else {}
    if asked.batch_policy is not None:
        extra["batch_policy"] = batch_policy.header(asked, spec, len(prompts))
    return {"kind": "header", "schema": SCHEMA,
            "config": {**asdict(cfg), "prompts": prompts, "draft_model": cfg.draft_path or "",
                       "num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens,
                       "acceptance": spec.acceptance, "resolved_algorithm": ALGOS[cfg.algo].resolved},
            "models": models, "eos_token_ids": sorted(engine.eos), "device": cfg.device, "threads": threads,
            "prompt_format": "raw" if cfg.raw_prompt or not tok.has_chat_template else "chat",
            "torch": torch.__version__, **extra}
