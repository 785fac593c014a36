# %% [markdown]
# # 03 · Correct, accept, bonus: the names, and τ and α as SGLang and vLLM count them
#
# **Objectives.** Name the parts of a step's output the way SGLang's code does, compute τ and α
# from a run, read vLLM's "SpecDecoding metrics" line beside them, and know which numbers a
# claim about "acceptance rate" can mean.
#
# **Chapter sections.** SGLang end to end (`000`) §1.4, §8, §8.1, §8.2, §8.3, §13; vLLM's chapter
# (`002`) §12.5.4, §12.7.5; SGLang's ModelRunner section (`004`) §8.
#
# > SGLang 投机路径里，动词决定是否含 bonus： (《投机解码（Speculative Decoding）端到端深挖》§8)
# > *In SGLang's speculative path, the verb decides whether the bonus is included.*
#
# **Time.** About 10 minutes.

# %% [markdown]
# ## One step, named (000 §8.1)
#
# The chapter's step: three drafts A, B, C; the target accepts A and B, rejects C, and adds its
# own token X, the bonus. `correct_drafts` are the accepted drafts (no bonus), `accept_tokens`
# what the step writes (correct drafts and the bonus), `accept_len` their number. α (accept_rate)
# counts drafts only; τ (accept_length) counts what a step writes. spectrace's metrics are fed
# step records; here is that one step as a record.

# %%
from fractions import Fraction

from _lib import WALKTHROUGH, expect, run, show

from spectrace.core.metrics import SpecMetrics, vllm_log_line
from spectrace.core.trace_reader import read_trace

A, B, C, X = 11, 12, 13, 99
step = {"step": 0, "request": 0, "draft": {"tokens": [A, B, C]}, "correct_drafts": [A, B], "bonus_token": X,
        "accept_tokens": [A, B, X], "accept_len": 3, "committed_tokens": [A, B, X], "timing": {}}
one = SpecMetrics(num_steps=3, num_draft_tokens=4)
one.observe_step(step)
s = one.summary(wall_s=1.0)
print(f"α = correct / proposed = {s['num_correct_drafts']} / {s['num_proposed_drafts']} = {s['accept_rate']:.3f}")
print(f"accept_len = correct + bonus = {step['accept_len']}")

# %% [markdown]
# ## The chapter's metrics example (000 §13), and the token it leaves out
#
# "num_draft_tokens = 5 (K = 4 drafts a step), 10 verifies, 25 drafts accepted, completion 35:
# accept_rate 25 / (10 × 4) = 0.625, accept_length 35 / 10 = 3.5." SGLang's
# `spec_accept_length` is completion_tokens / spec_verify_ct, and a request's completion tokens
# include its first token, which the prefill sampled without any verify. Fed the same ten steps
# after a prefill, SGLang's definition gives 36 / 10 = 3.6: the chapter's 3.5 counts the steps'
# tokens only.

# %%
chapter = SpecMetrics(num_steps=4, num_draft_tokens=5)
chapter.observe_prefill(0)
for i, correct in enumerate([3, 2, 3, 2, 3, 2, 3, 2, 3, 2]):  # 25 accepted drafts over 10 verifies
    drafts = list(range(100, 104))
    chapter.observe_step({"step": i, "request": 0, "draft": {"tokens": drafts}, "correct_drafts": drafts[:correct],
                          "accept_len": correct + 1, "committed_tokens": drafts[:correct] + [7], "timing": {}})
cs = chapter.summary(wall_s=1.0)
print(f"α {cs['accept_rate']}  τ {cs['accept_length']} (completion {cs['completion_tokens']}, "
      f"verify_ct {cs['verify_ct']})")

# %% [markdown]
# ## A real run: the walkthrough's trace (000 §1.4, §8.2)
#
# The committed trace `tests/data/walkthrough.jsonl` is an EAGLE run (tree 5, 4, 8; two requests;
# 24 tokens each). Its summary holds SGLang's metrics and vLLM's, from the same steps.

# %%
t = read_trace(WALKTHROUGH)
m = t.summary["metrics"]
cfg = t.header["config"]
n = cfg["num_draft_tokens"]
print(f"verify_ct {m['verify_ct']}  τ {m['accept_length']}  α {m['num_correct_drafts']}/{m['num_proposed_drafts']}"
      f" = {m['accept_rate']:.4f}  accept_len histogram {m['accept_len_histogram']}")
print(vllm_log_line(m))

# %% [markdown]
# The same numbers as vLLM's four Prometheus counters (002 §12.7.5; `vllm/v1/spec_decode/metrics.py`),
# the per-position one showing where acceptance falls off along a path:

# %%
v = m["vllm"]
print(f"vllm:spec_decode_num_drafts_total {v['num_drafts']}")
print(f"vllm:spec_decode_num_draft_tokens_total {v['num_draft_tokens']}")
print(f"vllm:spec_decode_num_accepted_tokens_total {v['num_accepted_tokens']}")
for pos, count in enumerate(v["num_accepted_tokens_per_pos"]):
    print(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{pos}"}} {count}')

# %% [markdown]
# vLLM's "Mean acceptance length" is 1 + accepted / num_drafts: per drafted step, without the
# prefill's token, so it reads 2.5 where SGLang's τ reads 2.4. Its "Avg Draft acceptance rate"
# divides the accepted drafts by every drafted token, here the 7 nodes of each tree: 30 / 140,
# SGLang's α as a percentage.
#
# τ and α are tied by an identity worth deriving once. Each verify writes 1 + its correct drafts;
# the run adds one prefill token per request and loses the tokens cut at EOS or the length limit:
#
#     τ = 1 + α (n - 1) + (requests - cut) / verify_ct

# %%
requests = len(t.summary["requests"])
cut = sum(r["accept_len"] for r in t.steps) - sum(len(r["committed_tokens"]) for r in t.steps)
alpha = Fraction(m["num_correct_drafts"], m["num_proposed_drafts"])
identity = 1 + alpha * (n - 1) + Fraction(requests - cut, m["verify_ct"])
print(f"1 + {alpha} x {n - 1} + ({requests} - {cut}) / {m['verify_ct']} = {identity} = {float(identity)}")

import matplotlib.pyplot as plt  # noqa: E402

fig, (left, right) = plt.subplots(1, 2, figsize=(8, 2.8))
hist = {int(k): v for k, v in m["accept_len_histogram"].items()}
left.bar(list(hist), list(hist.values()))
left.set_xlabel("accept_len")
left.set_ylabel("steps")
per_pos = m["vllm"]["per_position_acceptance_rate"]
right.plot(range(1, len(per_pos) + 1), per_pos, marker="o")
right.set_xlabel("draft position")
right.set_ylabel("accepted / drafted steps")
fig.tight_layout()
show(fig, "03_acceptance")

# %% [markdown]
# ## A drafter that finds nothing (000 §8.3)
#
# vLLM's n-gram proposer looks for the context's last 5 tokens earlier in the context; on the
# default prompt it finds none, so every step is a plain decode: no drafts, one token (the
# bonus). SGLang's counting still calls each a verify (τ = 24 / 23); vLLM's counts no draft at
# all (num_drafts 0), so its acceptance line has nothing to say.

# %%
ngram, _ = run("03_ngram", algo="ngram")
g = ngram.metrics
print(f"n-gram: verify_ct {g['verify_ct']}  τ {g['accept_length']:.4f}  proposed drafts "
      f"{g['num_proposed_drafts']}  vLLM num_drafts {g['vllm']['num_drafts']}")

# %% [markdown]
# ## The same counting on a live run
#
# The committed trace cannot change, so checks on it alone would pass whatever the engine did.
# Run an EAGLE tree yourself (two held-out prompts, 16 tokens each) and count it both ways: the
# identities below must hold for every run the engine makes.

# %%
from spectrace.zoo.prompts import HELD_OUT_PROMPTS  # noqa: E402

live, live_trace = run("03_live", algo="eagle", topk=4, prompts=HELD_OUT_PROMPTS[:2], max_new_tokens=16)
lt = read_trace(live_trace.path)
lm = lt.summary["metrics"]


def counting_holds(t, m) -> bool:
    """Every step: accept_len = correct + 1, the tokens are the correct drafts then the bonus; the
    run: τ = completion / verify_ct, α = correct / proposed, vLLM's counters (its per-position one
    too) from the same steps."""
    steps_ok = all(r["accept_len"] == len(r["correct_drafts"]) + 1 and
                   r["accept_tokens"] == r["correct_drafts"] + [r["bonus_token"]] for r in t.steps)
    completion = len(t.prefills) + sum(len(r["committed_tokens"]) for r in t.steps)
    proposed = sum(len(r["draft"]["tokens"]) for r in t.steps if r["draft"])
    correct = sum(len(r["correct_drafts"]) for r in t.steps)
    per_pos = m["vllm"]["num_accepted_tokens_per_pos"]  # position i: the steps that accepted more than i drafts
    by_position = [sum(len(r["correct_drafts"]) > i for r in t.steps) for i in range(len(per_pos))]
    return (steps_ok and m["completion_tokens"] == completion and m["verify_ct"] == len(t.steps)
            and m["accept_length"] == completion / len(t.steps) and m["num_correct_drafts"] == correct
            and m["accept_rate"] == correct / proposed and m["vllm"]["num_accepted_tokens"] == correct
            and m["vllm"]["mean_acceptance_length"] == 1 + correct / m["vllm"]["num_drafts"]
            and per_pos == by_position)


print(f"live: verify_ct {lm['verify_ct']}  τ {lm['accept_length']:.4f}  α {lm['accept_rate']:.4f}  "
      f"vLLM mean acceptance length {lm['vllm']['mean_acceptance_length']:.4f}")
print("the counting holds on the walkthrough:", counting_holds(t, m), "and live:", counting_holds(lt, lm))

# %% [markdown]
# ## "Usually > 0.7 to gain" (004 §8)
#
# The ModelRunner section advises checking that the draft's acceptance rate is "usually above
# 0.7 for a net gain". Which acceptance rate? SGLang's α over a tree of n - 1 nodes can never
# exceed num_steps / (n - 1), since one path of at most num_steps drafts is accepted: for
# SGLang's (5, 4, 8) that is 5/7 = 0.714. The walkthrough's run earns τ 2.4 at α 0.21, and the
# embedded EAGLE over the 8 held-out prompts τ 3.066 at α 0.300 (docs/benchmarks.md). The advice
# fits a chain's per-position acceptance, not SGLang's tree α.
#
# > **Erratum (004 「调试 speculative decoding 时先看哪里」).** Even for a chain, 0.7 is no
# > threshold. The vLLM chapter's own table (002 §12.5.4), the closed form
# > (1 - α^(k+1)) / ((1 - α)(1 + c·k)) with draft cost c per token, shows gains well below it:
# > 「中等接受率、中等成本」 α 0.55, c 0.20, k 3: 1.26×; 「低接受率、零成本」 α 0.25, c 0: 1.33×.
# > Whether speculation pays is α against the draft's cost, not α alone (lesson 04).

# %%
def closed_form(alpha, c, k):
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (1 + c * k))


for alpha, c, k in ((0.55, 0.20, 3), (0.25, 0.0, 3), (0.75, 0.40, 7)):
    print(f"α {alpha}, c {c}, k {k}: {closed_form(alpha, c, k):.2f}x")

# %% [markdown]
# ## Check yourself

# %%
assert s["accept_rate"] == 2 / 3 and step["accept_len"] == len(step["correct_drafts"]) + 1
assert cs["accept_rate"] == 0.625 and cs["accept_length"] == 3.6  # the chapter's 3.5 without the prefill token
assert (cs["completion_tokens"] - 1) / cs["verify_ct"] == 3.5
# every step of the real run: accept_len = correct + 1, accept_tokens = correct drafts then the bonus
for rec in t.steps:
    assert rec["accept_len"] == len(rec["correct_drafts"]) + 1
    assert rec["accept_tokens"] == rec["correct_drafts"] + [rec["bonus_token"]]
assert identity == Fraction(m["accept_length"]).limit_denominator(1000)
assert v["mean_acceptance_length"] == 1 + v["num_accepted_tokens"] / v["num_drafts"]
assert v["num_accepted_tokens"] == sum(v["num_accepted_tokens_per_pos"]) == m["num_correct_drafts"]
assert abs(m["vllm"]["draft_acceptance_rate"] - 100 * m["accept_rate"]) < 1e-9
# the same counting holds on a run made now, not only on the committed trace
assert counting_holds(t, m) and counting_holds(lt, lm)
assert lm["accept_rate"] <= 5 / 7  # the tree bound, live
# the chapter's table: gains below α 0.7, a loss at α 0.75 when drafting is dear
assert [round(closed_form(*row), 2) for row in ((0.55, 0.20, 3), (0.25, 0.0, 3), (0.75, 0.40, 7))] == [1.26, 1.33, 0.95]
# the tree bound on α, and the n-gram run's plain steps
assert m["accept_rate"] <= cfg["num_steps"] / (n - 1) == 5 / 7
assert g["num_proposed_drafts"] == 0 and g["vllm"]["num_drafts"] == 0
assert g["accept_length"] == g["completion_tokens"] / g["verify_ct"]
# the fixture's numbers (a committed trace: they never move unless it is remade)
expect("03", "walkthrough_tau", m["accept_length"])
expect("03", "walkthrough_vllm_mean_acceptance_length", m["vllm"]["mean_acceptance_length"])
expect("03", "walkthrough_accept_len_histogram", m["accept_len_histogram"])
expect("03", "ngram_verify_ct", g["verify_ct"])
print("all checks passed")
