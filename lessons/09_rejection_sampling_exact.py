# %% [markdown]
# # 09 · Rejection sampling is exact: the proof, then the chi-square test
#
# **Objectives.** Prove, with exact fractions, that speculative sampling's output follows the
# target's distribution p whatever the draft's q; check it statistically on spectrace's own rule
# code; and watch the same test catch a one-line bug in the bonus draw.
#
# **Chapter sections.** vLLM's chapter (`002`) §12.2, §12.2.1, §12.2.2; SGLang end to end (`000`)
# §7.3; SGLang's ModelRunner section (`004`) §5.
#
# > 投机解码产出的 token 分布与直接用大模型采样完全一致。 (《第12章 投机解码：以小博大》§12.2)
# > *Speculative decoding's tokens follow exactly the distribution of sampling the target directly.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## The rule (002 §12.2.1; 004 §5)
#
# Draw x ~ q; accept it with probability min(1, p(x) / q(x)); if rejected, draw from the
# residual p'(x) = max(0, p(x) - q(x)) / Σ_y max(0, p(y) - q(y)). SGLang's kernels and
# spectrace's `rejection` rule test `coin * q < p`, which is `coin < min(1, p / q)` for q > 0.
#
# ## The proof, exactly (002 §12.2.2)
#
# Pr(output = x) = q(x) min(1, p(x)/q(x)) + (1 - A) p'(x), A = Σ_y min(p(y), q(y)), the chance a
# draft is accepted. The first term is min(p(x), q(x)); since Σ_y max(0, p - q) = 1 - A, the
# second is max(0, p(x) - q(x)); their sum is p(x). With fractions, no rounding hides anything:

# %%
from fractions import Fraction as F

import torch
from _lib import CI, show

from spectrace.testing import chi_square, continuations, samples_for

p = [F(1, 2), F(1, 4), F(1, 8), F(1, 16), F(1, 16)]
q = [F(1, 10), F(2, 5), F(3, 10), F(1, 10), F(1, 10)]
A = sum(min(a, b) for a, b in zip(p, q))
residual_mass = sum(max(F(0), a - b) for a, b in zip(p, q))
output = [b * min(F(1), a / b) + (1 - A) * max(F(0), a - b) / residual_mass for a, b in zip(p, q)]
print("A =", A, " Σ max(0, p - q) =", residual_mass)
print("Pr(output = x) =", [str(o) for o in output], " p =", [str(a) for a in p])

# %% [markdown]
# ## Sampling it: the rule, and the rule with a bug
#
# The same rule vectorised over many draws, and a variant with the bug a hurried implementation
# makes: after a rejection it draws from p itself instead of the residual. Pearson's chi-square
# against p (`spectrace.testing.chi_square`, alpha 0.001) tells them apart.

# %%
def speculative_sample(p, q, n, gen, residual=True):
    """n independent single-position speculative samples: x ~ q, kept if coin * q(x) < p(x), else
    a draw from relu(p - q) (residual=False: from p, the bug)."""
    x = torch.multinomial(q.expand(n, -1), 1, replacement=True, generator=gen).squeeze(1)
    keep = torch.rand(n, generator=gen, dtype=torch.float64) * q[x] < p[x]
    fallback = (p - q).clamp(min=0) if residual else p
    redraw = torch.multinomial(fallback.expand(n, -1), 1, replacement=True, generator=gen).squeeze(1)
    return torch.where(keep, x, redraw)


pt, qt = torch.tensor([float(a) for a in p], dtype=torch.float64), torch.tensor([float(b) for b in q],
                                                                                 dtype=torch.float64)
n = 20_000 if CI else 200_000
gen = torch.Generator().manual_seed(0)
right = torch.bincount(speculative_sample(pt, qt, n, gen), minlength=5)
buggy = torch.bincount(speculative_sample(pt, qt, n, gen, residual=False), minlength=5)
(stat_right, crit), (stat_bug, _) = chi_square(right, pt), chi_square(buggy, pt)
print(f"N {n}: residual redraw chi2 {stat_right:.1f}, redraw from p chi2 {stat_bug:.1f}, critical {crit:.1f}")
print("empirical:", (right / n).tolist())
print("buggy:    ", (buggy / n).tolist())

import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 2.6))
xs = range(5)
for shift, heights, label in ((-0.27, pt, "p (target)"), (0.0, right / n, "speculative"),
                              (0.27, buggy / n, "bug: redraw from p")):
    ax.bar([x + shift for x in xs], heights.tolist(), width=0.27, label=label)
ax.set_xlabel("token")
ax.legend(fontsize=7)
fig.tight_layout()
show(fig, "09_rejection")

# %% [markdown]
# ## The engines' rules, over two tokens (000 §7.3)
#
# One position is the easy case. The test that guards spectrace's rules
# (`tests/test_acceptance.py`, through `spectrace.testing`) runs each rule's own walk over whole
# two-token continuations of a synthetic Markov model, where a rule must also get the bonus
# after a fully accepted chain right: SGLang's chain rejection, vLLM's sampler (with the draft's
# q, and with one-hot q as for argmax drafts), and SGLang's sampled trees.

# %%
rules = [("rejection", False), ("vllm", False), ("vllm", True), ("tree_rejection", False)]
verdicts = {}
for rule, one_hot in rules:
    (p0, exact), first, pairs = continuations(rule, seed=3, n=4000 if CI else None, one_hot=one_hot)
    stat, crit2 = chi_square(pairs, exact)
    verdicts[rule, one_hot] = stat < crit2
    print(f"{rule}{' (one-hot q)' if one_hot else ''}: N {int(pairs.sum())}, chi2 {stat:.1f} "
          f"(critical {crit2:.1f})")
print("samples a 2% bias needs to be caught 99 times in 100:", samples_for(exact))

# %% [markdown]
# ## Check yourself

# %%
# the proof: every token exactly as likely as under p; the residual's mass is 1 - A
assert output == p and residual_mass == 1 - A
# for a coin in [0, 1), coin < min(1, p/q) is coin * q < p when q > 0 (on a grid of exact values)
coins, probs = [F(i, 8) for i in range(8)], [F(i, 8) for i in range(1, 9)]
assert all((u < min(F(1), a / b)) == (u * b < a) for u in coins for a in probs for b in probs)
# the rule passes the chi-square test; the bug fails it
assert stat_right < crit < stat_bug
# spectrace's lossless rules keep the target's two-token law
assert all(verdicts.values()), verdicts
print("all checks passed")
