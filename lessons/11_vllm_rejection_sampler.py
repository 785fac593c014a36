# %% [markdown]
# # 11 · vLLM's rejection sampler: greedy sentinel, recovered tokens, the exponential race
#
# **Objectives.** Run vLLM v1's `RejectionSampler` (spectrace's `compat.vllm`, the same signature)
# on vLLM's own test table; see how one batch mixes greedy and random requests; see what a
# rejected position emits (a recovered token from the residual, then placeholders); and check
# the trick vLLM samples with, argmax(p / E) for exponential noise E, against a categorical draw.
#
# **Chapter sections.** vLLM's chapter (`002`) §12.2.1, §12.3.2, §12.3.5 (segment 4).
#
# > 拒绝时，从修正分布 $p'(x) = \frac{\max(0, p(x) - q(x))}{\sum_y \max(0, p(y) - q(y))}$ 中重新采样 (《第12章 投机解码：以小博大》§12.2.1)
# > *On a rejection, resample from the corrected distribution p'(x) = max(0, p(x) - q(x)) / Σ_y max(0, p(y) - q(y)).*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## vLLM's greedy table
#
# Greedy requests compare each draft with the target's argmax; the first mismatch emits the
# argmax and the rest of the row is `PLACEHOLDER_TOKEN_ID` (-1); a fully accepted row ends with
# the bonus. The cases and expected rows are those of vLLM's `tests/v1/sample/test_rejection_sampler.py`
# (target logits +100 at the wanted token, -100 elsewhere).

# %%
import torch
from _lib import CI, expect, run

from spectrace.compat.vllm import (GREEDY_TEMPERATURE, PLACEHOLDER_TOKEN_ID, RejectionSampler, SamplingMetadata,
                                   SpecDecodeMetadata)
from spectrace.testing import chi_square

VLLM_GREEDY_CASES = [  # (drafts, what the target wants at each position then the bonus, expected row)
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, -1]]),
    ([[]], [[5]], [[5]]),
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, -1], [4, 8, -1, -1]]),
]
sampler = RejectionSampler()
greedy_rows = []
for drafts, wanted, _ in VLLM_GREEDY_CASES:
    rows = [t for tokens in wanted for t in tokens[:-1]]
    logits = torch.full((len(rows), 100), -100.0)
    logits[torch.arange(len(rows)), rows] = 100.0
    bonus = torch.tensor([[tokens[-1]] for tokens in wanted])
    out = sampler(SpecDecodeMetadata.make_dummy(drafts, "cpu"), None, logits, bonus,
                  SamplingMetadata(temperature=None, all_greedy=True, all_random=False))
    greedy_rows.append(out.tolist())
    print(f"drafts {drafts} target {wanted} -> {out.tolist()}")

# %% [markdown]
# ## One batch, greedy and random requests together (002 §12.3.5)
#
# vLLM marks a greedy request inside a mixed batch with temperature `GREEDY_TEMPERATURE` (-1).
# The random request's row is exactly what it gets alone with the same seeded generator:
# requests do not share random numbers.

# %%
g = torch.Generator().manual_seed(2)
logits = torch.randn(4, 4, generator=g)
drafts = [[int(logits[0].argmax()), 0], [1, 2]]
mixed = sampler(SpecDecodeMetadata.make_dummy(drafts, "cpu"), None, logits, torch.tensor([[5], [6]]),
                SamplingMetadata(torch.tensor([float(GREEDY_TEMPERATURE), 1.0]), all_greedy=False, all_random=False,
                                 generators={1: torch.Generator().manual_seed(9)}))
alone = sampler(SpecDecodeMetadata.make_dummy(drafts[1:], "cpu"), None, logits[2:], torch.tensor([[6]]),
                SamplingMetadata(torch.tensor([1.0]), False, True, generators={0: torch.Generator().manual_seed(9)}))
print("mixed batch:", mixed.tolist(), " the random request alone:", alone.tolist())

# %% [markdown]
# ## The exponential race (002 §12.3.2)
#
# vLLM draws from p without a cumulative sum: with E_i independent Exp(1), argmax_i p_i / E_i is
# distributed as p (the smallest of E_i / p_i, exponentials of rates p_i, is i with probability
# p_i). Its recovered tokens use the same race over the residual (p - q)+. Vectorised over many
# draws, the chi-square test cannot tell the race from p:

# %%
p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05], dtype=torch.float64)
n = 20_000 if CI else 200_000
noise = torch.empty(n, 5, dtype=torch.float64).exponential_(generator=torch.Generator().manual_seed(0))
race = torch.argmax(p / noise, dim=1)
stat, crit = chi_square(torch.bincount(race, minlength=5), p)
wrong = torch.argmax(p * noise, dim=1)  # a plausible typo: multiply by the noise
stat_wrong, _ = chi_square(torch.bincount(wrong, minlength=5), p)
print(f"argmax(p / E): chi2 {stat:.1f}; argmax(p * E): chi2 {stat_wrong:.1f}; critical {crit:.1f}")

# %% [markdown]
# ## What a rejected position emits
#
# With the draft's q (a model drafter), a rejected position emits a token from (p - q)+; with no
# q (n-gram and other argmax drafts, `draft_probs=None`), vLLM takes q as one-hot on the draft,
# so the recovered token is drawn from p with the draft removed. Either way the row then holds
# placeholders: later drafts were conditioned on a token that is no longer there.

# %%
target = torch.log(torch.tensor([[0.05, 0.6, 0.3, 0.05], [0.25, 0.25, 0.25, 0.25]]))
rows = {}
for seed in range(200):
    out = sampler(SpecDecodeMetadata.make_dummy([[0, 3]], "cpu"), None, target, torch.tensor([[2]]),
                  SamplingMetadata(torch.ones(1), False, True, generators={0: torch.Generator().manual_seed(seed)}))
    rows.setdefault(tuple(out[0].tolist()), 0)
    rows[tuple(out[0].tolist())] += 1
print("rows over 200 seeds (draft 0 has p 0.05):", dict(sorted(rows.items(), key=lambda kv: -kv[1])))

# %% [markdown]
# ## Live: spectrace's `vllm` rule
#
# `--acceptance vllm` is this sampler's walk inside the engine: a standalone chain at temperature 1.

# %%
result, trace = run("11_vllm", algo="standalone", temperature=1.0, acceptance="vllm", seed=0)
rec = trace.step(0)
print(f"step 0: decisions {[(d['node'], d['accepted']) for d in rec['accept']['decisions']]}, "
      f"bonus drawn from {(rec['accept']['bonus_from'] or {}).get('dist')}")
print(f"tau {result.metrics['accept_length']:.3f}, per-position acceptance "
      f"{result.metrics['vllm']['per_position_acceptance_rate']}")

# %% [markdown]
# ## Check yourself

# %%
# vLLM's greedy table
assert greedy_rows == [expected for *_, expected in VLLM_GREEDY_CASES] and PLACEHOLDER_TOKEN_ID == -1
# a mixed batch: the greedy row follows the argmax rule, the random row equals its run alone
argmax = logits[:2].argmax(-1).tolist()
assert mixed[0].tolist()[:2] == argmax and mixed[1].tolist() == alone[0].tolist()
# the race samples p; the typo does not
assert stat < crit < stat_wrong
# the first draft (token 0) accepted: the row goes on; rejected: a recovered token that is never
# the draft (q one-hot on it), then placeholders
assert all((row[0] == 0) == (row[1] != -1) for row in rows)
assert all(row[1:] == (-1, -1) for row in rows if row[0] != 0) and len(rows) > 2
expect("11", "tau_vllm_standalone_t1", result.metrics["accept_length"])
print("all checks passed")
