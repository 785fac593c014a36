# %% [markdown]
# # 12 · Temperature, and which trees stay lossless
#
# **Objectives.** See how acceptance falls as temperature rises, for a tree verified with
# SGLang's target_only rule, for a sampled tree verified with rejection sampling (spectrace's
# `tree_rejection`, SpecInfer's and Sequoia's recipe), and for a chain verified with SGLang's
# chain rejection; and see why a sampled tree must fix its shape before it draws.
#
# **Chapter sections.** SGLang end to end (`000`) §6.2, §6.3, §7.2, §7.4; vLLM's chapter (`002`)
# §12.2.4; SGLang's ModelRunner section (`004`) §6.
#
# > 不能开 rejection sampling、不能开 Adaptive（需 topk=1） (《投机解码（Speculative Decoding）端到端深挖》§6.2)
# > *(A tree) cannot turn on rejection sampling, cannot turn on Adaptive (they need topk=1).*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## What 000 §7.2 and §7.4 say, and what is true
#
# 《投机解码（Speculative Decoding）端到端深挖》(000) §7.2 and §7.4 are right about SGLang: its
# trees are the draft's deterministic top k, and rejection sampling needs each draft to be a
# sample of q. So SGLang verifies sampled trees with
# target_only, which ignores q and (lesson 10) is still exact at thresholds 1. But a tree *can*
# be verified by rejection sampling if its children are drawn from q without replacement and
# each rejected sibling's q is removed from the residual (SpecInfer's multi-draft rule);
# spectrace's `tree_rejection` does this, and the chi-square test of lesson 09 passes through it.
#
# ## τ against temperature, three ways (000 §7.4, 002 §12.2.4)

# %%
from _lib import expect, run, show, tree_figure

from spectrace.run import RunConfig
from spectrace.run import run as spectrace_run
from spectrace.zoo.prompts import HELD_OUT_PROMPTS

import matplotlib.pyplot as plt  # noqa: E402

SETUPS = {  # name -> run options; at temperature 0 every one is greedy
    "tree, target_only (5,4,8)": dict(algo="eagle", topk=4, acceptance="target_only"),
    "sampled tree, tree_rejection (5,4,8)": dict(algo="eagle", topk=4, acceptance="tree_rejection"),
    "chain, rejection (5,1,6)": dict(algo="eagle", topk=1, num_steps=5, acceptance="rejection"),
}
temperatures, seeds = [0.0, 0.5, 1.0], [0, 1]


def mean_tau(T: float, **options) -> float:
    """τ over the 8 held-out prompts in one batch, 16 tokens each, averaged over two seeds (no
    trace: only the metrics are read)."""
    runs = [spectrace_run(RunConfig(prompts=HELD_OUT_PROMPTS, batch=8, max_new_tokens=16, temperature=T, seed=seed,
                                    trace=None, trace_level="off", **options)) for seed in seeds]
    return sum(r.metrics["accept_length"] for r in runs) / len(runs)


tau = {}
for name, options in SETUPS.items():
    for T in temperatures:
        tau[name, T] = mean_tau(T, **dict(options, acceptance=options["acceptance"] if T > 0 else "greedy"))
    print(f"{name:<38}", "  ".join(f"T={T}: tau {tau[name, T]:.3f}" for T in temperatures))

fig, ax = plt.subplots(figsize=(5.5, 3))
for name in SETUPS:
    ax.plot(temperatures, [tau[name, T] for T in temperatures], marker="o", label=name)
ax.set_xlabel("temperature")
ax.set_ylabel("tau (accept_length)")
ax.legend(fontsize=7)
fig.tight_layout()
show(fig, "12_tau_vs_temperature")

# %% [markdown]
# At temperature 0 the two trees are the same greedy tree (the same τ). Above it, sampling
# spreads p: each draft matches what the target samples less often, and τ falls for every rule,
# the target_only tree fastest: by T = 1 the sampled tree with tree_rejection keeps more of its τ, as it
# drafts by q's draws and judges each against p with q in the ratio. The ModelRunner text lists
# 「高温度采样（随机性高，draft 难以准确预测）」 among the conditions against a gain (004 §6). docs/acceptance.md's
# "Acceptance rules" table is the same measurement at 64 tokens and 4 seeds.
#
# > **Erratum (000 §7.2, on a CPU).** SGLang itself would run all of these greedily on this CPU:
# > its `_verify_uses_greedy` holds at any temperature on a CPU, NPU or XPU (lesson 10), the
# > platforms without a sampling verify kernel. The curves are what SGLang's rules do on an NVIDIA
# > or AMD GPU, run here by spectrace on any device.
#
# ## A sampled tree (000 §6.3)
#
# `tree_rejection` draws each node's K children from q without replacement (an exponential race),
# and ranks the candidates by `sibling_worth`, what the j-th draw has been worth in this
# request's earlier steps, never by the draws themselves: a tree whose shape depended on what it
# drew would keep lucky draws and bias the output (a test in tests/test_acceptance.py shows that
# bias). The trace keeps the worth beside each tree:

# %%
result, trace = run("12_sampled_tree", algo="eagle", topk=4, temperature=1.0, seed=0, acceptance="tree_rejection")
again, _ = run("12_sampled_tree_again", algo="eagle", topk=4, temperature=1.0, seed=0, acceptance="tree_rejection")
rec = trace.step(3)
print("sibling_worth at step 3:", rec["draft"]["sibling_worth"])
print("path scores:", rec["draft"]["scores"])
show(tree_figure(trace, 3, "12_sampled_tree"))


def decisions(path):
    """Every step's decisions and tokens, timing left out."""
    from spectrace.core.trace_reader import read_trace

    return [(s["accept"], s["accept_tokens"], s["draft"]) for s in read_trace(path).steps]


# %% [markdown]
# ## Check yourself

# %%
# τ falls as the temperature rises, for every rule (8 prompts, 2 seeds)
for name in SETUPS:
    assert tau[name, 0.0] > tau[name, 0.5] > tau[name, 1.0], name
# a seeded sampled run repeats itself exactly, step for step
assert decisions(trace.path) == decisions(again.trace_path)
# a sampled tree's path scores are products of sibling_worth, not of the q its draws had: each
# node's score over its parent's is one of the worths
worth, scores = rec["draft"]["sibling_worth"], rec["draft"]["scores"]
ratios = [s / (scores[par - 1] if par else 1.0) for s, par in zip(scores, rec["draft"]["parents"])]
assert all(min(abs(r - w) for w in worth) < 1e-4 for r in ratios), (ratios, worth)
assert any(abs(s - q) > 1e-3 for s, q in zip(scores, rec["draft"]["q"]))  # and not the draws' q
for name in SETUPS:
    for T in temperatures:
        expect("12", f"tau {name} T={T}", tau[name, T])
print("all checks passed")
