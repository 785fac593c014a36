# %% [markdown]
# # 10 · SGLang's stochastic paths: target_only thresholds and chain rejection
#
# **Objectives.** Read SGLang's tree rule `tree_speculative_sampling_target_only` as the
# inverse-CDF draw it is: one coin per level, the siblings' target mass accumulated until the coin
# falls under it. See its two thresholds turn a lossless rule into a lossy one, measured by the
# chi-square test, and run both stochastic paths (trees: target_only; chains: rejection sampling)
# live.
#
# **Chapter sections.** SGLang end to end (`000`) §7.1, §7.2, §7.3, §7.4, §7.5, §16 (FAQ 2 and 3).
#
# > 默认双阈值=1.0：本层按 target 概率做累积抽样；抽中某个 draft sibling 就下钻，一个都抽不中就停。
# > draft_probs 常被置零占位——主要看 target 概率，不是完整 draft-vs-target 比值。 (《投机解码（Speculative Decoding）端到端深挖》§7.2)
# > *With both thresholds at their default 1.0, each level draws cumulatively by the target's
# > probabilities: if a draft sibling is drawn, descend; if none is, stop. draft_probs is often a
# > zero placeholder: it is mainly the target's probability, not the full draft-vs-target ratio.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## sgl-kernel's own vector (000 §7.2)
#
# Two requests of six nodes, the target almost one-hot (logits 10 against 1 at temperature 0.01).
# With both thresholds at 1 the rule follows the target as greedy would; with both at 0 every
# first child is taken whatever the target says. The expected rows below are the ones in
# sgl-kernel's `test_speculative_sampling.py`, run here through `spectrace.compat.sglang`.

# %%
import torch
from _lib import CI, expect, run, show

from spectrace.compat.sglang import tree_speculative_sampling_target_only
from spectrace.testing import chi_square, continuations

candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
retrive_index = torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
next_token = torch.tensor([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
next_sibling = torch.tensor([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
logits = torch.full((2, 6, 20), 1.0)
for b, row, tok in [(0, 0, 3), (0, 3, 4), (0, 4, 5), (1, 0, 11), (1, 4, 12)]:
    logits[b, row, tok] = 10
logits[..., 18] = torch.where(logits.max(-1).values < 10, 10.0, logits[..., 18])
target_probs = torch.softmax(logits / 0.01, dim=-1)
gen = torch.Generator().manual_seed(0)
coins, coins_final = torch.rand(2, 6, generator=gen), torch.rand(2, generator=gen)

sgl_kernel_rows = {  # (threshold_single, threshold_acc) -> predicts, accept_index, accept_token_num
    (1, 1): ([3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
    (0, 0): ([1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18], [[0, 1, 2, -1], [6, 10, 11, -1]], [2, 2]),
}
ours = {}
for thresholds in sgl_kernel_rows:
    predicts = torch.full((12,), -1, dtype=torch.int32)
    accept_index = torch.full((2, 4), -1, dtype=torch.int32)
    accept_num = torch.zeros(2, dtype=torch.int32)
    tree_speculative_sampling_target_only(predicts, accept_index, accept_num, candidates, retrive_index, next_token,
                                          next_sibling, coins, coins_final, target_probs,
                                          torch.zeros_like(target_probs), *thresholds)
    ours[thresholds] = (predicts.tolist(), accept_index.tolist(), accept_num.tolist())
    print(f"thresholds {thresholds}: accept_index {ours[thresholds][1]}, accept_token_num {ours[thresholds][2]}")

# %% [markdown]
# ## One coin per level: a roulette over the siblings (000 §7.2)
#
# At a node the rule draws one coin u and walks the children in sibling order, adding each
# child's target probability to `prob_acc`; the first child with u <= prob_acc is accepted. So
# child k wins exactly when u lands in its slice of the cumulative target mass: with probability
# p(child k). If no child wins, the bonus is drawn from p with the tried children's mass removed
# (the kernel writes their p into `draft_probs`, and the residual is relu(p - draft_probs)). Over
# an even grid of coins the shares are the p's, to the grid's resolution:

# %%
p_children = torch.tensor([0.5, 0.2, 0.1])  # the target's p of the three children; 0.2 is left to the bonus
grid = (torch.arange(10_000) + 0.5) / 10_000
cumulative = p_children.cumsum(0)
won = torch.searchsorted(cumulative, grid)  # index of the first child with u <= prob_acc; 3 = none
shares = torch.bincount(won, minlength=4) / len(grid)
print("child shares:", [round(x, 4) for x in shares.tolist()], "  p:", p_children.tolist(), "+ bonus 0.2")

import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 1.4))
left = 0.0
for k, width in enumerate(p_children.tolist() + [1 - float(cumulative[-1])]):
    ax.barh(0, width, left=left, label=f"child {k + 1}" if k < 3 else "none: bonus from the residual")
    left += width
ax.set_yticks([])
ax.set_xlabel("coin u")
ax.legend(fontsize=6, ncol=4, loc="upper center", bbox_to_anchor=(0.5, 1.6))
fig.tight_layout()
show(fig, "10_roulette")

# %% [markdown]
# ## The thresholds make it lossy (000 §7.2, §16 FAQ 3)
#
# `--speculative-accept-threshold-single` accepts a child outright when its p reaches it;
# `--speculative-accept-threshold-acc` divides prob_acc by it, so the coin is beaten sooner. Both
# default to 1, where the rule is lossless. The chi-square harness runs the rule's own walk over
# two-token continuations of a small Markov model and compares the counts with the exact law.

# %%
n = 4000 if CI else 20_000
verdicts, tv = {}, {}
for kw in ({"threshold_single": 1.0, "threshold_acc": 1.0}, {"threshold_single": 1.0, "threshold_acc": 0.5}):
    (p0, exact), first, pairs = continuations("target_only", seed=3, n=n, **kw)
    stat, crit = chi_square(pairs, exact)
    verdicts[kw["threshold_acc"]] = stat < crit
    tv[kw["threshold_acc"]] = 0.5 * float((pairs / pairs.sum() - exact).abs().sum())
    print(f"threshold_acc {kw['threshold_acc']}: chi2 {stat:.1f} (critical {crit:.1f}), total variation "
          f"{tv[kw['threshold_acc']]:.3f}")

# %% [markdown]
# ## Live: a sampled tree and a sampled chain (000 §7.3)
#
# At temperature 1 SGLang verifies a tree with target_only and a chain (topk 1) with
# `chain_speculative_sampling`, classic rejection sampling that reads the draft's q. One decision
# of each, as the trace records it (the walkthrough's inspector shows the same fields):

# %%
tree_run, tree_trace = run("10_target_only", algo="eagle", topk=4, temperature=1.0, seed=0)
chain_run, chain_trace = run("10_rejection", algo="eagle", topk=1, num_steps=5, temperature=1.0, seed=0,
                             acceptance="rejection")
again, _ = run("10_target_only_again", algo="eagle", topk=4, temperature=1.0, seed=0)
for name, trace in (("target_only", tree_trace), ("rejection", chain_trace)):
    rec = trace.step(0)
    d = rec["accept"]["decisions"][0]
    print(f"{name}: step 0 accept_nodes {rec['accept']['accept_nodes']}; first decision: node {d['node']} "
          f"{'accepted' if d['accepted'] else 'rejected'} because {d['rule']}")
tau_tree, tau_chain = tree_run.metrics["accept_length"], chain_run.metrics["accept_length"]
print(f"tau: target_only tree (5,4,8) {tau_tree:.3f}, rejection chain (5,1,6) {tau_chain:.3f}")

# %% [markdown]
# > **Erratum (000 §7.4, §7.5).** The text's table rates target_only's fidelity to the target
# > as 「近似 / 依赖阈值」 (approximate / depends on the thresholds), and §7.5 calls it
# > 「默认 threshold 近似路径」 (the default-threshold approximate path). With the default
# > thresholds (1.0, 1.0) it is exact: each child is taken with probability p (the roulette above)
# > and the bonus comes from the residual; it does not read q at all, which is why it can verify a
# > deterministic top-k tree. Only thresholds below 1 make it lossy (the χ² test above).
# > spectrace's `tree_rejection` rule (lesson 12) is the tree rule that does read q.
#
# > **Erratum (this lesson, on a CPU).** These live runs sample at T = 1 on the CPU. SGLang itself
# > would not: its `_verify_uses_greedy` (speculative/eagle_utils.py) is true when the batch is all
# > greedy or the platform has no sampling verify kernel, CPU, NPU or XPU, so there it verifies
# > greedily at any temperature. The text names the same platforms (000 §7.1):
# > 「条件：is_all_greedy，或 NPU/HIP/XPU 等走 greedy 实现。」 HIP was one of them until ROCm got
# > Triton sampling kernels, and in some versions only without rejection sampling. spectrace runs
# > the rule on any device; what you see here is what SGLang does on an NVIDIA or AMD GPU.
#
# ## Check yourself

# %%
# sgl-kernel's rows, both threshold settings
assert ours == sgl_kernel_rows, ours
# one coin per level: each child wins with probability p (to the grid's 1e-4)
assert torch.allclose(shares, torch.tensor([0.5, 0.2, 0.1, 0.2]), atol=1e-4)
# lossless at (1, 1), caught at threshold_acc 0.5
assert verdicts[1.0] and not verdicts[0.5] and tv[0.5] > 0.1
# a seeded sampled run repeats exactly; its τ and the chain's are the recorded ones
assert again.texts == tree_run.texts and again.metrics["accept_length"] == tau_tree
expect("10", "tau_target_only_t1", tau_tree)
expect("10", "tau_rejection_chain_t1", tau_chain)
print("all checks passed")
