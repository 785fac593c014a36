"""Either engine from one spec (the application layer, above core and fast): the target's KV sized
for every request, the drafter of the algorithm's checkpoint format around the loaded draft
model, and the engine that runs them.

    backend    KV                             drafters                  engine
    explicit   core/kv.py KVCache             core/drafters/            core/engine.py Engine
    triton     kernels/kv.py TritonKVCache    core/drafters/            the same Engine; attention, tree
                                                                        build and walks through the twins
    fast       fast/kv.py StaticKV            fast/drafters/            fast/engine.py FastEngine
"""
from __future__ import annotations

from spectrace.algos import ALGOS
from spectrace.core.drafters.medusa import DEFAULT_CHOICES, MC_SIM_7B_63, MedusaTree
from spectrace.core.drafters.ngram import NgramConfig
from spectrace.core.engine import Engine
from spectrace.core.spec import SpecConfig
from spectrace.core.kv import KVCache
from spectrace.core.model import CausalLM, KVCacheOwner
from spectrace.core.probs import ProbsRecorder
from spectrace.core.trace import TraceWriter
from spectrace.errors import SpectraceError
from spectrace.loading.formats import FORMATS, Built


def lookahead(spec: SpecConfig) -> int:
    """Positions past the committed ones a step may reach: the root and num_steps levels."""
    return spec.max_steps + 1


def scratch_columns(spec: SpecConfig) -> int:
    """`req_to_token` columns past the committed ones a step may map: the verify tree's nodes
    (target) or the draft's [topk][step] scratch (draft)."""
    steps = spec.max_steps
    return max(spec.num_draft_tokens, steps + 1, spec.topk * (steps - 1) + 1) + 1


def context(target: CausalLM) -> int:
    """Positions a request may reach: the target's context, as SGLang gives its drafter the target's
    context length (a draft head's own max_position_embeddings, 2048 for the Llama-3 EAGLE heads,
    does not bound it: RoPE has no table to run past)."""
    return target.config.max_position_embeddings


def kv_bytes(target: CausalLM, draft, spec: SpecConfig, prompt_ids: list[list[int]]) -> int:
    """Bytes of the run's KV caches at their largest, every request held at full length at once:
    each paged model's K and V per slot and layer, over the fast engine's static rows (padded to
    its batch bucket; the explicit pool needs no more), and both caches' int64 req_to_token."""
    from spectrace.fast.graphs import BUCKETS, bucket

    rows = bucket(len(prompt_ids)) if len(prompt_ids) <= BUCKETS[-1] else len(prompt_ids)
    longest = max(len(p) for p in prompt_ids) + spec.max_new_tokens + 2 * lookahead(spec)
    slots = rows * (longest + scratch_columns(spec))
    p = next(target.parameters())
    per_slot = sum(2 * len(m.layers) * m.config.num_key_value_heads * m.config.head_dim * p.element_size()
                   for m in (target, draft) if isinstance(m, KVCacheOwner))
    return slots * (per_slot + 2 * 8)


def build_engine(target: CausalLM, draft, spec: SpecConfig, prompt_ids: list[list[int]], eos_token_ids,
                 trace: TraceWriter | None = None, ngram: NgramConfig | None = None,
                 medusa_tree: MedusaTree | None = None, on_step=None, backend: str = "explicit",
                 probs: ProbsRecorder | None = None, graphs: bool | None = None, probe=None):
    """The engine of `spec.algo` around `draft` (the loaded draft model; None for none and ngram),
    its KV pools holding every request at full length at once. ngram and medusa_tree: those
    drafters' options, checked (NgramConfig.check, MedusaTree.from_choices). graphs: the fast
    engine's CUDA graphs (default: on a GPU); probe: bench --profile's (fast engine only)."""
    medusa_tree = medusa_tree or (MedusaTree.from_choices(MC_SIM_7B_63[:DEFAULT_CHOICES], draft.num_heads)
                                  if spec.algo == "medusa" else None)
    ngram = ngram or NgramConfig()
    if backend == "fast":
        return fast_engine(target, draft, spec, prompt_ids, eos_token_ids, trace, ngram, medusa_tree, on_step, probs,
                           graphs, probe)
    if probe is not None:
        raise SpectraceError("--profile counts the fast engine's kernels: it needs --backend fast")
    cache_class = KVCache
    if backend == "triton":
        from spectrace.kernels import backend as twins
        from spectrace.kernels.kv import TritonKVCache

        twins.install()
        cache_class = TritonKVCache
    columns = max(len(p) for p in prompt_ids) + spec.max_new_tokens + lookahead(spec) + scratch_columns(spec)
    num_slots = sum(len(p) + spec.max_new_tokens + scratch_columns(spec) for p in prompt_ids)
    kv = target.new_kv_cache("target", spec.commit_style, num_slots, len(prompt_ids), columns, cache_class)
    drafter = None
    if spec.algo != "none":
        drafter = explicit_drafter(target, draft, spec, kv, ngram, medusa_tree, lambda: draft.new_kv_cache(
            "draft", spec.commit_style, num_slots, len(prompt_ids), columns, cache_class))
    return Engine(target, kv, spec, eos_token_ids, drafter, trace, on_step, probs)


def explicit_drafter(target, draft, spec: SpecConfig, kv, ngram: NgramConfig, medusa_tree, draft_kv):
    """The explicit drafter of the algorithm's checkpoint format (loading/formats.py); draft_kv() makes its
    own KV."""
    if spec.algo == "ngram":
        return ngram.drafter(spec.num_steps, spec.num_draft_tokens, target.config.max_position_embeddings,
                             target.lm_head.weight.device)
    return FORMATS[ALGOS[spec.algo].checkpoint].explicit(Built(target, draft, spec, kv, medusa_tree, draft_kv))


def fast_engine(target, draft, spec: SpecConfig, prompt_ids, eos_token_ids, trace, ngram, medusa_tree, on_step, probs,
                graphs, probe=None):
    """The fast engine over the batch bucket. A request's row holds its prompt, max_new_tokens,
    up to num_steps tokens committed past them by its last step, num_steps + 1 more of a step
    launched ahead of the host's reading (overlap), and one more step's columns, since a finished
    request still runs every phase, frozen. On a GPU (and when a probe counts the kernels a GPU
    would launch) the models' layers run fused (kernels/fused.py; in place: their modules'
    forwards, wherever they run next)."""
    from spectrace.fast.engine import FastEngine
    from spectrace.fast.graphs import bucket, check_batch, place_rotary
    from spectrace.fast.kv import StaticKV
    from spectrace.kernels import backend as twins

    check_batch(len(prompt_ids))
    twins.install()  # the models' attention, through StaticKV's backend
    n = max(n for _, n in spec.tiers)  # the deepest tier's nodes
    committed = max(len(p) for p in prompt_ids) + spec.max_new_tokens + 2 * (spec.max_steps + 1)
    kv = StaticKV(target, bucket(len(prompt_ids)), committed + n)
    models = [m for m in (target, draft) if m is not None]
    if kv.seq_lens.device.type == "cuda" or probe is not None:
        from spectrace.kernels.fused import fuse

        for m in models:  # RoPE tables over every position a step reaches
            fuse(m, committed + n + scratch_columns(spec))
    for m in models:
        place_rotary(m, kv.seq_lens.device)
    drafter = fast_drafter(target, draft, spec, kv, committed, ngram, medusa_tree,
                           trace is not None or on_step is not None, probs is not None) if spec.algo != "none" else None
    return FastEngine(target, kv, spec, drafter, prompt_ids, eos_token_ids, trace, on_step, probs, graphs, probe)


def fast_drafter(target, draft, spec: SpecConfig, kv, committed: int, ngram: NgramConfig, medusa_tree,
                 recording: bool, record_probs: bool):
    """The fast drafter of the algorithm's checkpoint format (loading/formats.py), its buffers over the bucket."""
    if spec.algo == "ngram":
        from spectrace.fast.drafters.ngram import Ngram

        n = spec.num_draft_tokens
        return Ngram(ngram.drafter(spec.max_steps, n, target.config.max_position_embeddings, "cpu"),
                     kv.seq_lens.shape[0], n, kv.seq_lens.device)
    built = Built(target, draft, spec, kv, medusa_tree, committed=committed, recording=recording,
                  record_probs=record_probs)
    return FORMATS[ALGOS[spec.algo].checkpoint].fast(built)
