# %% [markdown]
# # 01 · Why speculate? One target forward per token
#
# **Objectives.** After this lesson you can say what plain (autoregressive) decoding costs per
# token, what a speculative step buys in exchange for a cheap guess, and why greedy output does
# not change by a single token (sampled output keeps its distribution: lesson 09).
#
# **Chapter sections.** SGLang end to end (`000`) §1, §1.1; vLLM's chapter (`002`) §12.1, §12.1.1;
# SGLang's ModelRunner section (`004`) §0, §2, §6.
#
# > 普通 AR：每 1 token = 1 次 target forward。 (《投机解码（Speculative Decoding）端到端深挖》§1)
# > *Plain autoregressive decoding: one target forward for every token.*
#
# > LLM Decode 是被内存带宽而不是算力拖慢的。 (《第12章 投机解码：以小博大》§12.1)
# > *LLM decoding is slowed by memory bandwidth, not by compute.*
#
# **Time.** About 10 minutes. Run it as `python lessons/01_why_speculative.py` from the
# repository root, or open it as a notebook (`jupytext --to ipynb lessons/01_why_speculative.py`).

# %% [markdown]
# ## Plain decoding, and a speculative run of the same prompt (004 §0, §2)
#
# Both runs use the embedded 7M-parameter target on the default prompt, greedy, 24 new tokens.
# The speculative one drafts with the embedded 0.9M-parameter draft LM: a chain of 3 guesses per
# step (`--algo standalone --topk 1 --num-steps 3`), which the target then checks in one forward.

# %%
from _lib import at, expect, run, screen, show, tree_figure

from spectrace.core.metrics import speedup_model
from spectrace.core.trace_reader import read_trace

plain, plain_trace = run("01_none", algo="none")
spec, spec_trace = run("01_standalone", algo="standalone", topk=1, num_steps=3)


def target_forwards(result) -> int:
    """One prefill, then one target forward per decode step (a plain decode or a verify)."""
    return len(result.requests) + result.metrics["decode_steps"]


print(f"{'path':<28} {'tokens':>6} {'target forwards':>16} {'tokens per forward':>19}")
for name, r in (("plain decoding (none)", plain), ("standalone chain (3, 1, 4)", spec)):
    tokens = r.metrics["completion_tokens"]
    print(f"{name:<28} {tokens:>6} {target_forwards(r):>16} {tokens / target_forwards(r):>19.2f}")
print("\nthe same text:", spec.texts == plain.texts)
print(repr(spec.texts[0]))

# %% [markdown]
# Plain decoding pays a whole target forward for each token: every weight of the model is read
# from memory to produce one token per request, which is why decoding is bound by memory
# bandwidth (002 §12.1.1). The speculative run produced the same 24 tokens with fewer target
# forwards: each verify scored the root and the 3 guesses at once, and kept the guesses up to
# the first one the target would not have chosen, plus one token of the target's own (the
# bonus). τ (SGLang's `accept_length`) is the tokens a target forward earned.

# %% [markdown]
# ## One step, as the walkthrough shows it
#
# `spectrace run --algo standalone --topk 1 --num-steps 3` opens this walkthrough in a terminal;
# here is its first step (the SVG is in the lesson's output folder).

# %%
print(screen(spec_trace, at("ACCEPT"), size=(110, 32), name="01_step0"))
show(tree_figure(spec_trace, 0, "01_step0_tree"))

# %% [markdown]
# ## The guess is not free
#
# The chapter's first refinement (000 §1.1): a step costs the draft, the verify and the rest, so
# the speed-up is not τ. The trace times every phase; lesson 04 turns this into τ / (1 + r).
# On the embedded models on a CPU these times say more about Python than about memory; read them
# as a shape, not as a measurement.

# %%
model = speedup_model(read_trace(spec_trace.path).steps, spec.metrics)
plain_model = speedup_model(read_trace(plain_trace.path).steps, plain.metrics)
print("speculative step, ms ≈", {k: round(v, 2) for k, v in model["phase_ms"].items()})
print("plain decode step, ms ≈", {k: round(v, 2) for k, v in plain_model["phase_ms"].items()})

import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 2.2))
left = 0.0
for phase, ms in model["phase_ms"].items():
    ax.barh(["speculative step"], [ms], left=left, label=phase)
    left += ms
ax.barh(["plain decode step"], [plain_model["phase_ms"]["verify"]], color="grey", label="forward")
ax.set_xlabel("ms per step (≈, CPU)")
ax.legend(ncol=3, fontsize=7)
fig.tight_layout()
show(fig, "01_phases")

# %% [markdown]
# ## When speculation is slower, and why (000 §1.1, 004 §6)
#
# A speculative step earns τ tokens for its whole cost; a plain step earns one for one forward.
# So speculation pays only when τ · T_AR > T_spec = C_draft + C_verify + C_other (000 §1.1),
# which with C_verify ≈ T_AR is τ > 1 + r (+ the rest): the tokens a verify earns against what
# the draft adds, r = C_draft / C_verify. On this run:

# %%
t_spec = sum(model["phase_ms"].values())
t_ar = sum(plain_model["phase_ms"].values())
step_model = model["tau"] * t_ar / t_spec
print(f"τ {model['tau']:.2f}, r {model['r']:.2f}; a speculative step {t_spec:.1f} ms against a plain one "
      f"{t_ar:.1f} ms: τ · T_AR / T_spec = {step_model:.2f}x, so speculation is "
      f"{'faster' if step_model > 1 else 'slower'} here")

# %% [markdown]
# Read the printed line plainly. On a CPU with these tiny models the draft LM's three forwards
# cost about half a verify (r about 0.5), and the rest of the step (accept, commit, the draft's
# extend) about as much again, while a verify of 4 tokens costs more than a plain forward of
# one: a speculative step costs twice a plain one or more, and τ (about 1.7 on the default
# prompt) does not cover it. This run is slower than plain decoding, though it needed fewer
# target forwards. Speculation pays where a
# draft is cheap beside the target's forward: the ModelRunner text's 「吞吐提升约为 (k+1) / 1」 (004 §6)
# leaves the draft's cost out. Measured (docs/kernel-budget.md, docs/benchmarks.md):
# on an H100 with the fast engine, bf16, the 8 held-out prompts, plain decoding made about 4,100
# tokens/s and EAGLE's tree (5, 4, 8) about 5,100 (1.23-1.25x; τ 2.93, r about 0.9 in GPU time,
# paid back by one verify costing about one plain forward there), while the standalone chain
# (3, 1, 4), whose draft is a whole small LM, stayed near 1.0x; on the development CPU the
# explicit engine's standalone chain and plain decoding both made about 90 tokens/s. Lesson 04
# turns this into the formula and its best k.
#
# > **Erratum (004 §6).** Among the conditions against a gain the ModelRunner text lists
# > 「Batch size 很大时，K 个 draft forward 的总计算量接近跑 K 次 target forward。」 A draft forward
# > does not become a target forward at any batch: an EAGLE-3 head is one layer at the target's
# > width, so at Llama-3.1-8B's shape its five draft levels cost 1.59 ms against 5.78 ms for one
# > decode at batch 1, and 2.47 against 9.43 ms at batch 64 (an H100, docs/benchmarks.md). What the
# > batch changes is the verify: its n rows a request are nearly free at batch 1 (6.35 ms, 1.10x a
# > decode) and not at batch 64 (16.40 ms, 1.74x), once the matrix products stop waiting on memory
# > (lesson 16 counts the rows).

# %% [markdown]
# ## Check yourself

# %%
m = spec.metrics
# greedy speculative decoding changes no token
assert spec.texts == plain.texts
# plain decoding: exactly one target forward per generated token
assert target_forwards(plain) == plain.metrics["completion_tokens"] == 24
# τ counts tokens per verify, the prefill's first token included (SGLang's accept_length)
assert m["accept_length"] == m["completion_tokens"] / m["verify_ct"]
# every step keeps between 1 (the bonus alone) and num_steps + 1 = 4 tokens
assert all(1 <= spec_trace.step(i)["accept_len"] <= 4 for i in range(len(spec_trace)))
# fewer target forwards than tokens: what speculation saves, whether or not it is faster here
assert target_forwards(spec) < target_forwards(plain)
# this run's numbers (greedy, so they repeat exactly)
expect("01", "standalone_verify_ct", m["verify_ct"])
expect("01", "standalone_tau", m["accept_length"])
expect("01", "standalone_alpha", m["accept_rate"])
print("all checks passed")
