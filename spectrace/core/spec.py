"""SpecConfig: what a run's engine runs (the algorithm, the tree's shape, sampling and the
acceptance rule), checked once when made, with SGLang's defaults for what is left out."""
from __future__ import annotations

from dataclasses import dataclass

from spectrace.algos import ALGOS, DEFAULT_ALGO
from spectrace.core import acceptance
from spectrace.core.acceptance import RuleParams
from spectrace.core.adaptive import AdaptiveConfig
from spectrace.core.ranges import check_ranges
from spectrace.core.shape import draft_tokens
from spectrace.core.sampling import SamplingParams
from spectrace.core.tree import tree_capacity
from spectrace.errors import SpectraceError


@dataclass
class SpecConfig:
    """What the engine runs: the algorithm, the tree's shape, sampling and the acceptance rule.
    Checked once, when made. Drafter-only options (n-gram lookup, Medusa choices) belong to the
    drafters (spectrace/engines.py builds them)."""

    algo: str = DEFAULT_ALGO
    num_steps: int = 3  # SGLang's STANDALONE default (steps 3, topk 1, 4 draft tokens)
    topk: int = 1
    num_draft_tokens: int | None = None  # tree size incl. the root; topk 1 forces num_steps + 1
    max_new_tokens: int = 64
    commit_style: str = "sglang"
    trace_topk: int = 5  # target and draft candidates recorded per row
    # None: SGLang's default, greedy at temperature 0, else target_only
    acceptance: str | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    # SGLang's --speculative-adaptive: num_steps follows an EMA of accepted drafts
    adaptive: bool = False
    deterministic: bool = False  # batch-invariant verify and decode: each row as a one-token decode

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def rule_params(self) -> RuleParams:
        return RuleParams(self.threshold_single, self.threshold_acc, self.trace_topk)

    def __post_init__(self):
        if self.algo not in ALGOS:
            raise SpectraceError(f"unknown --algo {self.algo!r} (available: {', '.join(ALGOS)})")
        check_ranges(max_new_tokens=self.max_new_tokens, top_p=self.top_p)
        if self.acceptance is None:
            self.acceptance = acceptance.default_rule(self.temperature)
        acceptance.check(self.acceptance, self.algo, self.topk, self.temperature,
                         self.threshold_single, self.threshold_acc)
        # plain decoding: the root alone, one token a step, nothing to adapt
        if self.algo == "none":
            self.num_steps, self.num_draft_tokens, self.adaptive = 0, 1, False
            return
        check_ranges(num_steps=self.num_steps, topk=self.topk)
        if self.adaptive:
            self._check_adaptive()
        cap = tree_capacity(self.topk, self.num_steps)
        self.num_draft_tokens = draft_tokens(self.num_steps, self.topk, self.num_draft_tokens)
        if not 2 <= self.num_draft_tokens <= cap + 1:
            raise SpectraceError(
                f"--num-draft-tokens {self.num_draft_tokens} does not "
                f"fit a tree of topk {self.topk} and {self.num_steps} "
                f"steps: it holds 2 to {cap + 1} nodes (root included)")

    def _check_adaptive(self) -> None:
        """SGLang: the EAGLE worker, topk 1, and a starting num_steps among the tiers."""
        if not ALGOS[self.algo].eagle_worker:
            raise SpectraceError("--speculative-adaptive runs with EAGLE / EAGLE3 (and NEXTN, "
                                 "MTP), " f"not --algo {self.algo}")
        if self.topk != 1:
            raise SpectraceError("--speculative-adaptive switches chain lengths: it needs --topk 1")
        tiers = AdaptiveConfig().candidate_steps
        if self.num_steps not in tiers:
            raise SpectraceError(f"--speculative-adaptive starts from a "
                                 f"tier: --num-steps must be one of {tiers}")

    @property
    def tiers(self) -> list[tuple[int, int]]:
        """(num_steps, num_draft_tokens) of every step shape the run may take: each adaptive tier's
        chain, or the run's one shape (plain decoding: (0, 1)). The engines size their buffers and
        capture their graphs from these and derive none of them again."""
        if self.adaptive:
            # num_steps is one (checked)
            return [(s, s + 1) for s in AdaptiveConfig().candidate_steps]
        return [(self.num_steps, self.num_draft_tokens)]

    @property
    def max_steps(self) -> int:
        """The deepest chain or tree a step may draft: num_steps, or the top tier of adaptive
        steps."""
        return (max(AdaptiveConfig().candidate_steps + [self.num_steps]) if self.adaptive
                else self.num_steps)
