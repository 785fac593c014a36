"""The fast engine (`--backend fast`): core/engine.py's speculative step with the whole batch on
the device, the Triton twins for attention, tree build and the walks, and CUDA graphs as SGLang
captures them. `step` is core's speculative_step, each phase's output an argument of the next:

    DRAFT    the drafter's trees for every request (fast/drafters/), a DeviceTree
    VERIFY   one target forward over every node under the tree's mask (QLEN_ONLY); the target's argmax
    ACCEPT   the rule walks every tree at once (fast/acceptance/): the verdict, and the host row
    COMMIT   the accepted path's KV slots first in each request's row (fast/kv.py), the next roots
    EXTEND   the drafter catches up on the accepted tokens (DRAFT_EXTEND)
    RECORD   on the host, after the step's one sync: EOS and lengths, metrics, the step's trace frame

A step's state is tensors over the batch bucket, (bs, ...), on the device. DRAFT, VERIFY + ACCEPT +
COMMIT and EXTEND are each a CUDA graph captured from `step` (fast/graphs.py: launch_groups), as
SGLang captures the draft loop, the verify and the draft extend; prefill is one too. Finished
requests stay in their row, frozen: `live` masks their commits. On a CPU the step runs eagerly.
"""
from __future__ import annotations

import time
from functools import partial

import torch

from spectrace.core.acceptance import RULES
from spectrace.core.adaptive import AdaptiveSpeculativeParams
from spectrace.core.engine import Request, append_tokens
from spectrace.core.metrics import SpecMetrics
from spectrace.core.probs import ProbsRecorder
from spectrace.core.sampling import request_generator
from spectrace.core.spec import SpecConfig
from spectrace.core.trace import TraceWriter
from spectrace.errors import SpectraceError
from spectrace.fast.acceptance import FAST_RULES, Verdict, greedy, host_row, plain_sample, sample_undrafted
from spectrace.fast.batch import PromptBuffers, decode_rows_batch, extend_batch, features
from spectrace.fast.acceptance.tree_rejection import SiblingRanks
from spectrace.fast.graphs import (Launched, Phase, PhaseClock, PhaseGroups, StepOutputs, Tier, capture,
                                   capture_step, eager, launch_groups, to_host, with_record)
from spectrace.fast.kv import StaticKV
from spectrace.fast.sampling import DeviceRandoms, next_tokens
from spectrace.fast.step_record import Kept, StepRecorder
from spectrace.fast.tree import DeviceTree, root_tree
from spectrace.kernels.fused import is_fused


class FastEngine:
    def __init__(self, target, kv: StaticKV, spec: SpecConfig, drafter, prompt_ids: list[list[int]],
                 eos_token_ids, trace: TraceWriter | None = None, on_step=None,
                 probs: ProbsRecorder | None = None, graphs: bool | None = None, probe=None):
        """kv: the target's static KV over the batch bucket, sized for every request (engines.py:
        build_engine); drafter: a fast/drafters/ drafter or None (--algo none); graphs: capture CUDA
        graphs (default: on a GPU); probe: bench --profile's, each phase then a launch of its own."""
        self.target, self.kv, self.spec, self.drafter = target, kv, spec, drafter
        self.eos, self.device, self.bs = set(eos_token_ids), kv.seq_lens.device, kv.seq_lens.shape[0]
        # the rule's walk over every tree; plain decoding (no drafter): the root's argmax, or a sample of p
        self.rule = (FAST_RULES[spec.acceptance] if drafter else
                     greedy if spec.sampling.greedy else plain_sample)
        self.recorder = StepRecorder(spec, drafter, kv, probs, trace, on_step) if trace or on_step else None
        self.adaptive = AdaptiveSpeculativeParams(spec.num_steps) if spec.adaptive else None
        randoms = DeviceRandoms(RULES[spec.acceptance], self.bs, spec.topk, target.config.vocab_size,
                                drafter is not None and drafter.samples_drafts, self.device)
        self.tiers = {steps: Tier(steps, n, randoms.for_shape(steps, n)) for steps, n in spec.tiers}
        self.tier = self.tiers[spec.num_steps]  # adaptive: the tier it starts from
        self.prompts = PromptBuffers.empty(self.bs, max(len(p) for p in prompt_ids), self.device)
        self.roots = torch.zeros(self.bs, dtype=torch.int64, device=self.device)  # each request's last token
        self.live = torch.zeros(self.bs, dtype=torch.bool, device=self.device)
        self.metrics = SpecMetrics(spec.max_steps, spec.num_draft_tokens)
        self.step_count, self.clock, self.sibling_ranks = 0, PhaseClock(self.device, probe), None
        self.launches = launch_groups(drafter, probe is not None)
        self.capture_layers = drafter.capture_layers if drafter is not None else ()
        self.host_drafts = drafter is not None and drafter.drafts_on_host  # DRAFT on the host first (n-gram)
        if graphs if graphs is not None else self.device.type == "cuda":
            self.capture()

    def capture(self) -> None:
        """The prefill graph, then each tier's step, a graph per launch group (a recording run's pack
        in the last), in one memory pool as SGLang's and nano-vllm's; the KV reset after the captures."""
        self.prompts.graph = capture(self.prefill_forward, pool=(pool := torch.cuda.graph_pool_handle()))
        for tier in self.tiers.values():
            step, groups = partial(self.step, tier), self.launches
            if self.recorder:
                step, groups = self.recorder.packed(step, tier), with_record(groups)
            tier.graphs, tier.outputs = capture_step(step, groups, pool=pool)
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
        frozen) but where n-gram's drafts, an adaptive tier or tree_rejection's trees follow it, and
        where the step in flight may finish every request (`may_finish_all`)."""
        reqs = [Request(i, list(p), gen=request_generator(self.spec.seed, i)) for i, p in enumerate(prompts)]
        self.sibling_ranks = SiblingRanks.of(reqs, self.spec, self.drafter)
        t0 = time.perf_counter()
        try:
            self.prefill(reqs)
            pending = self.launch(reqs) if any(not r.finish_reason for r in reqs) else None
            overlap = not self.adaptive and not self.sibling_ranks and not self.host_drafts
            while pending is not None:
                ahead = self.launch(reqs) if overlap and not self.may_finish_all(reqs) else None
                self.finish_step(reqs, pending)
                pending = None if all(r.finish_reason for r in reqs) else ahead or self.launch(reqs)
            if self.device.type == "cuda":  # a step launched ahead finishes inside the measured time
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        finally:  # also when interrupted: the records of the steps kept so far (records_s: their time)
            built = self.recorder.finish() if self.recorder else {}
        return reqs, {**self.metrics.summary(wall), "per_request": [self.metrics.per_request(r.req_pool_idx)
                                                                    for r in reqs], **built}

    def may_finish_all(self, reqs: list[Request]) -> bool:
        """Whether the step in flight (up to num_steps + 1 tokens a request) may reach max_new_tokens
        for every request still running: a step launched ahead would then run frozen, for nothing
        (a whole step at a real shape, where the host's wait for the last one costs microseconds)."""
        most = self.tier.num_steps + 1
        return all(r.finish_reason or self.spec.max_new_tokens - len(r.output_ids) <= most for r in reqs)

    @torch.no_grad()
    def prefill(self, reqs: list[Request]) -> None:
        """The prompts into the static buffers (a padding row: one token), the prefill, each first token."""
        if len(reqs) > self.bs or max(len(r.prompt_ids) for r in reqs) > self.prompts.ids.shape[1]:
            raise SpectraceError("FastEngine.generate takes the prompts the engine was built for")
        self.reset()
        self.prompts.fill(reqs)
        if not self.spec.sampling.greedy:  # the first token's draw, as plain decoding's
            self.tier.randoms.stage_first(reqs)
        t0 = time.perf_counter()
        (self.prompts.graph.replay if self.prompts.graph else self.prefill_forward)()
        first, ms = self.roots.tolist(), round((time.perf_counter() - t0) * 1000, 3)
        for r, t in zip(reqs, first):
            append_tokens(r, [t], self.eos, self.spec.max_new_tokens)
            self.metrics.observe_prefill(r.req_pool_idx, ms)
        if self.recorder:
            self.recorder.write_prefill(reqs, first, ms)
        self.set_live(reqs)
        if self.host_drafts:
            self.drafter.host_prefill(reqs)

    def prefill_forward(self) -> None:
        """Target EXTEND over every prompt (causal, L rows a request); each request's first token
        is the next token after its last real row; then the drafter aligns itself with the prompt
        (SGLang's forward_draft_extend)."""
        bs, L = self.prompts.ids.shape
        rows = torch.arange(L, device=self.device).repeat(bs)  # each prompt's positions
        batch = extend_batch(self.kv, self.prompts.ids.flatten(), rows, L)
        out = self.target(batch, self.kv, self.capture_layers)
        last = torch.arange(bs, device=self.device) * L + self.prompts.lens - 1
        self.roots.copy_(next_tokens(out.logits[last], self.spec.sampling, self.tier.randoms.coin64))
        self.kv.seq_lens.copy_(self.prompts.lens)
        if self.drafter is not None:
            self.drafter.prefill(self.prompts.ids, self.prompts.lens, self.roots, features(out))

    def launch(self, reqs: list[Request]) -> Launched:
        """Enqueue one step: its host inputs staged (n-gram's trees, the random numbers), its launch
        groups (graph replays, or the step eagerly), then its host row's copy to the host."""
        tier, marks = self.tier, {}
        if self.host_drafts:
            with self.clock.timed(marks, "draft"):
                self.drafter.host_draft(reqs)
        sizes = list(self.drafter.sizes) if self.host_drafts else [tier.num_draft_tokens] * len(reqs)
        worth = self.sibling_ranks.worth(reqs) if self.sibling_ranks else None
        randoms = tier.randoms.stage(reqs, sizes, self.spec.sampling.greedy, worth)
        if tier.graphs:
            for name, graph in tier.graphs.items():
                with self.clock.timed(marks, name):
                    graph.replay()
            out = tier.outputs
        else:
            out = self.step(tier, PhaseGroups(self.launches, lambda name: self.clock.timed(marks, name)))
        copied = self.recorder.copy_step(tier, out) if self.recorder else None  # the host row comes with it
        row = to_host(out.host_row, copied.view("host_row") if copied else None)
        return Launched(marks, *row, copied, sizes, randoms)

    @torch.no_grad()
    def finish_step(self, reqs: list[Request], launched: Launched) -> None:
        """RECORD: the host's part of a launched step, once its tokens have arrived (the step's one
        sync): EOS and max_new_tokens, metrics, sibling worth, the step's frame for the trace."""
        if launched.done is not None:
            launched.done.synchronize()
        rows = launched.row.tolist()  # (bs, num_steps + 2 [+ 2 topk]): accept_tokens, [counts,] accept_num
        timing = {**self.clock.read(launched.marks), "batch_size": sum(not r.finish_reason for r in reqs)}
        adaptive = self.adaptive.step([row[-1] for row, r in zip(rows, reqs) if not r.finish_reason]) \
            if self.adaptive else None  # the explicit engine's adapt: the EMA over this step's requests
        ran = [self.finish_request(b, r, rows[b], launched, timing, adaptive)
               for b, r in enumerate(reqs) if not r.finish_reason]
        if self.recorder:
            self.recorder.keep(self.step_count, launched.copied, ran, timing, adaptive, self.tier.num_steps)
        if self.host_drafts:  # the histories of the requests still running
            self.drafter.host_extend(reqs, rows)
        if any(kept.finish_reason for kept in ran):
            self.set_live(reqs)
        if adaptive and adaptive["switched_to"]:  # the next step runs the new tier's graphs
            self.tier = self.tiers[adaptive["switched_to"]]
        self.step_count += 1

    def finish_request(self, b: int, r: Request, row: list[int], launched: Launched, timing: dict,
                       adaptive) -> Kept:
        """One unfinished request's tokens, metrics and sibling worth; what the recorder keeps of it."""
        num, tier, root = row[-1], self.tier, r.output_ids[-1]
        committed = append_tokens(r, row[:num + 1], self.eos, self.spec.max_new_tokens)
        self.metrics.observe(b, self.step_count, timing, len(committed), num, launched.sizes[b] - 1 or None,
                             num + 1, adaptive and adaptive["num_steps"])
        if self.sibling_ranks:  # the walk's tries and acceptances by sibling rank rank the next trees
            self.sibling_ranks.add(r, row[tier.num_steps + 1:-1])
        draws = launched.randoms[b] if launched.randoms else None
        return Kept(b, r.req_pool_idx, root, row[:num + 1], committed, r.finish_reason, draws)

    def set_live(self, reqs: list[Request]) -> None:
        """Which bucket rows still commit; copied without waiting for the steps already enqueued."""
        live = torch.tensor([not r.finish_reason for r in reqs] + [False] * (self.bs - len(reqs)))
        self.live.copy_(live.pin_memory() if self.device.type == "cuda" else live, non_blocking=True)

    # ---- the step: device work only, graph-safe ----------------------------------------------
    def step(self, tier: Tier, phase=eager) -> StepOutputs:
        """DRAFT -> VERIFY -> ACCEPT -> COMMIT -> EXTEND for the whole bucket (core/engine.py:
        Engine.speculative_step). `phase(Phase)`: the context each phase runs in, which gathers the
        phases into their launch groups (fast/graphs.py: a CUDA graph each, or an eager launch)."""
        with phase(Phase.DRAFT):
            tree = self.draft(tier)
        with phase(Phase.VERIFY):
            logits, target_predict, feats = self.verify(tree)
        with phase(Phase.ACCEPT):
            verdict, row = host_row(self.accept(tree, logits, target_predict, tier), tree.draft_tokens)
        with phase(Phase.COMMIT):
            self.commit(tree, verdict)
        if self.drafter is not None and not self.host_drafts:  # EXTEND is device work
            with phase(Phase.EXTEND):
                self.drafter.draft_extend(tree, verdict, feats, self.live)
        return StepOutputs(tree, logits, target_predict, feats, verdict, row)

    def draft(self, tier: Tier) -> DeviceTree:
        """DRAFT: the drafter's tree for every request, rooted at its last committed token (plain
        decoding: the root alone)."""
        if self.drafter is None:
            return root_tree(self.roots, self.kv.seq_lens)
        return self.drafter.draft(self.roots, self.kv.seq_lens, tier.num_steps, tier.num_draft_tokens,
                                  tier.randoms)

    def verify(self, tree: DeviceTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """VERIFY (TARGET_VERIFY): the target over every node under the tree's mask (plain decoding:
        the root, causal; --deterministic: every node a one-token decode, in one forward) -> logits
        (bs * n, V), their argmax (ties to the lowest id, as plain decoding's), the features."""
        if self.spec.deterministic:
            batch = decode_rows_batch(self.kv, tree, is_fused(self.target))
        else:
            batch = extend_batch(self.kv, tree.draft_tokens.flatten(), tree.positions.flatten(),
                                 tree.num_nodes, tree.tree_mask)
        out = self.target(batch, self.kv, self.capture_layers)
        return out.logits, torch.argmax(out.logits, dim=-1), features(out)

    def accept(self, tree: DeviceTree, logits: torch.Tensor, target_predict: torch.Tensor,
               tier: Tier) -> Verdict:
        """ACCEPT: the rule's walk over every tree (a request that drafted nothing: a plain sample)."""
        v = self.rule(tree, logits, target_predict, tier.randoms, self.spec, tier.num_steps)
        return sample_undrafted(v, tree, logits, self.spec, tier.randoms.coin64)

    def commit(self, tree: DeviceTree, verdict: Verdict) -> None:
        """COMMIT: each live request keeps the accepted path's KV; its next root is the bonus."""
        self.kv.commit(verdict.accept_index, verdict.accept_num, self.live, tree.num_nodes)
        self.roots.copy_(torch.where(self.live, verdict.bonus, self.roots))
