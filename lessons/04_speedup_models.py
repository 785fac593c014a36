# %% [markdown]
# # 04 · Speed-up models: τ / (1 + r), Leviathan's closed form, and the best k
#
# **Objectives.** Compute the speed-up a speculative configuration should give from two
# numbers, say why it is below τ, find the best number of drafts k for a given acceptance and
# draft cost, and see where the independence assumption behind the closed form breaks on a
# real drafter.
#
# **Chapter sections.** SGLang end to end (`000`) §1.1, §1.2, §1.3; vLLM's chapter (`002`) §12.5,
# §12.5.1, §12.5.2, §12.5.3, §12.5.4, §12.6.2.
#
# > 实际加速 ≈ τ / (1 + r) = τ / (1 + C_draft / C_verify) (《投机解码（Speculative Decoding）端到端深挖》§1.1)
# > *Real speed-up ≈ τ / (1 + r), r = C_draft / C_verify.*
#
# > 加速比有硬上界 $\frac{1}{1-\alpha}$——这是 $c=0$、$k\to\infty$ 的极限。 (《第12章 投机解码：以小博大》§12.5.4)
# > *The speed-up has a hard ceiling of 1/(1-α): the limit at c = 0, k → ∞.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## SGLang's model: tokens earned over time paid (000 §1.1, §1.2, §1.3)
#
# A step earns τ tokens (the accepted drafts and the bonus) and costs a verify plus the drafting,
# r verify-times of it; plain decoding earns 1 token per verify-time. So the speed-up is
# τ / (1 + r), if one verify costs what one plain decode step costs and the draft extend is free
# (the two simplifications the chapter states; lesson 01's CPU numbers showed both are not quite
# true). `spectrace.core.metrics.predicted_speedup` is this formula.

# %%
from fractions import Fraction

from _lib import expect, run, show

from spectrace.core.metrics import predicted_speedup

# the chapter's table (000 §1.3): τ, r, and the speed-up it prints
CHAPTER_000 = [(3.5, 0.0, "3.5×"), (3.5, 0.2, "≈ 2.9×"), (3.5, 1.0, "≈ 1.75×"), (3.5, 3.0, "≈ 0.9×"),
               (1.2, 0.2, "≈ 1.0×")]
for tau, r, printed in CHAPTER_000:
    print(f"τ {tau}  r {r}: τ/(1+r) = {predicted_speedup(tau, r):.4f}   (the chapter: {printed})")

# %% [markdown]
# The chapter rounds 0.875 up to "≈ 0.9×": with a draft three times as costly as a verify, a
# step that earns 3.5 tokens is slower than plain decoding. And with τ = 1 (nothing accepted,
# only the bonus) every r > 0 loses.

# %% [markdown]
# ## Leviathan's closed form (002 §12.5, §12.5.1, §12.5.2, §12.5.3, §12.5.4)
#
# If each draft is accepted with the same probability α, independently, a chain of k drafts
# earns E[tokens per step] = (1 - α^{k+1}) / (1 - α), the bonus included, and costs
# T_v (1 + c k), c the cost of one draft token relative to a verify (so r = c k). Hence
#
#     speed-up(α, c, k) = (1 - α^{k+1}) / ((1 - α)(1 + c k))

# %%
def tokens_per_step(alpha, k):
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def leviathan(alpha, c, k):
    return tokens_per_step(alpha, k) / (1 + c * k)


# the chapter's worked table (002 §12.5.4): α, c, and its printed speed-ups at k = 3, 5, 7
CHAPTER_002 = [(0.75, 0.05, (2.38, 2.63, 2.67)), (0.55, 0.20, (1.26, 1.08, 0.92)),
               (0.25, 0.00, (1.33, 1.33, 1.33)), (0.75, 0.40, (1.24, 1.10, 0.95))]
print(f"{'α':>5} {'c':>5} {'k=3':>8} {'k=5':>8} {'k=7':>8} {'1/(1-α)':>8} {'best k (1-32)':>14}")
best_k = []
for alpha, c, printed in CHAPTER_002:
    values = [leviathan(alpha, c, k) for k in (3, 5, 7)]
    best = max(range(1, 33), key=lambda k: leviathan(alpha, c, k))  # up to vLLM's MAX_SPEC_LEN
    best_k.append(best)
    print(f"{alpha:>5} {c:>5} " + " ".join(f"{v:>7.4f}x" for v in values) + f" {1 / (1 - alpha):>7.2f}x {best:>14}")

# %% [markdown]
# The chapter says the best k of rows 2 and 4 is "3 or smaller": it is 2 for both. Row 3's
# acceptance is its own ceiling (1/(1-0.25) = 1.33x, even for free drafts): with c = 0 its
# speed-up only creeps towards the ceiling, and its "best k" is where float rounding stops it. vLLM caps k at
# MAX_SPEC_LEN = 32 as a safety valve, far above any best k here.

# %%
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 3.5))
ks = range(1, 13)
for alpha, c, _ in CHAPTER_002:
    line, = ax.plot(ks, [leviathan(alpha, c, k) for k in ks], marker="o", ms=3, label=f"α {alpha}, c {c}")
    ax.axhline(1 / (1 - alpha), color=line.get_color(), ls=":", lw=0.8)
ax.axhline(1, color="black", lw=0.6)
ax.set_xlabel("k (drafts per step)")
ax.set_ylabel("speed-up")
ax.legend(fontsize=7)
fig.tight_layout()
show(fig, "04_speedup_vs_k")

# %% [markdown]
# ## Does a real chain follow the closed form?
#
# The closed form assumes every position is accepted with the same α. The embedded draft LM
# drafting chains of k = 1, 2, 3 and 5 on two held-out prompts: fit α from the k = 1 run (the
# share of single drafts the target accepted, vLLM's per-position rate) and predict the tokens
# per step of the longer chains; compare with vLLM's mean acceptance length, measured.

# %%
from spectrace.zoo.prompts import HELD_OUT_PROMPTS  # noqa: E402

measured = {}
for k in (1, 2, 3, 5):
    accepted = drafts = 0
    for i, prompt in enumerate(HELD_OUT_PROMPTS[:2]):
        result, _ = run(f"04_chain_k{k}_{i}", algo="standalone", topk=1, num_steps=k, prompts=[prompt])
        v = result.metrics["vllm"]
        accepted, drafts = accepted + v["num_accepted_tokens"], drafts + v["num_drafts"]
    measured[k] = 1 + accepted / drafts  # vLLM's mean acceptance length: tokens per drafted step
alpha_fit = measured[1] - 1
print(f"α fitted from k = 1: {alpha_fit:.3f}")
print(f"{'k':>3} {'measured tokens/step':>21} {'closed form':>12}")
for k, tokens in measured.items():
    print(f"{k:>3} {tokens:>21.3f} {tokens_per_step(alpha_fit, k):>12.3f}")

# %% [markdown]
# Two prompts of 24 tokens are few steps, so read the comparison loosely: the closed form lands
# near the short chains and above the longest one. A draft deep in a chain is conditioned on
# earlier guesses of a weaker model, and vLLM's per-position acceptance rates fall with the
# position (lesson 03 plots them): α is not one number per drafter but one per position, and
# the independence behind the closed form holds only roughly.

# %% [markdown]
# ## Verify eats the batch budget (002 §12.6.2)
#
# A decoding request schedules 1 token a step; with k = 5 drafts it schedules 6. A step budget
# of max_num_batched_tokens = 4096 then covers 4096 // 6 = 682 requests instead of 4096: the
# reason speculation pays less at large batches (the batch-scaling lab, `spectrace bench
# --batch-sizes`, measures it).

# %%
budget, k = 4096, 5
print(f"requests per {budget}-token step: {budget} plain, {budget // (k + 1)} with k = {k}")

# %% [markdown]
# ## Check yourself

# %%
# the chapter's τ/(1+r) table, recomputed (0.875 is what it rounds to 0.9)
assert [round(predicted_speedup(t, r), 4) for t, r, _ in CHAPTER_000] == [3.5, 2.9167, 1.75, 0.875, 1.0]
# the chapter's Leviathan table, recomputed from the formula, agrees with what it printed
for alpha, c, printed in CHAPTER_002:
    assert [round(leviathan(alpha, c, k), 2) for k in (3, 5, 7)] == list(printed)
# the best k of rows 1, 2 and 4 ("k=5 之后基本饱和"; "3 or smaller")
assert best_k[0] == 7 and best_k[1] == 2 and best_k[3] == 2
# the closed form is the expectation it claims to be, exactly (fractions), for k = 1..8
a = Fraction(3, 5)
for n in range(1, 9):
    expectation = sum(a ** i * (1 - a) * i for i in range(n)) + a ** n * n + 1  # accepted drafts + bonus
    assert expectation == (1 - a ** (n + 1)) / (1 - a)
assert budget // (k + 1) == 682
# the live chains: a step writes at most k + 1 tokens, and a longer chain writes more a step
assert all(1 <= measured[k] <= k + 1 for k in measured)
assert measured[1] < measured[2] < measured[3] <= measured[5]
# the embedded chains' measured tokens per step (greedy: they repeat)
for k, tokens in measured.items():
    expect("04", f"chain_k{k}_tokens_per_step", tokens)
print("all checks passed")
