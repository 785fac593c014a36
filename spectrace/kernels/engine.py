"""The fast engine (`--backend fast`): core/engine.py's speculative step with the whole batch on
the device at once, the Triton twins for attention, tree build and the walk, and CUDA graphs as
SGLang captures them.

The phases and names are the explicit engine's; what differs is where a step's state lives:

    explicit engine (core/engine.py)           fast engine (here)
    a StepRow per request: Python lists        tensors over the batch, (bs, ...), on the device
    KVCache: allocator, per-request commit,     StaticKV: each request owns one row of req_to_token
      KV events for the trace                     and its slots for the whole run; COMMIT reorders
                                                  the row's verify columns, accepted path first
                                                  (SGLang's remap, with no allocator and no events)
    each phase eager, synced to time it         DRAFT (the draft loop and the tree build), VERIFY
                                                  (target forward, walk, commit) and EXTEND each
                                                  one CUDA graph for the run's batch bucket, timed
                                                  with CUDA events; one host sync per step, for the
                                                  accepted tokens
    finished requests leave the batch           they stay in their bucket row, frozen: `live`
                                                  masks their commits

Every forward is the explicit model's own (core/model.py and the drafter heads; on a GPU with
kernels/fused.py's fused layer pieces), given a ForwardBatch whose attention metadata
(kv_indptr, kv_indices, the packed tree mask) is computed on the device from the step's tensors,
so a graph replays it without the host:

    DRAFT   level i of the draft loop: K paths per request, each its own sequence for
            decode_attention_fwd (the committed draft KV, then its path's scratch columns,
            drafters/scratch.py's [topk][step] layout); select_top_k_tokens and
            organize_draft_results as the explicit drafters run them; the tree by sglang.build_tree
    VERIFY  extend_attention_fwd over each request's n nodes, the FULL_MASK from build_tree;
            argmax; sglang.verify_tree_greedy; the commit
    EXTEND  the accepted tokens, padded to num_steps + 1 per request (causal: a real row never
            sees a padding row), as SGLang's draft-extend graph runs them

What it runs: none, standalone, eagle, eagle3, nextn/mtp, FROZEN_KV_MTP (fast_frozen_kv_mtp.py),
chains and trees; Medusa's static tree (fast_medusa.py); n-gram drafted on the host by the
explicit drafters (fast_ngram.py); adaptive steps (a set of graphs per tier, switched between
steps). Greedy acceptance, at temperature > 0 SGLang's target_only over the deterministic tree,
for chains of drafts sampled from q SGLang's rejection sampling and vLLM's rejection sampler
(which also takes n-gram's one-hot chains), for sampled trees tree_rejection
(fast_tree_rejection.py; its trees ranked by sibling worth the host keeps from the walk's
counts), and Medusa's typical acceptance over any tree (fast_typical.py). Every random number is
drawn on the host from its request's generator in the explicit engine's order (the draft loop's
race noise, then the rule's) and copied in before the launch. DFLASH runs on --backend explicit
or triton. Prefill is a graph
too, every prompt padded to the run's longest. On a CPU (TRITON_INTERPRET=1) the same code runs
eagerly, which is how the parity tests check it against the explicit engine.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from spectrace.algos import ALGOS
from spectrace.core.adaptive import AdaptiveSpeculativeParams
from spectrace.core.acceptance import RULES, AcceptResult, Randoms, bonus_from
from spectrace.core.acceptance.tree_rejection import SiblingStats
from spectrace.core.batch import ForwardBatch
from spectrace.core.drafters import SampledDrafts
from spectrace.core.drafters.eagle_worker import draft_candidates, draft_forward, level_tensors
from spectrace.core.drafters.ngram import NgramConfig
from spectrace.core.engine import Request, SpecConfig, StepRow, append_tokens
from spectrace.core.kv import TokenToKVPool
from spectrace.core.metrics import SpecMetrics
from spectrace.core.model import CausalLM, ForwardOutput, RotaryEmbedding
from spectrace.core.probs import ProbsRecorder
from spectrace.core.sampling import as_pairs, probs_from_logits, request_generator
from spectrace.core.step_record import prefill_record, record_token_ids, step_record
from spectrace.core.trace import TraceWriter
from spectrace.core.tree import DraftTree, TreeMaskMode, organize_draft_results
from spectrace.errors import SpectraceError
from spectrace.kernels import attention, sglang
from spectrace.kernels import vllm as vllm_kernels
from spectrace.kernels.fast_dflash import FastDFlash
from spectrace.kernels.fast_frozen_kv_mtp import FastFrozenKVMtp
from spectrace.kernels.fast_medusa import FastMedusa
from spectrace.kernels.fast_ngram import HostDraft
from spectrace.kernels.fast_tree_rejection import tree_rejection_accept
from spectrace.kernels.fast_typical import typical_accept
from spectrace.kernels import backend  # noqa: F401  (registers the twins: the models' attention runs through them)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # batch sizes a run is padded up to, one set of graphs each


def check_fast(batch: int) -> None:
    """One line for what the fast engine does not run: a batch over its largest bucket."""
    if batch > BUCKETS[-1]:
        raise SpectraceError(f"--backend fast captures batches of at most {BUCKETS[-1]} requests, not {batch}")


def bucket(batch: int) -> int:
    return next(b for b in BUCKETS if b >= batch)


class StaticKV:
    """One model's KV for the fast engine: the explicit pool, and a req_to_token in which request
    b owns row b and the slots b * columns ... for the whole run. Only the order of a row's
    entries changes (COMMIT), so no allocator is needed and no slot leaves its request.
    `backend` routes the model's attention to kernels/backend.py's paged_attention."""

    backend = "triton"

    def __init__(self, model, bs: int, columns: int):
        cfg, p = model.config, next(model.parameters())
        self.pool = TokenToKVPool(len(model.layers), bs * columns, cfg.num_key_value_heads, cfg.head_dim, p.dtype,
                                  p.device)
        self.identity = torch.arange(bs * columns, device=p.device).view(bs, columns)
        self.req_to_token = self.identity.clone()
        self.seq_lens = torch.zeros(bs, dtype=torch.int64, device=p.device)  # committed KV per request

    def reset(self) -> None:
        self.req_to_token.copy_(self.identity)
        self.seq_lens.zero_()

    def slots(self, starts: torch.Tensor, width: int) -> torch.Tensor:
        """(bs, width) slots of columns starts[b] .. starts[b] + width - 1 of each row."""
        return self.req_to_token.gather(1, starts[:, None] + torch.arange(width, device=starts.device))


def extend_batch(kv: StaticKV, input_ids, positions, width: int, tree_mask=None) -> ForwardBatch:
    """A forward adding `width` tokens to every request after its seq_lens, with
    extend_attention_fwd's metadata computed on the device: tree_mask (FULL_MASK from
    build_tree) for a verify, else causal. Shapes are fixed by (bs, width): graph-safe."""
    bs, device = kv.seq_lens.shape[0], kv.seq_lens.device
    prefix = kv.seq_lens
    kv_indptr = F.pad(prefix.cumsum(0), (1, 0))
    kv_indices = torch.empty(kv.req_to_token.numel(), dtype=torch.int64, device=device)  # room for any prefixes
    attention.create_kv_indices(kv.req_to_token, torch.arange(bs, device=device), prefix, kv_indptr, None, kv_indices)
    meta = dict(qo_indptr=torch.arange(bs + 1, device=device) * width, kv_indptr=kv_indptr, kv_indices=kv_indices,
                custom_mask=tree_mask, mask_indptr=None, max_len_extend=width)
    if tree_mask is not None:  # request b's rows (width, prefix + width) start where build_tree wrote them
        meta["mask_indptr"] = F.pad((width * (prefix + width)).cumsum(0), (1, 0))
    return ForwardBatch(input_ids=input_ids, positions=positions, req_pool_indices=list(range(bs)),
                        seq_lens=[], extend_lens=[width] * bs, out_cache_loc=kv.slots(prefix, width).flatten(),
                        custom_masks=[], attn_metadata={"extend": meta})


def full_mask(masks: torch.Tensor, seq_lens: torch.Tensor, capacity: int) -> torch.Tensor:
    """The FULL_MASK of trees given as (bs, n, n) masks (Medusa's static tree, n-gram's): request
    b's rows (n, seq_lens[b] + n), row r = the prefix then masks[b, r], flattened and concatenated
    as build_tree lays them out, into a buffer of `capacity` entries (a bound: no sync)."""
    bs, n = masks.shape[0], masks.shape[1]
    indptr = F.pad((n * (seq_lens + n)).cumsum(0), (1, 0))
    idx = torch.arange(capacity, device=seq_lens.device)
    b = torch.searchsorted(indptr[1:], idx, right=True).clamp(max=bs - 1)
    local, prefix = idx - indptr[b], seq_lens[b]
    width = prefix + n
    r, col = local // width, local % width - prefix  # col < 0: a prefix column
    inside = masks[b, r.clamp(max=n - 1), col.clamp(min=0, max=n - 1)]
    return ((col < 0) | inside) & (idx < indptr[-1])


def sample_rows(probs: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """core/sampling.py's sample_from_prob for every row at once: probs (R, V), one float64 coin
    per row -> (R,) the smallest i with p_i > 0 and cumsum_i > coin * sum, else the last i with
    p_i > 0 (float64, as the explicit draw)."""
    w = probs.double()
    cdf = w.cumsum(-1)
    hit = (w > 0) & (cdf > coins[:, None] * cdf[:, -1:])
    last_positive = (w > 0).int().cumsum(-1).argmax(-1)  # the first index at the final count
    return torch.where(hit.any(-1), hit.int().argmax(-1), last_positive)


def place_rotary(model, device) -> None:
    """RoPE's frequencies onto the device: a plain float32 attribute that model.to() leaves on the
    host, copied at every forward, and a CUDA graph cannot copy from the host."""
    for m in model.modules():
        if isinstance(m, RotaryEmbedding):
            m.inv_freq = m.inv_freq.to(device)


def forward_cost_ms(model, kv_len: int, bs: int, rows: int, repeat: int) -> float:
    """Median ms of one forward as the fast engine runs it (fused layers, Triton attention, replayed
    from a CUDA graph, timed with CUDA events) over bs requests of `rows` causal new tokens after
    kv_len cached ones: a decode (rows 1), a verify (rows n; a tree mask costs about the same) or a
    draft level. For `spectrace bench --target-shape` with --backend fast."""
    from spectrace.kernels.fused import fuse

    fuse(model)
    kv = StaticKV(model, bs, kv_len + rows)
    device = kv.seq_lens.device
    place_rotary(model, device)
    kv.seq_lens.fill_(kv_len)
    ids = torch.ones(bs * rows, dtype=torch.int64, device=device)
    positions = (kv_len + torch.arange(rows, device=device)).repeat(bs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model(extend_batch(kv, ids, positions, rows), kv)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(extend_batch(kv, ids, positions, rows), kv)
    times = []
    for _ in range(repeat + 1):  # the first replay warms up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times[1:])[len(times[1:]) // 2]


class DraftModel:
    """What the draft loop needs of a drafter's model: one forward and q after its outputs.
    Heads (EAGLE, EAGLE-3, MTP) read (token, target feature) pairs shifted by one and feed their
    own output to deeper levels; a draft LM reads tokens at their own positions."""

    def __init__(self, algo: str, model, target: CausalLM):
        self.model, self.target = model, target
        self.temperature = 1.0  # q = softmax(logits / T): the run's T when drafts are sampled
        self.is_head = ALGOS[algo].checkpoint != "lm"
        self.capture_layers = model.capture_layers if self.is_head else ()

    def forward(self, batch: ForwardBatch, kv: StaticKV, features) -> torch.Tensor:
        return self.model(batch, kv, features) if self.is_head else self.model(batch, kv).hidden_states

    def probs(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.model.compute_logits(h, self.target.lm_head) if self.is_head else self.model.lm_head(h).float()
        return torch.softmax(logits / self.temperature, dim=-1)


class PhaseClock:
    """Phase times without a sync: CUDA events, read once the step's tokens have arrived; on a
    CPU, the clock. `run` returns the phase's marks, `read` their milliseconds."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def run(self, fn) -> tuple:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return t0, time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end

    def read(self, marks: dict[str, tuple]) -> dict[str, float]:
        if self.cuda:
            return {k: round(s.elapsed_time(e), 3) for k, (s, e) in marks.items()}
        return {k: round((e - s) * 1000, 3) for k, (s, e) in marks.items()}


class FastEngine:
    def __init__(self, target: CausalLM, draft, spec: SpecConfig, prompt_ids: list[list[int]], eos_token_ids,
                 trace: TraceWriter | None = None, on_step=None, graphs: bool | None = None,
                 fused: bool | None = None, medusa_tree=None, ngram=None, probs: ProbsRecorder | None = None):
        """graphs: capture CUDA graphs; fused: the models' layers through kernels/fused.py (both
        default to on a GPU; on a CPU the interpreter makes more kernels slower, not faster).
        Fusing changes the models in place (their modules' forwards), wherever they run next.
        medusa_tree, ngram: --algo medusa's static tree, --algo ngram's NgramConfig (run.py
        resolves both); probs: keeps each walk's inputs for `spectrace rejudge` (--record-probs)."""
        check_fast(len(prompt_ids))
        self.target, self.spec, self.trace, self.on_step = target, spec, trace, on_step
        self.recording, self.probs = trace is not None or on_step is not None, probs
        self.eos = set(eos_token_ids)
        self.device = target.lm_head.weight.device
        self.bs = bucket(len(prompt_ids))
        # adaptive steps (topk 1): each tier of S steps verifies chains of S + 1 nodes; buffers are
        # sized for the deepest tier, and each tier has its own graphs (SGLang's SpecRuntimeState)
        self.adaptive = AdaptiveSpeculativeParams(spec.num_steps) if spec.adaptive else None
        S = spec.max_steps if spec.algo != "none" else 0
        self.K, n = spec.topk, spec.num_draft_tokens + spec.max_steps - spec.num_steps  # the deepest tier's nodes
        # a request's last step may commit up to S tokens past max_new_tokens, the step launched
        # ahead of the host's reading (overlap) S + 1 more, and a finished request still runs
        # every phase, frozen: its row holds that and one more step's columns
        committed = max(len(p) for p in prompt_ids) + spec.max_new_tokens + 2 * (S + 1)
        self.kv = StaticKV(target, self.bs, committed + n)
        dtype = target.lm_head.weight.dtype
        self.medusa = None  # Medusa's static tree
        if spec.algo == "medusa":
            self.medusa = FastMedusa(draft, medusa_tree, self.bs, torch.zeros(
                self.bs, target.config.hidden_size, dtype=dtype, device=self.device), spec.trace_topk)
        self.dflash = FastDFlash(draft, target, self.bs, committed + n, spec.trace_topk) if spec.algo == "dflash" \
            else None
        self.static = self.medusa or self.dflash  # one pass into a tree of a fixed shape
        self.host = None  # n-gram: drafted on the host (kernels/fast_ngram.py)
        if spec.algo == "ngram":
            self.host = HostDraft((ngram or NgramConfig()).drafter(S, n, target.config.max_position_embeddings,
                                                                   "cpu"), self.bs, n, self.device)
        self.frozen = FastFrozenKVMtp(draft, target, self.kv, self.bs) if spec.algo == "frozen_kv_mtp" else None
        self.drafter = (DraftModel(spec.algo, draft, target) if draft is not None and not self.static
                        and not self.frozen else None)  # the draft loop's model, with a draft KV
        self.drafts = any(d is not None for d in (self.drafter, self.frozen, self.static, self.host))
        reads_target = self.drafter or self.dflash  # drafters fed the target's captured layers
        self.capture_layers = reads_target.capture_layers if reads_target else ()
        if self.drafter is not None:  # + the draft loop's scratch or the padded extend
            self.draft_kv = StaticKV(draft, self.bs, committed + max(S + 1, self.K * max(S - 1, 0)))
            H = draft.config.hidden_size
            self.next_probs = torch.zeros(self.bs, target.config.vocab_size, device=self.device)  # q after the root
            self.last_hidden = torch.zeros(self.bs, H, dtype=dtype, device=self.device)
        if fused if fused is not None else self.device.type == "cuda":
            from spectrace.kernels.fused import fuse
            for model in (target, draft):
                if model is not None:
                    fuse(model)
        for model in (target, draft):
            if model is not None:
                place_rotary(model, self.device)
        self.roots = torch.zeros(self.bs, dtype=torch.int64, device=self.device)  # each request's last token
        # sampling: the requests' random numbers, drawn on the host from each request's generator in
        # the explicit engine's order and copied in before each launch (a graph reads them there)
        self.sampling = spec.sampling
        self.coin_final = torch.zeros(self.bs, device=self.device)  # ... and the bonus's
        self.coin64 = torch.zeros(self.bs, dtype=torch.float64, device=self.device)  # a plain sample (prefill, none)
        self.rule = RULES[spec.acceptance]
        loop = self.drafter or self.frozen  # the EAGLE draft loop's drafter
        self.draft_probs = None  # (bs, n-1, V) q at each node's parent: sampled rules, --record-probs
        self.sampled = self.rule.samples_drafts and loop is not None  # drafts sampled from q
        # tree_rejection's trees: ranked by what each sibling rank was worth on the request's earlier
        # steps (SiblingStats, on the host, fed by the walk's counts), copied in before each step
        self.ranks_worth = spec.acceptance == "tree_rejection" and self.K > 1
        self.worth = torch.ones(self.bs, self.K, device=self.device)
        self.vocab = V = target.config.vocab_size
        if self.sampled:
            loop.temperature = spec.temperature  # q at the run's temperature, as the explicit drafters
        if spec.acceptance == "vllm":  # vLLM's draws: the bonus's race, the recovered noise (+ uniforms per tier)
            self.bonus_noise, self.inv_q = torch.ones(2, self.bs, V, device=self.device)
        # prefill's inputs: every prompt padded to the longest, L rows a request (+ 1 for a draft LM,
        # which reads the first token too); padding rows write KV past the prompt, overwritten later
        self.L = max(len(p) for p in prompt_ids)
        self.prompt_ids = torch.zeros(self.bs, self.L, dtype=torch.int64, device=self.device)
        self.prompt_lens = torch.ones(self.bs, dtype=torch.int64, device=self.device)
        self.live = torch.zeros(self.bs, dtype=torch.bool, device=self.device)
        self.metrics = SpecMetrics(S, spec.num_draft_tokens)
        self.set_tier(spec.num_steps if spec.algo != "none" else 0)
        self.step_count = 0  # steps the host has read
        self.clock = PhaseClock(self.device)
        # the phases a launch runs on the device (n-gram's DRAFT runs on the host, before them)
        self.phases = [("draft", self.draft)] if self.drafts and not self.host else []
        self.phases += [("verify", self.verify)] + ([("extend", self.extend)] if self.drafts and not self.host else [])
        self.graphs = None
        if graphs if graphs is not None else self.device.type == "cuda":
            self.capture()

    def set_tier(self, S: int) -> None:
        """A step's shape: S draft levels and n nodes (num_draft_tokens, or S + 1 for an adaptive
        tier), and the buffers of that shape the host fills with each step's random numbers."""
        self.S, self.n = S, S + 1 if self.adaptive else self.spec.num_draft_tokens
        self.coins = torch.zeros(self.bs, self.n, device=self.device)  # target_only: SGLang's coin per node
        if self.sampled:  # each level's Exp(1) noise for the exponential race (1 path at the root, K after)
            self.noise = [torch.ones(self.bs * (1 if i == 0 else self.K), self.vocab, device=self.device)
                          for i in range(S)]
        if self.spec.acceptance == "vllm":  # a uniform per draft
            self.uniforms = torch.zeros(self.bs, self.n - 1, dtype=torch.float64, device=self.device)

    def use_tier(self, S: int) -> None:
        """Switch an adaptive run to tier S from the next step: eagerly, its buffers; with graphs,
        the tier's graphs and the tensors they were captured on."""
        if self.graphs is None:
            self.set_tier(S)
            return
        self.graphs, bound = self.tiers[S]
        self.__dict__.update(bound)

    # ---- CUDA graphs -----------------------------------------------------------------------
    def capture(self) -> None:
        """One graph per phase at this run's bucket, as SGLang captures the draft loop, the verify
        and the draft extend, and here the prefill too (at the run's prompt length: eager, its
        launches cost more than the steps' GPU time); an adaptive run captures the phases once per
        tier. The warm-up runs (Triton compiles there) and the captures change the state, so it is
        reset afterwards; each graph's outputs are the tensors its capture left, which the next
        phase's graph reads: a tier keeps the tensors its phases bound (`tiers`)."""
        prefill, first = {}, self.S
        self.tiers = {}
        for S in self.adaptive.candidate_steps if self.adaptive else [self.S]:
            before = dict(vars(self))
            self.set_tier(S)
            phases = self.phases if prefill else [("prefill", self.prefill_forward)] + self.phases
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    for _, fn in phases:
                        fn()
            torch.cuda.current_stream().wait_stream(stream)
            graphs = dict(prefill)
            for name, fn in phases:
                graphs[name] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graphs[name]):
                    fn()
            prefill = {"prefill": graphs["prefill"]}
            bound = {k: v for k, v in vars(self).items() if before.get(k) is not v}
            self.tiers[S] = graphs, {**bound, "S": self.S, "n": self.n}
        self.graphs = graphs
        self.use_tier(first)
        self.kv.reset()
        if self.drafter:
            self.draft_kv.reset()

    # ---- the loop --------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]]) -> tuple[list[Request], dict]:
        """Prefill, then steps until every request is finished. Without a trace (nothing reads the
        device state after a step) the next step is launched before the last one is read, so the
        GPU runs it while the host checks EOS and lengths (SGLang's overlap scheduler); a request
        that finished runs one step more, frozen, whose tokens nobody reads."""
        reqs = [Request(i, list(p), gen=request_generator(self.spec.seed, i)) for i, p in enumerate(prompts)]
        self.sibling_stats = {r.req_pool_idx: SiblingStats(self.K) for r in reqs}
        t0 = time.perf_counter()
        self.prefill(reqs)
        pending = self.launch(reqs) if any(not r.finish_reason for r in reqs) else None
        # n-gram drafts from the last step's tokens, an adaptive step's tier follows the last
        # step's acceptance: neither overlaps
        # (and tree_rejection's next tree is ranked by this step's walk)
        overlap = not self.recording and not self.host and not self.adaptive and not self.ranks_worth
        while pending is not None:
            ahead = self.launch(reqs) if overlap else None
            self.finish_step(reqs, pending)
            pending = None if all(r.finish_reason for r in reqs) else ahead or self.launch(reqs)
        if self.device.type == "cuda":  # a step launched ahead of the end finishes inside the measured time
            torch.cuda.synchronize()
        metrics = self.metrics.summary(time.perf_counter() - t0)
        metrics["per_request"] = [self.metrics.per_request(r.req_pool_idx) for r in reqs]
        return reqs, metrics

    @torch.no_grad()
    def prefill(self, reqs: list[Request]) -> None:
        """The prompts into the static buffers (padding rows of the bucket: one token), the
        prefill graph (or eager), each request's first token back."""
        if len(reqs) > self.bs or max(len(r.prompt_ids) for r in reqs) > self.L:
            raise SpectraceError("FastEngine.generate takes the prompts the engine was built for")
        lens = [len(r.prompt_ids) for r in reqs] + [1] * (self.bs - len(reqs))
        ids = [r.prompt_ids + [0] * (self.L - len(r.prompt_ids)) for r in reqs]
        ids += [[reqs[0].prompt_ids[0]] + [0] * (self.L - 1)] * (self.bs - len(reqs))
        self.kv.reset()
        if self.drafter:
            self.draft_kv.reset()
        self.prompt_ids.copy_(torch.tensor(ids))
        self.prompt_lens.copy_(torch.tensor(lens))
        if not self.sampling.greedy:  # the first token's draw, as plain decoding's
            self.upload(self.coin64, [float(torch.rand((), generator=r.gen, dtype=torch.float64)) for r in reqs])
        t0 = time.perf_counter()
        (self.graphs["prefill"].replay if self.graphs else self.prefill_forward)()
        first = self.roots.tolist()
        ms = round((time.perf_counter() - t0) * 1000, 3)
        for r, t in zip(reqs, first):
            self.append(r, [t])
            self.metrics.observe_prefill(r.req_pool_idx)
            if self.trace:
                kv = {"style": "sglang", "target_seq_len": [0, len(r.prompt_ids)], "events": [], "free_slots": None}
                rec = prefill_record(StepRow(r, 0, None, None), t, kv, {"prefill": ms})
                self.trace.write(rec, r.prompt_ids + r.output_ids)
        self.set_live(reqs)
        if self.host:
            self.host.prefill(reqs)

    def prefill_forward(self) -> None:
        """Target EXTEND over every prompt (causal, L rows a request); each request's first token
        is the argmax after its last real row. Then the drafter aligns itself with the prompt, as
        SGLang's forward_draft_extend: heads read pairs (f_t, x_{t+1}), the prompt shifted by one
        ending with the first token; a draft LM reads the prompt and the first token."""
        bs, L, device = self.bs, self.L, self.device
        rows = torch.arange(L, device=device)
        out = self.target(extend_batch(self.kv, self.prompt_ids.flatten(), rows.repeat(bs), L), self.kv,
                          self.capture_layers)
        last = torch.arange(bs, device=device) * L + self.prompt_lens - 1
        self.roots.copy_(self.next_tokens(out.logits[last]))
        self.kv.seq_lens.copy_(self.prompt_lens)
        for seed in (self.medusa.last_hidden if self.medusa else None, self.frozen.seed if self.frozen else None):
            if seed is not None:  # heads without KV read the hidden state whose lm_head gave the first token
                seed.copy_(out.hidden_states[last])
        if self.dflash:  # the prompt's context K/V (its padding rows land past each prompt, masked)
            features = torch.cat(out.aux_hidden_states, dim=-1).view(bs, L, -1)
            self.dflash.write(features, torch.zeros_like(self.prompt_lens))
        if not self.drafter:
            return
        width = L if self.drafter.is_head else L + 1
        tokens = self.prompt_ids[:, 1:] if self.drafter.is_head else self.prompt_ids
        tokens = F.pad(tokens, (0, width - tokens.shape[1]))  # (bs, width), the first token scattered in:
        tokens.scatter_(1, (self.prompt_lens - 1 if self.drafter.is_head else self.prompt_lens)[:, None],
                        self.roots[:, None])
        features = None
        if self.drafter.is_head:
            features = torch.cat(out.aux_hidden_states, dim=-1) if out.aux_hidden_states else out.hidden_states
        width_rows = torch.arange(width, device=device)
        h = self.drafter.forward(extend_batch(self.draft_kv, tokens.flatten(), width_rows.repeat(bs), width),
                                 self.draft_kv, features)
        d_lens = self.prompt_lens if self.drafter.is_head else self.prompt_lens + 1
        d_last = torch.arange(bs, device=device) * width + d_lens - 1
        self.next_probs.copy_(self.drafter.probs(h[d_last]))
        self.last_hidden.copy_(h[d_last])
        self.draft_kv.seq_lens.copy_(d_lens)

    def launch(self, reqs: list[Request]) -> dict:
        """Enqueue one step: the step's random numbers in, each phase (a graph replay, or eager),
        then the accepted tokens' copy to the host. Returns what finish_step reads."""
        before = self.kv.seq_lens.tolist() if self.recording else None
        marks = {"draft": self.clock.run(lambda: self.host.draft(reqs))} if self.host else {}
        randoms = self.draw(reqs) if not self.sampling.greedy else None  # after DRAFT: n-gram's sizes
        marks |= {name: self.clock.run(self.graphs[name].replay if self.graphs else fn) for name, fn in self.phases}
        if self.device.type != "cuda":
            return {"marks": marks, "out": self.step_out.clone(), "done": None, "before": before, "randoms": randoms}
        out = torch.empty(self.step_out.shape, dtype=self.step_out.dtype, pin_memory=True)
        out.copy_(self.step_out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return {"marks": marks, "out": out, "done": done, "before": before, "randoms": randoms}

    def draw(self, reqs: list[Request]) -> list:
        """Each unfinished request's random numbers for one step, from its own generator in the
        explicit engine's order: SGLang's coins over its tree's nodes, or one plain sample's
        (none, and an n-gram request that drafted nothing)."""
        sizes = self.host.sizes if self.host else [self.n if self.drafts else 1] * len(reqs)
        V = self.vocab
        noise = [[] for _ in range(self.S)] if self.sampled else None
        draws = []
        for r, m in zip(reqs, sizes):
            if r.finish_reason:
                draws.append(None)
                for i, level in enumerate(noise or []):  # a frozen row keeps its place in the buffers
                    level.append(torch.ones(1 if i == 0 else self.K, V))
            elif m == 1:
                draws.append(float(torch.rand((), generator=r.gen, dtype=torch.float64)))
            else:  # the draft loop's races first, level by level, as propose_children draws them
                for i, level in enumerate(noise or []):
                    level.append(torch.empty(1 if i == 0 else self.K, V).exponential_(generator=r.gen))
                draws.append(self.rule.draw(m, V, r.gen))
        trees = [d if isinstance(d, Randoms) else None for d in draws]
        if noise:
            for i, level in enumerate(noise):
                rows = torch.cat(level) if level else torch.ones(0, V)
                self.upload(self.noise[i], F.pad(rows, (0, 0, 0, self.noise[i].shape[0] - rows.shape[0]), value=1.0))
        if self.spec.acceptance == "vllm":
            for name in ("bonus_noise", "inv_q"):
                self.upload(getattr(self, name), torch.stack([getattr(d, name) if d else torch.ones(V) for d in trees]))
            self.upload(self.uniforms, torch.stack([F.pad(d.uniforms, (0, self.n - 1 - len(d.uniforms))) if d else
                                                    torch.zeros(self.n - 1, dtype=torch.float64) for d in trees]))
        else:  # SGLang's coins (typical draws the final one only)
            self.upload(self.coins, [F.pad(d.coins, (0, self.n - len(d.coins))).tolist()
                                     if d is not None and d.coins is not None else [0.0] * self.n for d in trees])
            self.upload(self.coin_final, [float(d.coin_final) if d else 0.0 for d in trees])
        self.upload(self.coin64, [d if isinstance(d, float) else 0.0 for d in draws])
        if self.ranks_worth:
            self.upload(self.worth, torch.stack([self.sibling_stats[r.req_pool_idx].worth() for r in reqs]))
        return draws

    def upload(self, buffer: torch.Tensor, rows) -> None:
        """Host values (a list or a tensor of rows) into a device buffer (missing rows zero),
        without waiting for the GPU."""
        host = torch.zeros(buffer.shape, dtype=buffer.dtype)
        host[:len(rows)] = torch.as_tensor(rows, dtype=buffer.dtype)
        buffer.copy_(host.pin_memory() if self.device.type == "cuda" else host, non_blocking=True)

    def next_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """Plain decoding's next token after each row of logits (bs, V): the argmax, or a sample
        of p with each request's coin."""
        if self.sampling.greedy:
            return torch.argmax(logits, dim=-1)
        return sample_rows(probs_from_logits(logits, self.sampling), self.coin64)

    @torch.no_grad()
    def finish_step(self, reqs: list[Request], launched: dict) -> None:
        """The host's part of a launched step, once its tokens have arrived (the step's one
        sync): EOS and max_new_tokens, metrics, the trace."""
        if launched["done"] is not None:
            launched["done"].synchronize()
        rows = launched["out"].tolist()  # (bs, S + 2): accept_tokens, then accept_num
        timing = {**self.clock.read(launched["marks"]), "batch_size": sum(not r.finish_reason for r in reqs)}
        host = self.step_tensors() if self.recording else None
        adaptive = self.adaptive.step([row[-1] for row, r in zip(rows, reqs) if not r.finish_reason]) \
            if self.adaptive else None  # the explicit engine's adapt: the EMA over this step's requests
        finished = False
        for b, r in enumerate(reqs):
            if r.finish_reason:
                continue
            num = rows[b][-1]
            committed = self.append(r, rows[b][:num + 1])
            finished |= r.finish_reason is not None
            size = self.host.sizes[b] if self.host else self.n if self.drafts else 1
            self.metrics.observe(b, self.step_count, timing, len(committed), num, size - 1 if size > 1 else None,
                                 num + 1, adaptive and adaptive["num_steps"])
            if self.ranks_worth:  # the walk's tries and acceptances by sibling rank rank the next trees
                counts = rows[b][self.S + 1:-1]
                self.sibling_stats[r.req_pool_idx].add(counts[:self.K], counts[self.K:])
            if self.recording:
                randoms = launched["randoms"][b] if launched["randoms"] else None
                rec = self.record(b, r, host, rows[b][:num + 1], randoms, committed, launched["before"][b], timing,
                                  adaptive)
                if self.trace:
                    self.trace.write(rec, record_token_ids(rec))
                if self.on_step:
                    self.on_step(rec)
        if self.host:  # the histories of the requests still running grow by their accept_tokens
            self.host.extend([(r.req_pool_idx, rows[b][:rows[b][-1] + 1]) for b, r in enumerate(reqs)
                              if not r.finish_reason])
        if finished:
            self.set_live(reqs)
        if adaptive and adaptive["switched_to"]:
            self.use_tier(adaptive["switched_to"])
        self.step_count += 1

    def set_live(self, reqs: list[Request]) -> None:
        """Which bucket rows still commit; copied without waiting for the steps already enqueued."""
        live = torch.tensor([not r.finish_reason for r in reqs] + [False] * (self.bs - len(reqs)))
        self.live.copy_(live.pin_memory() if self.device.type == "cuda" else live, non_blocking=True)

    # ---- the phases: device work only, graph-safe ------------------------------------------
    def draft(self) -> None:
        """DRAFT: num_steps levels of K paths (select_top_k_tokens), the n - 1 best candidates
        (organize_draft_results), the tree with its FULL_MASK over each prefix (build_tree).
        Medusa and DFLASH: one pass into a tree of a fixed shape, Medusa's static tree
        (kernels/fast_medusa.py) or DFLASH's block chain (kernels/fast_dflash.py)."""
        if self.static:
            tree = self.static.draft(self.roots, self.kv.seq_lens)
            self.tree_mask = full_mask(self.static.masks, self.kv.seq_lens, self.mask_capacity)
            self.positions, self.draft_tokens = tree["positions"], tree["draft_tokens"]
            self.retrive_index = self.static.retrive_index
            self.retrive_next_token, self.retrive_next_sibling = (self.static.retrive_next_token,
                                                                  self.static.retrive_next_sibling)
            if self.recording:
                self.q, self.scores, self.draft_top = tree["q"], tree["scores"], tree["draft_top"]
                self.candidates = None
                self.keep_tree_rows()
            return
        K, S, n = self.K, self.S, self.n
        sampled = SampledDrafts(None, self.worth if self.ranks_worth else None, iter(self.noise)) if self.sampled \
            else None
        if self.frozen:  # the assistant's pass at the root first (it keeps no q between steps)
            probs, hidden = self.frozen.forward(self.roots, self.frozen.seed, 1)
            levels = draft_forward(lambda i, ids, h, parents: self.frozen.forward(ids, h, K), probs, hidden, S, K,
                                   sampled)
        else:
            hidden = self.last_hidden if self.drafter.is_head else None
            levels = draft_forward(self.draft_level, self.next_probs, hidden, S, K, sampled)
        parent_list, top_scores_index, draft_tokens = organize_draft_results(
            levels.score_list, levels.token_list, levels.parents_list, n)
        (self.tree_mask, positions, self.retrive_index, self.retrive_next_token, self.retrive_next_sibling) = \
            sglang.build_tree(parent_list, top_scores_index, self.kv.seq_lens, K, n, TreeMaskMode.FULL_MASK,
                              seq_lens_sum=self.kv.req_to_token.numel())  # a bound on the prefixes: no sync
        self.positions = positions.view(self.bs, n)
        self.draft_tokens = torch.cat([self.roots[:, None], draft_tokens], dim=1)  # (bs, n) root first
        if self.sampled or self.probs is not None:  # the q each node was drawn from, or chosen from by top-k:
            # its parent path's row (build_draft_tree)
            dists = torch.cat([p.view(self.bs, -1, p.shape[-1]) for p in levels.probs_list], dim=1)
            rows = (top_scores_index // K)[..., None].expand(-1, -1, dists.shape[-1])
            self.draft_probs = torch.gather(dists, 1, rows)  # (bs, n-1, V)
        if self.recording:
            self.keep_for_trace(levels, top_scores_index)

    @property
    def mask_capacity(self) -> int:
        """Entries of a FULL_MASK buffer for any prefixes: build_tree's size with seq_lens_sum
        bounded by every slot of req_to_token (so no sync)."""
        return self.kv.req_to_token.numel() * self.n + self.n * self.n * self.bs

    def keep_tree_rows(self) -> None:
        """The tree part of each request's FULL_MASK rows, (bs, n, n), for the trace."""
        n = self.n
        seq, r = self.kv.seq_lens[:, None, None], torch.arange(n, device=self.device)
        start = F.pad((n * (self.kv.seq_lens + n)).cumsum(0), (1, 0))[:-1, None, None]
        self.tree_rows = self.tree_mask[start + r[:, None] * (seq + n) + seq + r]

    def keep_for_trace(self, levels, top_scores_index) -> None:
        """What the trace keeps of each node: its q, path score, the draft's top tokens where it
        was drawn, and the tree part of the mask (recording runs only: a dozen kernels more)."""
        K = self.K
        self.keep_tree_rows()
        self.q = torch.gather(torch.cat(levels.q_list, dim=1), 1, top_scores_index)
        self.scores = torch.gather(torch.cat([s.flatten(1) for s in levels.score_list], dim=1), 1, top_scores_index)
        dists = torch.cat([p.view(self.bs, -1, p.shape[-1]) for p in levels.probs_list], dim=1)
        k = min(max(K, self.spec.trace_topk, 1), dists.shape[-1])
        top = torch.topk(dists, k, dim=-1)  # (bs, rows, k), gathered at each node's parent row
        rows = (top_scores_index // K)[..., None].expand(-1, -1, k)
        self.draft_top = (torch.gather(top.values, 1, rows), torch.gather(top.indices, 1, rows))
        self.candidates = (*level_tensors(levels), top_scores_index)  # every candidate the loop scored

    def draft_level(self, i: int, input_ids, hidden_states, parents):
        """One forward of the draft loop (draft_forward's `forward`): level i's K kept paths per
        request, path k writing scratch column k * (S - 1) + i after the committed draft KV and
        reading that KV and its own path's columns (drafters/scratch.py)."""
        K, S, kv, device = self.K, self.S, self.draft_kv, self.device
        bs, T = self.bs, self.draft_kv.seq_lens
        own = torch.arange(K, device=device) * (S - 1) + i  # (K,)
        if i == 0:
            self.paths = own.view(1, K, 1).expand(bs, K, 1)
        else:  # a kept path extends path (parents // K - 1) % K of level i - 1
            beam = (parents // K - 1 - K * (i - 1))[..., None].expand(-1, -1, i)
            self.paths = torch.cat([torch.gather(self.paths, 1, beam), own.view(1, K, 1).expand(bs, K, 1)], dim=2)
        rows_T = T.repeat_interleave(K)  # (bs*K,) committed draft KV of each path's request
        kv_indptr = F.pad((rows_T + i + 1).cumsum(0), (1, 0))
        kv_indices = torch.empty(bs * K * kv.req_to_token.shape[1], dtype=torch.int64, device=device)
        attention.create_kv_indices(kv.req_to_token, torch.arange(bs, device=device).repeat_interleave(K), rows_T,
                                    kv_indptr, None, kv_indices)
        path_slots = kv.req_to_token.gather(1, T[:, None] + self.paths.flatten(1))  # (bs, K*(i+1))
        at = kv_indptr[:-1, None] + rows_T[:, None] + torch.arange(i + 1, device=device)  # (bs*K, i+1)
        kv_indices[at.flatten()] = path_slots.flatten()
        batch = ForwardBatch(input_ids=input_ids, positions=rows_T + i, req_pool_indices=[], seq_lens=[],
                             extend_lens=[K] * bs, out_cache_loc=kv.req_to_token.gather(1, T[:, None] + own).flatten(),
                             custom_masks=[],
                             attn_metadata={"branch": dict(kv_indptr=kv_indptr, kv_indices=kv_indices)})
        h = self.drafter.forward(batch, kv, hidden_states)
        return self.drafter.probs(h), h if self.drafter.is_head else None

    def verify(self) -> None:
        """VERIFY: the target over every node (plain decoding: the root alone, causal), the
        target's argmax after each node, the walk (greedy, or target_only with the step's coins),
        then ACCEPT's tokens and COMMIT."""
        bs, n, S, device = self.bs, self.n, self.S, self.device
        if self.host:  # the host's trees, from the buffers it filled, over each prefix
            self.draft_tokens = torch.cat([self.roots[:, None], self.host.tokens[:, 1:]], dim=1)
            self.positions = self.kv.seq_lens[:, None] + self.host.depths
            self.tree_mask = full_mask(self.host.masks, self.kv.seq_lens, self.mask_capacity)
            self.retrive_index = torch.arange(bs * n, device=device).view(bs, n)
            self.retrive_next_token, self.retrive_next_sibling = self.host.retrive_next_token, \
                self.host.retrive_next_sibling
        if not self.drafts:
            candidates, positions, width = self.roots[:, None], self.kv.seq_lens[:, None], 1
            retrive_index = torch.arange(bs, device=device)[:, None]
            next_token = next_sibling = torch.full((bs, 1), -1, device=device)
        else:
            candidates, positions, width = self.draft_tokens, self.positions, n
            retrive_index = self.retrive_index
            next_token, next_sibling = self.retrive_next_token, self.retrive_next_sibling
        if self.spec.deterministic:
            out = self.forward_rows(candidates, positions)
        else:
            out = self.target(extend_batch(self.kv, candidates.flatten(), positions.flatten(), width,
                                           self.tree_mask if self.drafts else None), self.kv, self.capture_layers)
        self.logits = out.logits  # (bs*n, V)
        self.features = torch.cat(out.aux_hidden_states, dim=-1) if out.aux_hidden_states else out.hidden_states
        self.target_predict = torch.argmax(self.logits, dim=-1)  # ties to the lowest id, as plain decoding
        predicts = torch.full((bs * n,), -1, device=device)  # the walk leaves the bonus at the last accepted row
        self.accept_index = torch.full((bs, S + 1), -1, device=device)
        self.accept_num = torch.zeros(bs, dtype=torch.int64, device=device)
        if self.sampling.greedy:
            sglang.verify_tree_greedy(predicts, self.accept_index, self.accept_num, candidates, retrive_index,
                                      next_token, next_sibling, self.target_predict)
        elif not self.drafts:  # a plain sample
            self.accept_index[:, 0] = torch.arange(bs, device=device)
            predicts = self.next_tokens(self.logits)
        else:
            p = probs_from_logits(self.logits.view(bs, n, -1), self.sampling)
            if self.spec.acceptance == "target_only":
                sglang.tree_speculative_sampling_target_only(
                    predicts, self.accept_index, self.accept_num, candidates, retrive_index, next_token,
                    next_sibling, self.coins, self.coin_final, p, torch.zeros_like(p), self.spec.threshold_single,
                    self.spec.threshold_acc)
            elif self.spec.acceptance == "typical":
                self.keep_tree_rows()
                depths = self.positions - self.kv.seq_lens[:, None]
                index, num, bonus = typical_accept(p, candidates, self.tree_rows, depths, self.coin_final, sample_rows,
                                                   S + 1)
                self.accept_index.copy_(index)
                self.accept_num.copy_(num)
                predicts.scatter_(0, index.gather(1, num[:, None]).flatten(), bonus)
            elif self.spec.acceptance == "tree_rejection":
                index, num, bonus, self.tried, self.accepted = tree_rejection_accept(
                    p, self.draft_probs, candidates, next_token, next_sibling, self.coins, self.coin_final,
                    sample_rows, S, self.K)
                self.accept_index.copy_(index)
                self.accept_num.copy_(num)
                predicts.scatter_(0, index.gather(1, num[:, None]).flatten(), bonus)
            elif self.spec.acceptance == "rejection":
                sglang.chain_speculative_sampling(predicts, self.accept_index, self.accept_num, candidates,
                                                  retrive_index, self.coins, self.coin_final, p, self.draft_probs)
            else:
                self.vllm_verify(predicts, candidates, p)
        # accept_tokens (bs, S + 1): the correct drafts, then the bonus at column accept_num; -1 after
        path = self.accept_index.clamp(min=0)
        j = torch.arange(S + 1, device=device)
        drafts = F.pad(candidates.flatten()[path[:, 1:]], (0, 1))
        bonus = predicts.gather(0, path.gather(1, self.accept_num[:, None]).flatten())
        if self.host and not self.sampling.greedy:  # an n-gram request without drafts: plain decoding's sample
            bonus = torch.where(self.host.drafted, bonus, self.next_tokens(self.logits.view(bs, n, -1)[:, 0]))
        self.accept_tokens = torch.where(j < self.accept_num[:, None], drafts,
                                         torch.where(j == self.accept_num[:, None], bonus[:, None], -1))
        # what the host reads: accept_tokens, (tree_rejection: tries and acceptances by rank,) accept_num
        counts = [self.tried, self.accepted] if self.spec.acceptance == "tree_rejection" and self.drafts else []
        self.step_out = torch.cat([self.accept_tokens, *counts, self.accept_num[:, None]], dim=1)
        self.commit(path - (torch.arange(bs, device=device) * n)[:, None], j)
        self.roots.copy_(torch.where(self.live, bonus, self.roots))

    def forward_rows(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ForwardOutput:
        """--deterministic: the target over (bs, w) new tokens as bs * w one-token forwards, each
        a decode over its request's committed KV, then the slots of the nodes its tree row shows
        (its ancestors, in index order: parents come first) and its own, in one KV split. Every
        operation then has a one-token decode's shapes and reads the keys an autoregressive decode
        of that token reads, in the same order, so a token's numbers do not depend on the tree or
        the batch around it: bf16 greedy speculative output equals bf16 greedy autoregressive output
        (`none` runs the same way, w 1). core/model.py's batch_invariant, on the device."""
        kv, (bs, w) = self.kv, input_ids.shape
        if w > 1:
            self.keep_tree_rows()
        col = torch.arange(kv.req_to_token.shape[1], device=self.device)
        outs = []
        for b in range(bs):  # a tree's rows in index order: a node's ancestors have written their KV
            seq = kv.seq_lens[b]
            node = (col - seq).clamp(0, w - 1)  # which node a verify column holds
            verify = (col >= seq) & (col < seq + w)
            for j in range(w):
                shown = (col < seq) | (verify & self.tree_rows[b, j, node]) if w > 1 else col <= seq
                order = torch.argsort((~shown).to(torch.int8), stable=True)  # the shown columns first, in order
                meta = dict(kv_indptr=F.pad(shown.sum()[None], (1, 0)), kv_indices=kv.req_to_token[b, order],
                            num_kv_splits=1)
                batch = ForwardBatch(input_ids=input_ids[b, j:j + 1], positions=positions[b, j:j + 1],
                                     req_pool_indices=[], seq_lens=[], extend_lens=[1],
                                     out_cache_loc=kv.req_to_token[b].gather(0, (seq + j)[None]), custom_masks=[],
                                     attn_metadata={"branch": meta})
                outs.append(self.target(batch, kv, self.capture_layers))
        return ForwardOutput(torch.cat([o.logits for o in outs]), torch.cat([o.hidden_states for o in outs]),
                             [torch.cat(a) for a in zip(*(o.aux_hidden_states for o in outs))])

    def vllm_verify(self, predicts: torch.Tensor, candidates: torch.Tensor, p: torch.Tensor) -> None:
        """vLLM's rejection sampler over each request's chain of sampled drafts (acceptance/vllm.py:
        vllm_accept; kernels/vllm.py): the bonus from the Sampler's race on p after the last draft,
        recovered tokens, then the walk; its output as SGLang's path. A model drafter's chains all
        hold k = n - 1 drafts; n-gram's vary per request (its one-hot drafts: q None), so the
        drafts are packed as vLLM packs them, request after request, into a buffer of bs * k rows
        (cu_num_draft_tokens says where each request's end)."""
        bs, n, device = self.bs, self.n, self.device
        k = n - 1
        counts = self.host.num_drafts if self.host else torch.full((bs,), k, device=device)
        cu = counts.cumsum(0)
        j = torch.arange(k, device=device)
        packed = torch.where(j < counts[:, None], (cu - counts)[:, None] + j, bs * k).flatten()  # bs * k: dropped

        def pack(x: torch.Tensor) -> torch.Tensor:  # (bs, k, ...) -> (bs * k, ...), request after request
            out = x.new_zeros((bs * k + 1,) + x.shape[2:])
            return out.index_copy_(0, packed, x.flatten(0, 1))[:-1]

        drafts, target, uniforms = pack(candidates[:, 1:]), pack(p[:, :k]), pack(self.uniforms)
        q = pack(self.draft_probs) if self.draft_probs is not None else None
        bonus = torch.argmax(p[torch.arange(bs, device=device), counts] / self.bonus_noise, dim=-1)
        recovered = vllm_kernels.sample_recovered_tokens(k, [k] * bs, cu, drafts, q, target, self.inv_q)
        out = torch.full((bs, n), -1, dtype=torch.int32, device=device)
        vllm_kernels.rejection_random_sample(out, cu, drafts, q, target, bonus[:, None], recovered, uniforms, None, k)
        self.accept_num.copy_((out != -1).sum(dim=1) - 1)
        rows = torch.arange(bs, device=device)[:, None] * n + torch.arange(n, device=device)
        self.accept_index.copy_(torch.where(torch.arange(n, device=device) <= self.accept_num[:, None], rows, -1))
        last = torch.arange(bs, device=device) * n + self.accept_num
        predicts.scatter_(0, last, out.gather(1, self.accept_num[:, None]).flatten().long())

    def commit(self, nodes: torch.Tensor, j: torch.Tensor) -> None:
        """COMMIT (SGLang's remap): the verify's n columns of each live row reordered so the
        accepted path's slots come first, in path order, and the rest after them, still owned by
        the request; seq_lens grows by accept_num + 1 (the root and the correct drafts)."""
        n = self.n
        cols = self.kv.seq_lens[:, None] + torch.arange(n, device=self.device)
        # rank of each node in the new order: its place on the path, else n + its index; entries
        # past the path (and every entry of a frozen row) rewrite the root's rank 0, a no-op
        on_path = (j <= self.accept_num[:, None]) & self.live[:, None]
        rank = (torch.arange(n, device=self.device) + n).repeat(self.bs, 1)
        rank.scatter_(1, torch.where(on_path, nodes, 0), torch.where(on_path, j, 0))
        order = torch.argsort(rank, dim=1, stable=True)
        self.kv.req_to_token.scatter_(1, cols, self.kv.req_to_token.gather(1, cols).gather(1, order))
        self.kv.seq_lens.add_(torch.where(self.live, self.accept_num + 1, 0))

    def extend(self) -> None:
        """EXTEND (DRAFT_EXTEND): each request's accept_tokens, padded to num_steps + 1, with the
        features of the accepted path's rows (root .. last correct draft) for a head; q and the
        output after the last real row are what the next DRAFT starts from."""
        if self.dflash:  # the accepted rows' context, after the columns committed before this step
            self.dflash.write(self.features[self.accept_index.clamp(min=0)],
                              self.kv.seq_lens - torch.where(self.live, self.accept_num + 1, 0))
            return
        if self.medusa or self.frozen:  # no KV: they read the hidden state of the last accepted row
            last_row = self.accept_index.gather(1, self.accept_num[:, None]).clamp(min=0).flatten()
            h = self.medusa.last_hidden if self.medusa else self.frozen.seed
            h.copy_(torch.where(self.live[:, None], self.features[last_row], h))
            return
        E, bs, kv = self.S + 1, self.bs, self.draft_kv
        cols = kv.seq_lens[:, None] + torch.arange(E, device=self.device)
        batch = extend_batch(kv, self.accept_tokens.clamp(min=0).flatten(), cols.flatten(), E)
        features = self.features[self.accept_index.clamp(min=0).flatten()] if self.drafter.is_head else None
        h = self.drafter.forward(batch, kv, features)
        last = torch.arange(bs, device=self.device) * E + self.accept_num
        live = self.live[:, None]
        self.next_probs.copy_(torch.where(live, self.drafter.probs(h[last]), self.next_probs))
        self.last_hidden.copy_(torch.where(live, h[last], self.last_hidden))
        kv.seq_lens.add_(torch.where(self.live, self.accept_num + 1, 0))

    # ---- host side -------------------------------------------------------------------------
    def append(self, r: Request, tokens: list[int]) -> list[int]:
        return append_tokens(r, tokens, self.eos, self.spec.max_new_tokens)

    def step_tensors(self) -> dict:
        """The step's tensors on the host, for the trace (the cost of --trace-level steps/full)."""
        names = ["target_predict", "accept_index", "accept_num"]
        if self.drafts:
            names += ["draft_tokens", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling"]
        device_tree = self.drafts and not self.host  # n-gram's trees are on the host already
        if device_tree:
            names += ["tree_rows", "q", "scores"] + (["draft_probs"] if self.draft_probs is not None else [])
            names += ["worth"] if self.ranks_worth else []
        host = {name: getattr(self, name).cpu() for name in names}
        greedy = self.sampling.greedy  # p as the trace shows it: softmax at temperature 0, else after T, top-k, top-p
        p = torch.softmax(self.logits, dim=-1) if greedy else probs_from_logits(self.logits, self.sampling)
        host["target_probs"] = p.view(self.bs, self.n, -1).cpu()
        if self.probs is not None:
            host["logits"] = self.logits.float().view(self.bs, self.n, -1).cpu()
        host["target_predict"] = host["target_predict"].view(self.bs, self.n)
        host["req_to_token"], host["seq_lens"] = self.kv.req_to_token.cpu(), self.kv.seq_lens.cpu()
        if self.drafter:
            host["draft_seq_lens"] = self.draft_kv.seq_lens.cpu()
        if device_tree:
            values, indices = self.draft_top
            host["draft_topk"] = [as_pairs(ib, vb) for ib, vb in zip(indices.tolist(), values.tolist())]
            host["candidates"] = (draft_candidates(*(t.cpu() for t in self.candidates), self.K)
                                  if self.candidates is not None else None)
        return host

    def record(self, b: int, r: Request, host: dict, tokens: list[int], randoms, committed: list[int],
               seq_before: int, timing: dict, adaptive: dict | None) -> dict:
        """The explicit engine's step record of request b (core/step_record.py), from the step's
        tensors: the walk's decisions from the explicit rule's walk over the same tree, p and coins,
        checked against what the kernels did (tokens: the step's accept tokens, the bonus last)."""
        n, num, bonus = self.n, int(host["accept_num"][b]), tokens[-1]
        tree, i, size = None, b, 1  # the step's trees, this request's index in them, its nodes
        if self.host:  # the trees the host drafted (they keep the n-gram's match)
            tree, i = self.host.tree, self.host.index[b]
            size = tree.size(i)
        elif self.drafts:
            size, tree = n, DraftTree(
                draft_tokens=host["draft_tokens"], tree_mask=host["tree_rows"], positions=host["positions"],
                retrive_index=host["retrive_index"], retrive_next_token=host["retrive_next_token"],
                retrive_next_sibling=host["retrive_next_sibling"], q=host["q"], scores=host["scores"],
                draft_topk=host["draft_topk"], candidates=host["candidates"], sibling_worth=host.get("worth"))
        row = StepRow(r, seq_before, None, None, b=i, drafted=size > 1, committed=committed)
        row.target_predict = host["target_predict"][b, :size].tolist()
        row.target_probs = host["target_probs"][b, :size]
        if size == 1:  # plain decoding, or an n-gram request that drafted nothing: core/engine.py's plain_result
            row.candidates, row.positions = [r.output_ids[-len(committed) - 1]], [seq_before]
            row.result = AcceptResult([], bonus, [0], [], None if self.sampling.greedy else
                                      bonus_from("target", 0, row.target_probs[0], self.spec.trace_topk))
        else:
            if self.probs is not None:  # the walk's inputs, for spectrace rejudge
                self.probs.add(self.step_count, r.req_pool_idx, host["logits"][b, :size],
                               host["draft_probs"][b] if "draft_probs" in host else None, randoms or Randoms())
            row.candidates = host["draft_tokens"][b, :size].tolist()
            row.positions = host["positions"][b, :size].tolist()
            row.result = self.rule.walk(
                row.candidates, host["retrive_next_token"][b, :size].tolist(),
                host["retrive_next_sibling"][b, :size].tolist(), row.target_predict, row.target_probs,
                host["draft_probs"][b] if self.sampled else None, randoms, self.S, self.spec.rule_params)
            kernel_path = (host["accept_index"][b, :num + 1] - b * n).tolist()
            if (kernel_path, bonus) != (row.result.accept_nodes, row.result.bonus_token):
                raise SpectraceError(
                    f"--backend fast: the {self.spec.acceptance} kernel walked {kernel_path} with bonus {bonus} where "
                    f"the explicit walk walked {row.result.accept_nodes} with bonus {row.result.bonus_token} "
                    f"(request {b}, step {self.step_count})")
        after = int(host["seq_lens"][b])
        kv = {"style": "sglang", "target_seq_len": [seq_before, after],
              "req_to_token_tail": {"start": max(0, after - 16),
                                    "slots": host["req_to_token"][b, max(0, after - 16):after].tolist()},
              "events": [], "free_slots": None}
        if self.drafter:
            d_after = int(host["draft_seq_lens"][b])
            kv["draft_seq_len"] = [d_after - num - 1, d_after]  # EXTEND ran over every accepted token
        return step_record(self.step_count, row, tree, self.spec.acceptance, kv, timing, self.spec.trace_topk,
                           adaptive)
