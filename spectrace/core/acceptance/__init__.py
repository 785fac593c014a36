"""Acceptance rules: one module each, one signature, one registry (`RULES`, chosen with
--acceptance).

    greedy          temperature 0: draft == argmax p                      (greedy.py, trees)
    target_only     SGLang's tree sampling with thresholds                (target_only.py, trees)
    rejection       SGLang's chain rejection sampling, coin * q < p       (rejection.py, chains)
    vllm            vLLM's rejection sampler, p / q >= u, recovered tokens (vllm.py, chains)
    tree_rejection  lossless sampling on trees, recursive rejection       (tree_rejection.py, trees)
    typical         Medusa's typical acceptance, entropy threshold, lossy (typical.py, trees)

Every rule is a walk over one request's verified tree with the signature

    walk(candidates, retrive_next_token, retrive_next_sibling, target_predict, target_probs,
         draft_probs, randoms, max_depth, params) -> AcceptResult

    candidates            (n,) node tokens, root (the last committed token) first
    retrive_next_token    (n,) each node's first child, -1 for none      (SGLang's linked lists)
    retrive_next_sibling  (n,) each node's next sibling, -1 for none
    target_predict        (n,) argmax of the target's logits after each node
    target_probs          (n, V) float32 p after each node (temperature, top-k, top-p applied)
    draft_probs           (n-1, V) the q node j+1 was drawn from, or None (drafts not sampled)
    randoms               the request's random numbers, drawn by the rule's `draw` (below)
    max_depth             the most drafts a walk may accept (num_steps)
    params                thresholds and how much of each distribution the trace keeps

and reads what it needs of them. Randomness is drawn before the walk, in the order the peers'
kernels consume it, so a kernel twin given the same tensors decides the same way.

Naming (SGLang's, kept across spectrace):
    correct_drafts  the drafts the rule accepted, bonus excluded
    bonus_token     the target's own token after the last correct draft (the "+1")
    accept_tokens   correct_drafts + [bonus_token]: what enters the sequence
    accept_len      len(correct_drafts) + 1, the bonus included
SGLang's `accept_length` / `accept_token_num` tensors and vLLM's `num_accepted_tokens` count the
correct drafts only, without the bonus: one less than accept_len. SGLang's `accept_index` is
`accept_nodes` here (flat rows there, tree nodes here).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from spectrace.algos import ALGOS
from spectrace.core.ranges import check_ranges
from spectrace.core.sampling import topk_pairs
from spectrace.errors import SpectraceError


@dataclass
class AcceptResult:
    correct_drafts: list[int]  # drafts the rule accepted, bonus excluded
    bonus_token: int  # the target's +1 after the last correct draft
    accept_nodes: list[int] = field(default_factory=list)  # tree nodes of the path, root (0) first
    decisions: list[dict] = field(default_factory=list)  # every node the walk looked at
    bonus_from: dict | None = None  # sampling rules: the distribution the bonus was drawn from

    @property
    def accept_tokens(self) -> list[int]:  # what enters the sequence: correct drafts + bonus
        return self.correct_drafts + [self.bonus_token]

    @property
    def accept_len(self) -> int:
        return len(self.correct_drafts) + 1


@dataclass
class Randoms:
    """One request's random numbers for one verify. SGLang draws `coins = rand_like(candidates)`
    and then one final coin per request; vLLM samples the bonus first (an exponential race), then
    one float64 uniform per draft and one noise vector for recovered tokens. A rule reads its
    own."""

    coins: torch.Tensor | None = None  # (n,) float32: SGLang's uniform_samples row
    coin_final: torch.Tensor | None = None  # () float32: uniform_samples_for_final_sampling
    # (V,) float32 Exp(1): vLLM's Sampler, bonus = argmax(p / noise)
    bonus_noise: torch.Tensor | None = None
    uniforms: torch.Tensor | None = None  # (n-1,) float64: vLLM's uniform_probs
    # (V,) float32 1 / Exp(1): vLLM's noise of the recovered tokens
    inv_q: torch.Tensor | None = None


def sglang_coins(n: int, vocab: int, gen: torch.Generator | None) -> Randoms:
    """SGLang's verify coins for one request: a float32 coin per node, then the final coin."""
    coins = torch.rand(n, generator=gen)
    return Randoms(coins=coins, coin_final=torch.rand((), generator=gen))


@dataclass(frozen=True)
class RuleParams:
    threshold_single: float = 1.0  # target_only: accept a draft whose p reaches this
    threshold_acc: float = 1.0  # target_only: accept with probability min(1, p / this)
    trace_topk: int = 5  # tokens the trace keeps of each distribution


def decision(node: int, draft: int, accepted: bool, rule: str, **numbers) -> dict:
    """One node the walk looked at, for the trace: its numbers rounded as the trace keeps them."""
    return {"node": node, "draft": draft, "accepted": bool(accepted),
            **{k: round(float(v), 6) if isinstance(v, (float, np.floating)) else v
               for k, v in numbers.items()},
            "rule": rule}


def bonus_from(dist: str, node: int, weights: torch.Tensor, k: int, **numbers) -> dict:
    """Where the bonus was drawn from: `dist` (target, residual, typical) after `node`, with the
    top k of the (unnormalised) weights, normalised for the reader."""
    total = float(weights.sum())
    return {"dist": dist, "node": node, **{n: round(float(v), 6) for n, v in numbers.items()},
            "topk": topk_pairs(weights.float() / max(total, 1e-30), k)}


@dataclass(frozen=True)
class Rule:
    name: str
    walk: Callable[..., AcceptResult]  # the signature above
    draw: Callable[[int, int, torch.Generator | None], Randoms]  # (n nodes, vocab, generator)
    samples_drafts: bool = False  # the drafter samples drafts from q and keeps q (draft_probs)
    # refuses drafts without a draft distribution (copied n-grams, argmax blocks)
    needs_q: bool = False
    chains_only: bool = False  # verifies a chain (topk 1)


def default_rule(temperature: float) -> str:
    """SGLang's choice: greedy at temperature 0, target_only otherwise."""
    return "greedy" if temperature == 0.0 else "target_only"


def check(rule: str, algo: str, topk: int, temperature: float, threshold_single: float,
          threshold_acc: float) -> None:
    """One clear line for a combination the engines refuse (or that would silently do nothing)."""
    if rule not in RULES:
        raise SpectraceError(f"unknown --acceptance {rule!r} (choose from {', '.join(RULES)})")
    check_ranges(threshold_single=threshold_single, threshold_acc=threshold_acc,
                 temperature=temperature)
    if algo == "none":
        return
    r, a = RULES[rule], ALGOS[algo]
    if rule == "greedy" and temperature > 0:
        raise SpectraceError("--acceptance greedy needs --temperature 0 (sampling rules: "
                             "target_only, rejection, vllm, tree_rejection, typical)")
    if rule != "greedy" and temperature == 0:
        raise SpectraceError(f"--acceptance {rule} samples: give --temperature > 0")
    if rule != "target_only" and (threshold_single, threshold_acc) != (1.0, 1.0):
        raise SpectraceError(f"the accept thresholds belong to target_only; "
                             f"--acceptance {rule} needs both at 1.0")
    if r.chains_only and topk != 1:
        raise SpectraceError(f"--acceptance {rule} verifies a chain: it needs --topk 1 "
                             f"(tree_rejection samples trees losslessly)")
    if r.samples_drafts and a.drafts == "static":
        raise SpectraceError(f"--acceptance {rule} needs drafts sampled from q; Medusa's static "
                             f"tree takes each head's top-k (use target_only or typical)")
    if r.needs_q and a.drafts == "fixed":
        what = ("n-gram drafts are copied" if algo == "ngram" else
                "DFLASH drafts are the argmax of a block, as in SGLang")
        raise SpectraceError(f"--acceptance {rule} needs drafts sampled from a draft model's q; "
                             f"{what} (use target_only, or vllm, which takes them as one-hot)")
    if rule == "rejection" and not a.eagle_worker:
        raise SpectraceError(f"SGLang allows rejection sampling only for EAGLE / EAGLE3 (and "
                             f"NEXTN, MTP), not --algo {algo}")


# The registry. The rule modules import AcceptResult and friends from this package, so they are
# imported here, after those are defined.
# noqa: E402
from spectrace.core.acceptance import greedy, rejection, target_only, tree_rejection, typical, vllm

RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("greedy", greedy.greedy_walk, lambda n, vocab, gen: Randoms()),
    Rule("target_only", target_only.target_only_walk, sglang_coins),
    Rule("rejection", rejection.rejection_walk, sglang_coins, samples_drafts=True, needs_q=True,
         chains_only=True),
    Rule("vllm", vllm.vllm_accept, vllm.draw, samples_drafts=True, chains_only=True),
    Rule("tree_rejection", tree_rejection.tree_rejection_walk, sglang_coins, samples_drafts=True,
         needs_q=True),
    Rule("typical", typical.typical_walk, typical.draw),
)}

# backend -> rule name -> the rule's kernel walk: (device, the walk's arguments) -> (accept_nodes,
# bonus_token). The engine still runs the explicit walk, whose decisions the trace records, and
# requires the kernel to reach the same path and bonus. kernels/backend.py adds "triton".
TWIN_WALKS: dict[str, dict[str, Callable]] = {"explicit": {}}
