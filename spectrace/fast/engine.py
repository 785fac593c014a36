"""The fast engine (`--backend fast`): core/engine.py's speculative step with the whole batch on
the device, the Triton twins for attention, tree build and the walks, and CUDA graphs as SGLang
captures them. The phases and names are the explicit engine's:

    DRAFT    the drafter's trees for every request (fast/drafters/), a DeviceTree
    VERIFY   one target forward over every node under the tree's mask (QLEN_ONLY); the target's argmax
    ACCEPT   the rule walks every tree at once (fast/acceptance/): accept_tokens, the bonus
    COMMIT   the accepted path's KV slots first in each request's row (fast/kv.py), the next roots
    EXTEND   the drafter catches up on the accepted tokens (DRAFT_EXTEND)
    RECORD   on the host, after the step's one sync: EOS and lengths, metrics, the trace

A step's state is tensors over the batch bucket, (bs, ...), on the device. DRAFT, VERIFY + ACCEPT +
COMMIT and EXTEND are each one CUDA graph (fast/graphs.py: LAUNCHES), as SGLang captures the draft
loop, the verify and the draft extend; prefill is one too. Finished requests stay in their row,
frozen: `live` masks their commits. On a CPU (TRITON_INTERPRET=1) the same code runs eagerly.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from spectrace.core.acceptance import RULES
from spectrace.core.acceptance.tree_rejection import SiblingStats
from spectrace.core.adaptive import AdaptiveSpeculativeParams
from spectrace.core.engine import Request, SpecConfig, append_tokens
from spectrace.core.metrics import SpecMetrics
from spectrace.core.probs import ProbsRecorder
from spectrace.core.sampling import request_generator
from spectrace.core.step_record import record_token_ids
from spectrace.core.trace import TraceWriter
from spectrace.errors import SpectraceError
from spectrace.fast.acceptance import FAST_RULES, greedy, plain_sample
from spectrace.fast.batch import decode_rows_batch, extend_batch, features
from spectrace.fast.graphs import PhaseClock, Tier, capture, launch_groups
from spectrace.fast.kv import StaticKV
from spectrace.fast.sampling import DeviceRandoms, next_tokens
from spectrace.fast.step_record import StepRecorder
from spectrace.fast.tree import root_tree
from spectrace.kernels.commit import accept_tokens
from spectrace.kernels.fused import is_fused


class FastEngine:
    def __init__(self, target, kv: StaticKV, spec: SpecConfig, drafter, prompt_ids: list[list[int]], eos_token_ids,
                 trace: TraceWriter | None = None, on_step=None, probs: ProbsRecorder | None = None,
                 graphs: bool | None = None, probe=None):
        """kv: the target's static KV over the batch bucket, sized for every request (engines.py:
        build_engine); drafter: a fast/drafters/ drafter or None (--algo none); graphs: capture
        CUDA graphs (default: on a GPU); probe: bench --profile's PhaseProbe, whose
        `phase(name)` wraps each phase's launch (each phase then is a launch of its own)."""
        self.target, self.kv, self.spec, self.drafter = target, kv, spec, drafter
        self.trace, self.on_step, self.eos = trace, on_step, set(eos_token_ids)
        self.device, self.bs = kv.seq_lens.device, kv.seq_lens.shape[0]
        # the rule's walk over every tree; plain decoding (no drafter): the root's argmax, or a sample of p
        self.rule = FAST_RULES[spec.acceptance] if drafter else greedy if spec.sampling.greedy else plain_sample
        self.recorder = StepRecorder(spec, drafter, probs) if trace is not None or on_step is not None else None
        self.adaptive = AdaptiveSpeculativeParams(spec.num_steps) if spec.adaptive else None
        randoms = DeviceRandoms(RULES[spec.acceptance], self.bs, spec.topk, target.config.vocab_size,
                                drafter is not None and drafter.sampled, self.device)
        steps = self.adaptive.candidate_steps if self.adaptive else [spec.num_steps if drafter else 0]
        self.tiers = {num_steps: Tier(num_steps, n, randoms.for_shape(num_steps, n)) for num_steps in steps
                      for n in [num_steps + 1 if self.adaptive else spec.num_draft_tokens]}
        self.tier = self.tiers[spec.num_steps if self.adaptive else steps[0]]  # an adaptive run starts at num_steps
        L = max(len(p) for p in prompt_ids)  # prefill pads every prompt to the longest
        self.prompt_ids = torch.zeros(self.bs, L, dtype=torch.int64, device=self.device)
        self.prompt_lens = torch.ones(self.bs, dtype=torch.int64, device=self.device)
        self.roots = torch.zeros(self.bs, dtype=torch.int64, device=self.device)  # each request's last token
        self.live = torch.zeros(self.bs, dtype=torch.bool, device=self.device)
        self.metrics = SpecMetrics(spec.max_steps if drafter else 0, spec.num_draft_tokens)
        self.step_count, self.clock, self.sibling_stats, self.prefill_graph = 0, PhaseClock(self.device), {}, None
        self.launches, self.probe = launch_groups(drafter, probe is not None), probe
        if graphs if graphs is not None else self.device.type == "cuda":
            self.capture()

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.drafter.capture_layers if self.drafter is not None else ()

    @property
    def host_drafts(self) -> bool:
        """DRAFT runs on the host, before the step's graphs (n-gram)."""
        return self.drafter is not None and self.drafter.on_host

    def phases(self, names: tuple[str, ...]):
        """The named phases as one function (a launch's group)."""
        fns = [getattr(self, name) for name in names]
        return lambda: [fn() for fn in fns]

    def capture(self) -> None:
        """The prefill graph, then each tier's graphs (an adaptive run captures the phases once
        per tier; each tier keeps what its captures left). The warm-ups and captures change the
        KV, so it is reset afterwards."""
        first = self.tier
        for tier in self.tiers.values():
            self.tier = tier
            groups = [(name, self.phases(names)) for name, names in self.launches]
            if self.prefill_graph is None:
                groups.insert(0, ("prefill", self.prefill_forward))
            tier.graphs = capture(groups)
            self.prefill_graph = self.prefill_graph or tier.graphs.pop("prefill")
        self.tier = first
        self.reset()

    def reset(self) -> None:
        """Every request's KV empty (before a run, and after the captures, which wrote into it)."""
        self.kv.reset()
        if self.drafter is not None:
            self.drafter.reset()

    # ---- the loop (host) ----------------------------------------------------------------------
    def generate(self, prompts: list[list[int]]) -> tuple[list[Request], dict]:
        """Prefill, then steps until every request is finished. The next step is launched before the
        last one is read (SGLang's overlap scheduler: a request that finished runs one step more,
        frozen) but where n-gram's drafts, an adaptive tier or tree_rejection's trees follow it."""
        reqs = [Request(i, list(p), gen=request_generator(self.spec.seed, i)) for i, p in enumerate(prompts)]
        self.sibling_stats = {r.req_pool_idx: SiblingStats(self.spec.topk) for r in reqs}
        t0 = time.perf_counter()
        self.prefill(reqs)
        pending = self.launch(reqs) if any(not r.finish_reason for r in reqs) else None
        overlap = not self.adaptive and not self.ranks_worth and not self.host_drafts
        while pending is not None:
            ahead = self.launch(reqs) if overlap else None
            self.finish_step(reqs, pending)
            pending = None if all(r.finish_reason for r in reqs) else ahead or self.launch(reqs)
        if self.device.type == "cuda":  # a step launched ahead of the end finishes inside the measured time
            torch.cuda.synchronize()
        metrics = self.metrics.summary(time.perf_counter() - t0)
        metrics["per_request"] = [self.metrics.per_request(r.req_pool_idx) for r in reqs]
        return reqs, metrics

    @property
    def ranks_worth(self) -> bool:
        """tree_rejection's trees are ranked by what each sibling rank was worth (SiblingStats)."""
        return self.spec.acceptance == "tree_rejection" and self.spec.topk > 1 and self.drafter is not None

    @torch.no_grad()
    def prefill(self, reqs: list[Request]) -> None:
        """The prompts into the static buffers (padding rows of the bucket: one token), the
        prefill graph (or eager), each request's first token back."""
        L = self.prompt_ids.shape[1]
        if len(reqs) > self.bs or max(len(r.prompt_ids) for r in reqs) > L:
            raise SpectraceError("FastEngine.generate takes the prompts the engine was built for")
        ids = [r.prompt_ids + [0] * (L - len(r.prompt_ids)) for r in reqs]
        ids += [[reqs[0].prompt_ids[0]] + [0] * (L - 1)] * (self.bs - len(reqs))
        self.reset()
        self.prompt_ids.copy_(torch.tensor(ids))
        self.prompt_lens.copy_(torch.tensor([len(r.prompt_ids) for r in reqs] + [1] * (self.bs - len(reqs))))
        randoms = self.tier.randoms
        if not self.spec.sampling.greedy:  # the first token's draw, as plain decoding's
            randoms.upload(randoms.coin64, [float(torch.rand((), generator=r.gen, dtype=torch.float64)) for r in reqs])
        t0 = time.perf_counter()
        (self.prefill_graph.replay if self.prefill_graph else self.prefill_forward)()
        first, ms = self.roots.tolist(), round((time.perf_counter() - t0) * 1000, 3)
        for r, t in zip(reqs, first):
            append_tokens(r, [t], self.eos, self.spec.max_new_tokens)
            self.metrics.observe_prefill(r.req_pool_idx, ms)
            if self.trace:
                self.trace.write(self.recorder.prefill_record(r, t, ms), r.prompt_ids + r.output_ids)
        self.set_live(reqs)
        if self.host_drafts:
            self.drafter.host_prefill(reqs)

    def prefill_forward(self) -> None:
        """Target EXTEND over every prompt (causal, L rows a request); each request's first token
        is the next token after its last real row; then the drafter aligns itself with the prompt
        (SGLang's forward_draft_extend)."""
        bs, L = self.prompt_ids.shape
        rows = torch.arange(L, device=self.device)
        out = self.target(extend_batch(self.kv, self.prompt_ids.flatten(), rows.repeat(bs), L), self.kv,
                          self.capture_layers)
        last = torch.arange(bs, device=self.device) * L + self.prompt_lens - 1
        self.roots.copy_(next_tokens(out.logits[last], self.spec.sampling, self.tier.randoms.coin64))
        self.kv.seq_lens.copy_(self.prompt_lens)
        if self.drafter is not None:
            self.drafter.prefill(self.prompt_ids, self.prompt_lens, self.roots, features(out))

    def launch(self, reqs: list[Request]) -> dict:
        """Enqueue one step: the step's random numbers in, each launch group (a graph replay, or
        eager), then the step's tokens' copy to the host. Returns what finish_step reads."""
        tier, on_host = self.tier, self.host_drafts
        before = self.kv.seq_lens.clone() if self.recorder else None  # on the device: nothing waits
        marks = {"draft": self.run_phase("draft", lambda: self.drafter.host_draft(reqs))} if on_host else {}
        sizes = self.drafter.sizes if on_host else [tier.num_draft_tokens if self.drafter else 1] * len(reqs)
        randoms = tier.randoms.draw(reqs, sizes) if not self.spec.sampling.greedy else None
        if self.ranks_worth:
            tier.randoms.upload(tier.randoms.worth, torch.stack([self.sibling_stats[r.req_pool_idx].worth()
                                                                 for r in reqs]))
        for name, names in self.launches:
            marks[name] = self.run_phase(name, tier.graphs[name].replay if tier.graphs else self.phases(names))
        copied = self.recorder.copy_step(tier, self.kv, before) if self.recorder else None  # before the next step
        if self.device.type != "cuda":
            return {"marks": marks, "out": tier.step_out.clone(), "done": None, "copied": copied, "randoms": randoms}
        out = torch.empty(tier.step_out.shape, dtype=tier.step_out.dtype, pin_memory=True)
        out.copy_(tier.step_out, non_blocking=True)  # without waiting: finish_step waits for `done`
        done = torch.cuda.Event()
        done.record()
        return {"marks": marks, "out": out, "done": done, "copied": copied, "randoms": randoms}

    def run_phase(self, name: str, fn) -> tuple:  # one launch, on the phase clock (and in the profile's probe)
        with self.probe.phase(name) if self.probe else nullcontext():
            return self.clock.run(fn)

    @torch.no_grad()
    def finish_step(self, reqs: list[Request], launched: dict) -> None:
        """RECORD: the host's part of a launched step, once its tokens have arrived (the step's one
        sync): EOS and max_new_tokens, metrics, sibling worth, the trace."""
        if launched["done"] is not None:
            launched["done"].synchronize()
        rows = launched["out"].tolist()  # (bs, num_steps + 2 [+ 2 topk]): accept_tokens, [counts,] accept_num
        timing = {**self.clock.read(launched["marks"]), "batch_size": sum(not r.finish_reason for r in reqs)}
        host = self.recorder.host_tensors(launched["copied"]) if self.recorder else None
        adaptive = self.adaptive.step([row[-1] for row, r in zip(rows, reqs) if not r.finish_reason]) \
            if self.adaptive else None  # the explicit engine's adapt: the EMA over this step's requests
        finished = False
        for b, r in enumerate(reqs):
            if not r.finish_reason:
                self.finish_request(b, r, rows[b], launched, host, timing, adaptive)
                finished |= r.finish_reason is not None
        if self.host_drafts:  # the histories of the requests still running
            self.drafter.host_extend([(r.req_pool_idx, rows[b][:rows[b][-1] + 1]) for b, r in enumerate(reqs)
                                      if not r.finish_reason])
        if finished:
            self.set_live(reqs)
        if adaptive and adaptive["switched_to"]:  # the next step runs the new tier's graphs
            self.tier = self.tiers[adaptive["switched_to"]]
        self.step_count += 1

    def finish_request(self, b: int, r: Request, row: list[int], launched: dict, host, timing: dict, adaptive) -> None:
        """One unfinished request's tokens, metrics, sibling worth and step record."""
        num, tier = row[-1], self.tier
        committed = append_tokens(r, row[:num + 1], self.eos, self.spec.max_new_tokens)
        size = self.drafter.sizes[b] if self.host_drafts else tier.num_draft_tokens if self.drafter else 1
        self.metrics.observe(b, self.step_count, timing, len(committed), num, size - 1 if size > 1 else None, num + 1,
                             adaptive and adaptive["num_steps"])
        if self.ranks_worth:  # the walk's tries and acceptances by sibling rank rank the next trees
            counts = row[tier.num_steps + 1:-1]
            self.sibling_stats[r.req_pool_idx].add(counts[:self.spec.topk], counts[self.spec.topk:])
        if self.recorder is None:
            return
        randoms = launched["randoms"][b] if launched["randoms"] else None
        rec = self.recorder.record(self.step_count, b, r, host, row[:num + 1], randoms, committed, timing, adaptive,
                                   tier.num_steps)
        if self.trace:
            self.trace.write(rec, record_token_ids(rec))
        if self.on_step:
            self.on_step(rec)

    def set_live(self, reqs: list[Request]) -> None:
        """Which bucket rows still commit; copied without waiting for the steps already enqueued."""
        live = torch.tensor([not r.finish_reason for r in reqs] + [False] * (self.bs - len(reqs)))
        self.live.copy_(live.pin_memory() if self.device.type == "cuda" else live, non_blocking=True)

    # ---- the phases: device work only, graph-safe ------------------------------------------
    def draft(self) -> None:
        """DRAFT: the drafter's tree for every request, rooted at its last committed token (plain
        decoding: the root alone)."""
        tier = self.tier
        tier.tree = root_tree(self.roots, self.kv.seq_lens) if self.drafter is None else self.drafter.draft(
            self.roots, self.kv.seq_lens, tier.num_steps, tier.num_draft_tokens, tier.randoms)

    def verify(self) -> None:
        """VERIFY (TARGET_VERIFY): the target over every node under the tree's mask (plain
        decoding: the root, causal); with --deterministic, every node as a one-token decode (one forward)."""
        tier, tree = self.tier, self.tier.tree
        batch = decode_rows_batch(self.kv, tree, is_fused(self.target)) if self.spec.deterministic else \
            extend_batch(self.kv, tree.draft_tokens.flatten(), tree.positions.flatten(), tree.num_nodes, tree.tree_mask)
        out = self.target(batch, self.kv, self.capture_layers)
        tier.logits, tier.features = out.logits, features(out)
        tier.target_predict = torch.argmax(out.logits, dim=-1)  # ties to the lowest id, as plain decoding

    def accept(self) -> None:
        """ACCEPT: the rule's walk over every tree; accept_tokens (bs, num_steps + 1): the correct
        drafts, then the bonus at column accept_num, -1 after."""
        tier, tree = self.tier, self.tier.tree
        v = self.rule(tree, tier.logits, tier.target_predict, tier.randoms, self.spec, tier.num_steps)
        if tree.num_drafts is not None and not self.spec.sampling.greedy:  # a request that drafted nothing:
            first = tier.logits.view(self.bs, tree.num_nodes, -1)[:, 0]  # plain decoding's sample
            v.bonus = torch.where(tree.num_drafts > 0, v.bonus, next_tokens(first, self.spec.sampling,
                                                                            tier.randoms.coin64))
        W, counts = v.accept_index.shape[1], v.sibling_counts
        step_out = torch.empty(self.bs, W + 1 + (counts.shape[1] if counts is not None else 0), dtype=torch.int64,
                               device=self.device)  # accept_tokens, [sibling counts,] accept_num
        accept_tokens(step_out, v.accept_index, v.accept_num, v.bonus, tree.draft_tokens)
        if counts is not None:
            step_out[:, W:-1] = counts
        v.accept_tokens, tier.verdict, tier.step_out = step_out[:, :W], v, step_out

    def commit(self) -> None:
        """COMMIT: each live request keeps the accepted path's KV; its next root is the bonus."""
        v = self.tier.verdict
        self.kv.commit(v.accept_index, v.accept_num, self.live, self.tier.tree.num_nodes)
        self.roots.copy_(torch.where(self.live, v.bonus, self.roots))

    def extend(self) -> None:
        """EXTEND (DRAFT_EXTEND): the drafter reads the accepted tokens with the target's features."""
        tier = self.tier
        self.drafter.extend(tier.tree, tier.verdict, tier.features, self.live)
