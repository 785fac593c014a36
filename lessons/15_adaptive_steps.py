# %% [markdown]
# # 15 · Adaptive steps: a chain as long as it is used
#
# **Objectives.** Follow SGLang's `AdaptiveSpeculativeParams`: an EMA of the accepted drafts picks
# the chain length among tiers (1, 3, 7 steps), after a warm-up and only every few batches, with
# hysteresis so it does not flap. Work a sequence out by hand, then watch a live run climb from 3
# to 7 steps on code that repeats itself and stay at 3 on prose.
#
# **Chapter sections.** SGLang end to end (`000`) §10.3 (a CUDA-graph set per tier), §12, §14.
#
# > 运行时按 EMA 接受长度切换 num_steps tier (《投机解码（Speculative Decoding）端到端深挖》§12)
# > *At run time, switch the num_steps tier by an EMA of the accept length.*
#
# **Time.** About 10 minutes.

# %% [markdown]
# ## The rule (000 §12)
#
# ema starts at steps - 1; after each verified batch ema = 0.8 ema + 0.2 mean(accepted drafts per
# request). No decision in the first 10 batches, then one every 5. Step up while ema > tier - 0.5;
# step down while ema <= lower tier - 0.5 - 0.25. A tier of s steps pays when about s - 0.5 of its
# drafts are accepted: the EMA asks whether the chain is used to its length. The thresholds, from
# the rule's constants:

# %%
from _lib import CI, expect, run, show

from spectrace.core.adaptive import AdaptiveConfig, AdaptiveSpeculativeParams
from spectrace.zoo.prompts import REPEATING_PROMPTS

cfg = AdaptiveConfig()
tiers = cfg.candidate_steps
up = {(lo, hi): lo - 0.5 + cfg.up_hysteresis for lo, hi in zip(tiers, tiers[1:])}
down = {(hi, lo): lo - 0.5 + cfg.down_hysteresis for lo, hi in zip(tiers, tiers[1:])}
print("step up when ema >", up, "  step down when ema <=", down)

# %% [markdown]
# ## A worked sequence
#
# Three drafts accepted per request for 15 batches, then none for 15, starting at 3 steps. By
# hand: after batch 15 the ema is 3 - 0.8^15 = 2.965 > 2.5, up to 7; after batch 20 it is
# 2.965 x 0.8^5 = 0.97 <= 2.25, down to 3 (and not to 1: 0.97 > 0.25); after 25, 0.318, stays;
# after 30, 0.104 <= 0.25, down to 1.

# %%
rule = AdaptiveSpeculativeParams(3)
history = []
for batch in [[3, 3]] * 15 + [[0]] * 15:
    rule.update(batch)
    history.append((rule.ema, rule.current_steps))
by_hand = {15: 3 - 0.8 ** 15}
by_hand[20] = by_hand[15] * 0.8 ** 5
by_hand[25] = by_hand[20] * 0.8 ** 5
by_hand[30] = by_hand[25] * 0.8 ** 5
for b in (15, 20, 25, 30):
    print(f"after batch {b}: ema {history[b - 1][0]:.3f} (by hand {by_hand[b]:.3f}), tier {history[b - 1][1]}")

import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 2.6))
xs = range(1, len(history) + 1)
ax.plot(xs, [e for e, _ in history], label="ema")
ax.step(xs, [s for _, s in history], where="post", label="tier (num_steps)")
for threshold in list(up.values()) + list(down.values()):
    ax.axhline(threshold, color="grey", lw=0.5, ls=":")
ax.set_xlabel("verified batch")
ax.legend(fontsize=7)
fig.tight_layout()
show(fig, "15_adaptive")

# %% [markdown]
# ## Live (000 §12, §14)
#
# `--speculative-adaptive` runs with the EAGLE worker and topk 1 (000 §10.3: SGLang keeps a set of CUDA graphs
# per tier). On held-out prose its EMA stays between 0.25 and 2.5, so it never leaves 3 steps and
# equals the plain 3-step chain. On repeating code it needs 96 tokens: the first decision comes
# after 10 + 5 steps, and a 48-token run ends before it.

# %%
prose, prose_trace = run("15_prose", algo="eagle", topk=1, num_steps=3, adaptive=True)
chain, _ = run("15_chain", algo="eagle", topk=1, num_steps=3)
code, code_trace = run("15_code", algo="eagle", topk=1, num_steps=3, adaptive=True, prompts=REPEATING_PROMPTS,
                       max_new_tokens=96)
tiers_used = [code_trace.step(i)["adaptive"]["num_steps"] for i in range(len(code_trace.index))]
runs = []
for t in tiers_used:
    if runs and runs[-1][0] == t:
        runs[-1][1] += 1
    else:
        runs.append([t, 1])
print(f"prose: tau {prose.metrics['accept_length']:.3f} (the 3-step chain: {chain.metrics['accept_length']:.3f})")
print(f"repeating code: {len(tiers_used)} steps, tiers {' then '.join(f'{t} x{n}' for t, n in runs)}, "
      f"tau {code.metrics['accept_length']:.4f}")
if not CI:
    print(prose_trace.step(len(prose_trace.index) - 1)["adaptive"])

# %% [markdown]
# ## Check yourself

# %%
# the thresholds
assert up == {(1, 3): 0.5, (3, 7): 2.5} and down == {(3, 1): 0.25, (7, 3): 2.25}
# the worked sequence: the EMA by hand, and the tiers it implies
assert all(abs(history[b - 1][0] - by_hand[b]) < 1e-12 for b in by_hand)
assert [history[b - 1][1] for b in (14, 15, 20, 25, 30)] == [3, 7, 3, 3, 1]
# prose never leaves 3 steps: the adaptive run is the 3-step chain
assert prose.texts == chain.texts and prose.metrics["accept_length"] == chain.metrics["accept_length"]
# repeating code climbs once, after the warm-up and one interval, and stays
assert runs == [[3, 15], [7, len(tiers_used) - 15]]
expect("15", "tau repeating code", code.metrics["accept_length"])
expect("15", "steps repeating code", len(tiers_used))
print("all checks passed")
