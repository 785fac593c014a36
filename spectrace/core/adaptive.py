"""Adaptive speculative steps (--speculative-adaptive): SGLang's `AdaptiveSpeculativeParams`.

An EMA of the accepted drafts per request (bonus excluded) picks the chain length among
candidate tiers, by default 1, 3 and 7 steps; every tier keeps num_draft_tokens = steps + 1.

    ema = steps - 1 at start
    after each verified batch:  ema = (1 - alpha) * ema + alpha * mean(accepted drafts per request)
    no decision in the first `warmup_batches` batches, then one every `update_interval` batches:
        step down while  ema <= lower tier - 0.5 + down_hysteresis
        step up   while  ema >  this tier  - 0.5 + up_hysteresis

With the defaults: 1 -> 3 once ema > 0.5, 3 -> 7 once ema > 2.5; 7 -> 3 once ema <= 2.25,
3 -> 1 once ema <= 0.25. A tier of s steps pays off when about s - 0.5 drafts are accepted:
the EMA asks whether the chain is used to its length. SGLang allows it for the EAGLE worker
with topk 1 only (each tier keeps its own prebuilt CUDA graphs; here they are just lengths).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spectrace.errors import SpectraceError


@dataclass
class AdaptiveConfig:
    candidate_steps: list[int] = field(default_factory=lambda: [1, 3, 7])
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0


class AdaptiveSpeculativeParams:
    def __init__(self, initial_steps: int, config: AdaptiveConfig | None = None):
        self.config = cfg = config or AdaptiveConfig()
        self.candidate_steps = sorted(set(cfg.candidate_steps) | {initial_steps})
        if len(self.candidate_steps) < 2 or self.candidate_steps[0] < 1:
            raise SpectraceError(f"adaptive steps need at least two tiers of 1 or more steps, "
                                 f"got {self.candidate_steps}")
        self.current_steps = initial_steps
        self.ema = float(initial_steps - 1)
        self.batch_count = 0

    def update(self, accepted_drafts_per_req: list[int]) -> bool:
        """Fold one verified batch into the EMA; True when current_steps changed."""
        cfg, cand = self.config, self.candidate_steps
        mean = sum(accepted_drafts_per_req) / len(accepted_drafts_per_req)
        self.ema = (1 - cfg.ema_alpha) * self.ema + cfg.ema_alpha * mean
        self.batch_count += 1
        if self.batch_count <= cfg.warmup_batches:
            return False
        if (self.batch_count - cfg.warmup_batches) % cfg.update_interval != 0:
            return False
        idx = cand.index(self.current_steps)
        while idx > 0 and self.ema <= cand[idx - 1] - 0.5 + cfg.down_hysteresis:
            idx -= 1
        while idx < len(cand) - 1 and self.ema > cand[idx] - 0.5 + cfg.up_hysteresis:
            idx += 1
        if cand[idx] == self.current_steps:
            return False
        self.current_steps = cand[idx]
        return True

    def step(self, accepted_drafts_per_req: list[int]) -> dict:
        """update(), as a step record's `adaptive` field: the tier this batch drafted, the EMA
        after it, and the tier the next step drafts if it switched (else None)."""
        used = self.current_steps
        switched = self.update(accepted_drafts_per_req)
        return {"num_steps": used, "ema": round(self.ema, 6), "batch_count": self.batch_count,
                "tiers": self.candidate_steps,
                "switched_to": self.current_steps if switched else None}
