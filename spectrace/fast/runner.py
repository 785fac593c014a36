"""The fast engine's device half (nano-vllm's ModelRunner beside its LLMEngine): the step's
tensors over the batch bucket, the tiers' CUDA graphs, and `step`, core/engine.py's
speculative_step in which every phase's output is an argument of the next:

    DRAFT    the drafter's trees for every request (fast/drafters/), a DeviceTree
    VERIFY   one target forward over every node under the tree's mask (QLEN_ONLY); its argmax
    ACCEPT   the rule walks every tree at once (fast/acceptance/): the verdict, and the host row
    COMMIT   the accepted path's KV slots first in each request's row (fast/kv.py), the next roots
    EXTEND   the drafter catches up on the accepted tokens (DRAFT_EXTEND)

Everything here is graph-safe: no host sync, no Python branch on a tensor's value. DRAFT,
VERIFY + ACCEPT + COMMIT and EXTEND are each a CUDA graph captured from `step`
(fast/graphs.py: launch_groups), as SGLang captures the draft loop, the verify and the draft
extend; the prefill is one too. On a CPU the step runs eagerly.
"""
from __future__ import annotations

from functools import partial

import torch

from spectrace.core.spec import SpecConfig
from spectrace.fast.acceptance import (FAST_RULES, Verdict, greedy, host_row, plain_sample,
                                       sample_undrafted)
from spectrace.fast.batch import PromptBuffers, decode_rows_batch, extend_batch, features
from spectrace.fast.graphs import (Phase, PhaseClock, PhaseGroups, StepOutputs, Tier, capture,
                                   capture_step, eager, launch_groups)
from spectrace.fast.kv import StaticKV
from spectrace.fast.sampling import next_tokens
from spectrace.fast.tree import DeviceTree, root_tree
from spectrace.kernels.fused import is_fused


class PlainDecoding:
    """The drafter of --algo none: the root alone, nothing to prefill, extend or reset."""

    kv, capture_layers, drafts_on_host, samples_drafts = None, (), False, False

    def reset(self) -> None:
        pass

    def prefill(self, prompt_ids, prompt_lens, roots, features) -> None:
        pass

    def draft(self, roots: torch.Tensor, seq_lens: torch.Tensor, num_steps: int,
              num_draft_tokens: int, randoms) -> DeviceTree:
        return root_tree(roots, seq_lens)


class StepRunner:
    def __init__(self, target, kv: StaticKV, spec: SpecConfig, drafter, tiers: dict[int, Tier],
                 longest_prompt: int, probe=None):
        """drafter: a fast/drafters/ drafter or None (--algo none: PlainDecoding); tiers: each
        step shape's buffers (FastEngine); probe: bench --profile's, each phase then a launch of
        its own."""
        self.target, self.kv, self.spec, self.tiers = target, kv, spec, tiers
        self.device, self.bs = kv.seq_lens.device, kv.seq_lens.shape[0]
        self.drafter = drafter or PlainDecoding()
        # the rule's walk over every tree; plain decoding: the root's argmax, or a sample of p
        plain = greedy if spec.sampling.greedy else plain_sample
        self.rule = FAST_RULES[spec.acceptance] if drafter else plain
        self.extends = drafter is not None and not drafter.drafts_on_host  # EXTEND is device work
        self.launches = launch_groups(drafter, probe is not None)
        self.prompts = PromptBuffers.empty(self.bs, longest_prompt, self.device)
        # each request's last token
        self.roots = torch.zeros(self.bs, dtype=torch.int64, device=self.device)
        self.live = torch.zeros(self.bs, dtype=torch.bool, device=self.device)
        # the first token's draw, staged by FastEngine
        self.first_randoms = tiers[spec.num_steps].randoms

    def capture(self, recorder) -> None:
        """The prefill graph, then each tier's step, a graph per launch group (a recording run's
        pack in the last: recorder.launch_groups), in one memory pool as SGLang's and nano-vllm's;
        the KV reset after the captures."""
        pool = torch.cuda.graph_pool_handle()
        self.prompts.graph = capture(self.prefill_forward, pool=pool)
        for tier in self.tiers.values():
            step = recorder.packed(partial(self.step, tier), tier)
            groups = recorder.launch_groups(self.launches)
            tier.graphs, tier.outputs = capture_step(step, groups, pool=pool)
        self.reset()

    def reset(self) -> None:
        """Every request's KV empty (before a run, and after the captures, which wrote into it)."""
        self.kv.reset()
        self.drafter.reset()

    def prefill(self) -> list[int]:
        """The prefill (its graph, or eagerly): each request's first token, on the host (the
        prefill's one sync)."""
        (self.prompts.graph.replay if self.prompts.graph else self.prefill_forward)()
        return self.roots.tolist()

    def prefill_forward(self) -> None:
        """Target EXTEND over every prompt (causal, L rows a request); each request's first token
        is the next token after its last real row; then the drafter aligns itself with the prompt
        (SGLang's forward_draft_extend)."""
        bs, L = self.prompts.ids.shape
        rows = torch.arange(L, device=self.device).repeat(bs)  # each prompt's positions
        batch = extend_batch(self.kv, self.prompts.ids.flatten(), rows, L)
        out = self.target(batch, self.kv, self.drafter.capture_layers)
        last = torch.arange(bs, device=self.device) * L + self.prompts.lens - 1
        coins = self.first_randoms.coin64
        self.roots.copy_(next_tokens(out.logits[last], self.spec.sampling, coins))
        self.kv.seq_lens.copy_(self.prompts.lens)
        self.drafter.prefill(self.prompts.ids, self.prompts.lens, self.roots, features(out))

    def launch(self, tier: Tier, clock: PhaseClock, marks: dict) -> StepOutputs:
        """One step enqueued: its launch groups' graph replays, or the step eagerly, each on the
        clock."""
        if tier.graphs:
            for name, graph in tier.graphs.items():
                with clock.timed(marks, name):
                    graph.replay()
            return tier.outputs
        return self.step(tier, PhaseGroups(self.launches, lambda name: clock.timed(marks, name)))

    def set_live(self, live: list[bool]) -> None:
        """Which bucket rows still commit; copied without waiting for the steps already
        enqueued."""
        rows = torch.tensor(live + [False] * (self.bs - len(live)))
        rows = rows.pin_memory() if self.device.type == "cuda" else rows
        self.live.copy_(rows, non_blocking=True)

    # ---- the step --------------------------------------------------------------------------
    def step(self, tier: Tier, phase=eager) -> StepOutputs:
        """DRAFT -> VERIFY -> ACCEPT -> COMMIT -> EXTEND for the whole bucket (core/engine.py:
        Engine.speculative_step). `phase(Phase)`: the context each phase runs in, which gathers the
        phases into their launch groups (fast/graphs.py: a CUDA graph each, or an eager launch)."""
        with phase(Phase.DRAFT):
            tree = self.drafter.draft(self.roots, self.kv.seq_lens, tier.num_steps,
                                      tier.num_draft_tokens, tier.randoms)
        with phase(Phase.VERIFY):
            logits, target_predict, feats = self.verify(tree)
        with phase(Phase.ACCEPT):
            verdict = self.accept(tree, logits, target_predict, tier)
            verdict, row = host_row(verdict, tree.draft_tokens)
        with phase(Phase.COMMIT):
            self.commit(tree, verdict)
        if self.extends:
            with phase(Phase.EXTEND):
                self.drafter.draft_extend(tree, verdict, feats, self.live)
        return StepOutputs(tree, logits, target_predict, feats, verdict, row)

    def verify(self, tree: DeviceTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """VERIFY (TARGET_VERIFY): the target over every node under the tree's mask (plain
        decoding: the root, causal; --deterministic: every node a one-token decode, in one forward)
        -> logits (bs * n, V), their argmax (ties to the lowest id, as plain decoding's), the
        features."""
        if self.spec.deterministic:
            batch = decode_rows_batch(self.kv, tree, is_fused(self.target))
        else:
            batch = extend_batch(self.kv, tree.draft_tokens.flatten(), tree.positions.flatten(),
                                 tree.num_nodes, tree.tree_mask)
        out = self.target(batch, self.kv, self.drafter.capture_layers)
        return out.logits, torch.argmax(out.logits, dim=-1), features(out)

    def accept(self, tree: DeviceTree, logits: torch.Tensor, target_predict: torch.Tensor,
               tier: Tier) -> Verdict:
        """ACCEPT: the rule's walk over every tree (a request that drafted nothing: a plain
        sample)."""
        v = self.rule(tree, logits, target_predict, tier.randoms, self.spec, tier.num_steps)
        return sample_undrafted(v, tree, logits, self.spec, tier.randoms.coin64)

    def commit(self, tree: DeviceTree, verdict: Verdict) -> None:
        """COMMIT: each live request keeps the accepted path's KV; its next root is the bonus."""
        self.kv.commit(verdict.accept_index, verdict.accept_num, self.live, tree.num_nodes)
        self.roots.copy_(torch.where(self.live, verdict.bonus, self.roots))
