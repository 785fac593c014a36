# %% [markdown]
# # 17 · Debugging with traces: the checklist, and a bug found by it
#
# **Objectives.** Work through the ModelRunner section's debugging checklist with spectrace's tools: acceptance
# (α, τ, per position), the drafter, the cost ratio r, and the invariant that finds most bugs:
# greedy speculative text must equal plain decoding's. Plant a classic KV bug and find the first
# step where it bites. Answer the chapter's FAQ from a trace.
#
# **Chapter sections.** SGLang's ModelRunner section (`004`) §8; SGLang end to end (`000`) §16 (the
# FAQ).
#
# > 1. 先确认 draft model 的 acceptance rate 是否达到预期（通常需要 > 0.7 才有净收益）；
# > 2. 如果 acceptance rate 低，检查 draft model 和 target model 是否来自同一 family；
# > 3. 如果延迟更高，看当前 batch size 是否太大，导致 draft K 次 forward 的开销超过了 target verify 的收益； (《Speculative Decoding》「调试 speculative decoding 时先看哪里」)
# > *1. First check that the draft model's acceptance rate is as expected (usually > 0.7 is needed
# > for a net gain); 2. if it is low, check that draft and target come from the same family; 3. if
# > latency is higher, check whether the batch is so large that the draft's K forwards cost more
# > than the target verify gains.*
#
# **Time.** About 20 minutes.

# %% [markdown]
# ## 1. Acceptance: α, τ and where the drafts die (004 §8)
#
# τ (accept_length) counts tokens per verify, bonus included; α (accept_rate) is per proposed
# draft. vLLM's per-position rates say at which depth the drafts stop matching.

# %%
from _lib import expect, run

from spectrace.core.engine import Engine
from spectrace.core.metrics import speedup_model

eagle, eagle_trace = run("17_eagle", algo="eagle", topk=4)
m = eagle.metrics
print(f"tau {m['accept_length']:.3f}, alpha {m['accept_rate']:.3f}, per position "
      f"{[round(r, 3) for r in m['vllm']['per_position_acceptance_rate']]}")

# %% [markdown]
# ## 2. The drafter, and 3. the cost ratio r
#
# A better drafter raises τ; a cheaper one lowers r = C_draft / C_verify. The trace carries every
# phase's time, so the textbook model τ / (1 + r) comes straight from it (on this CPU the times are
# Python's, so r is far from a GPU's: docs/benchmarks.md has H200 numbers).

# %%
standalone, _ = run("17_standalone", algo="standalone")
from spectrace.core.trace_reader import read_trace  # noqa: E402

model = speedup_model(read_trace(eagle_trace.path).steps, m)
print(f"eagle tau {m['accept_length']:.3f} against standalone {standalone.metrics['accept_length']:.3f}; "
      f"eagle r {model['r']:.2f}, predicted {model['predicted_speedup']:.2f}x")

# %% [markdown]
# ## 4. The invariant: greedy speculative text = plain decoding's
#
# Under greedy acceptance every correct implementation emits exactly the target's greedy text. So
# the first thing to check after any change is that invariant, and the first step where it breaks
# points at the bug. A classic one: committing the KV of the first accept_len tree nodes, as if
# the tree were a chain, instead of the accepted path's nodes. Planted here for one run:

# %%
plain, _ = run("17_none", algo="none")


def commit_a_prefix(self, rows):
    """The bug: keep rows 0 .. accept_len - 1 of the tree, not the accepted path."""
    for row in rows:
        kept = list(range(len(row.result.accept_nodes)))  # should be row.result.accept_nodes
        self.kv.commit(row.req.req_pool_idx, row.seq_len, len(row.candidates), kept)
        row.committed = self.append(row.req, row.result.accept_tokens)


good_commit = Engine.commit
Engine.commit = commit_a_prefix
try:
    buggy, buggy_trace = run("17_buggy", algo="eagle", topk=4)
finally:
    Engine.commit = good_commit

want = plain.requests[0].output_ids
steps = read_trace(buggy_trace.path).steps
first_bad, first_trigger, position = None, None, 1  # position 0 is the prefill's token
for s in steps:
    if first_trigger is None and s["accept"]["accept_nodes"] != list(range(len(s["accept"]["accept_nodes"]))):
        first_trigger = s["step"]
    if first_bad is None and s["committed_tokens"] != want[position:position + len(s["committed_tokens"])]:
        first_bad = s["step"]
    position += len(s["committed_tokens"])
print(f"texts equal: correct eagle {eagle.texts == plain.texts}, buggy eagle {buggy.texts == plain.texts}")
print(f"first step whose accepted path is not a prefix of the tree: {first_trigger}; "
      f"first step whose tokens differ from plain decoding's: {first_bad}")
print(f"to look at it: spectrace replay {buggy_trace.path}  (step {first_bad})")

# %% [markdown]
# The bug cannot show before a step whose path skips a node (until then a prefix *is* the path);
# after one, the target reads a rejected sibling's KV and its argmax drifts. The walkthrough's
# KV panel shows the slots the commit kept; the renderer shows the path.
#
# ## The FAQ, answered from the trace (000 §16)

# %%
records = read_trace(eagle_trace.path).steps
# Q: after a level with no match, can a deeper node be accepted? (greedy stops at the first miss)
def stops_at_first_miss(s) -> bool:
    """Every node the walk tried is a child of the last node it accepted; a tried node is accepted
    exactly when its token is the target's argmax after its parent; the accepted ones are the path."""
    parents, tokens, path = [None] + s["draft"]["parents"], s["verify"]["tokens"], [0]
    for d in s["accept"]["decisions"]:
        if parents[d["node"]] != path[-1] or d["accepted"] != (tokens[d["node"]] == s["verify"]["target_predict"][path[-1]]):
            return False
        if d["accepted"]:
            path.append(d["node"])
    return path == s["accept"]["accept_nodes"]


stops = all(stops_at_first_miss(s) for s in records if s["draft"])
# Q: is every accepted node the child of the one before it?
paths = all(all(s["draft"]["parents"][b - 1] == a for a, b in zip(s["accept"]["accept_nodes"],
                                                                 s["accept"]["accept_nodes"][1:]))
            for s in records if s["draft"])
# Q: accept_tokens = correct_drafts + bonus_token?
naming = all(s["accept_tokens"] == s["correct_drafts"] + [s["bonus_token"]] for s in records)
# Q: verify_ct = the number of steps; τ = completion tokens / verify_ct
counts = m["verify_ct"] == len(records) and abs(m["accept_length"] - m["completion_tokens"] / m["verify_ct"]) < 1e-12
print(f"greedy stops at the first miss: {stops}; paths follow parents: {paths}; naming: {naming}; counts: {counts}")

# %% [markdown]
# ## Check yourself

# %%
# the invariant holds for the correct engine and breaks for the planted bug
assert eagle.texts == plain.texts and standalone.texts == plain.texts and buggy.texts != plain.texts
# ... never before the first step whose accepted path is not a prefix of the tree
assert first_trigger is not None and first_bad is not None and first_bad > first_trigger
# the FAQ's answers hold on every step
assert stops and paths and naming and counts
expect("17", "first divergent step of the planted bug", first_bad)
expect("17", "tau eagle", m["accept_length"])
print("all checks passed")
