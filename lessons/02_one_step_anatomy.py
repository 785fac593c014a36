# %% [markdown]
# # 02 · One step, five phases: draft, verify, accept, commit, extend
#
# **Objectives.** Follow one speculative step of an EAGLE run phase by phase, name what each
# phase reads and writes (and in which KV pool), map the phases onto SGLang's workers and
# forward modes, and read a step record of a trace field by field.
#
# **Chapter sections.** SGLang end to end (`000`) §1, §4, §5, §5.1, §6, §15; SGLang's ModelRunner
# section (`004`) §1, §4.
#
# > Draft → Target VERIFY → Accept + Bonus → Draft extend (《投机解码（Speculative Decoding）端到端深挖》§1)
#
# > 投机挂在每个 decode 步上，不是整次 API 只跑一轮 draft→verify。 (《投机解码（Speculative Decoding）端到端深挖》§5.1)
# > *Speculation happens at every decode step, not once per API call.*
#
# **Time.** About 15 minutes. Everything here reads the committed trace
# `tests/data/walkthrough.jsonl` (an EAGLE run, tree 5, 4, 8, two requests, 24 tokens each); no
# model runs. `spectrace replay tests/data/walkthrough.jsonl` opens it interactively (`[` and `]`
# move between phases, `←` `→` between steps).

# %%
from collections import Counter

from _lib import WALKTHROUGH, at, expect, run, screen

from spectrace.core.trace_reader import TraceFile, read_trace

PATH = WALKTHROUGH
t = read_trace(PATH)
trace = TraceFile(PATH)
cfg = t.header["config"]
print(f"{cfg['resolved_algorithm']} ({cfg['num_steps']}, {cfg['topk']}, {cfg['num_draft_tokens']}), "
      f"{len(t.summary['requests'])} requests, {len(t.steps)} step records")

# %% [markdown]
# ## Who runs what (000 §4, §5)
#
# SGLang's scheduler calls one facade per decode step; with speculation on, `model_worker` is the
# draft worker, which runs the whole step and calls the target inside it:
#
# | SGLang | forward mode | spectrace |
# |---|---|---|
# | `TpModelWorker` prefill | `EXTEND` (target) | `Engine.prefill`, then `draft_extend_for_prefill` |
# | `EagleDraftWorker.draft()`, num_steps levels | `DECODE` (draft runner) | `Engine.draft` -> `drafter.draft` |
# | `EAGLEWorkerV2.verify()` | `TARGET_VERIFY` (target) | `Engine.verify`: one target forward over every tree node |
# | `eagle_sample()`: the acceptance walk | - | `Engine.accept` -> the rule's `walk` |
# | free rejected slots, keep the path | - | `Engine.commit` -> `KVCache.commit` |
# | `_draft_extend_for_decode()` | `DRAFT_EXTEND_V2` (draft) | `Engine.extend` -> `drafter.draft_extend` |
#
# A request's prefill runs once; every later step runs all five phases. The trace's step record is
# one request's part of one step.
#
# ## Where to read it: SGLang's files, and this repository's (000 §15)
#
# The ModelRunner text sets out to answer three questions (004 §1): how speculative decoding is
# expressed as an execution configuration; how the two phases, draft and verify, fit ForwardBatch
# and ModelRunner; and why it does not change the output distribution. This lesson is the second
# (the first is lesson 16's, the third lessons 05, 09 and 10). The SGLang text's reading route, file
# by file, with where the same thing is written out here:
#
# | # | SGLang (`python/sglang/srt/`) | what it holds | spectrace |
# |---|---|---|---|
# | 1 | `speculative/spec_info.py` | `SpeculativeAlgorithm`, NEXTN resolved to EAGLE | `spectrace/algos.py` |
# | 2 | `arg_groups/speculative_hook.py` | the automatic shape, topk 1 forcing n = S + 1 | `spectrace/core/shape.py` (`resolve_shape`, `draft_tokens`) |
# | 3 | `managers/scheduler.py` | one `forward_batch_generation` call per decode step | `spectrace/core/engine.py` (the loop) |
# | 4 | `speculative/eagle_worker_v2.py` | draft, verify, draft extend | `spectrace/core/engine.py` (the phases), `spectrace/core/drafters/eagle_worker.py` |
# | 5 | `speculative/eagle_utils.py` | `build_tree`, `organize_draft_results`, `eagle_sample` | `spectrace/core/tree.py`, `spectrace/core/acceptance/` |
# | 6 | `speculative/reject_sampling.py` | chain rejection sampling | `spectrace/core/acceptance/rejection.py` |
# | 7 | `managers/scheduler_components/batch_result_processor.py` | accept lengths into the request's counters | `spectrace/core/metrics.py` |
# | 8 | `managers/tokenizer_manager.py` | `meta_info`: `spec_accept_length`, `spec_verify_ct` | `spectrace/core/metrics.py` (`summary`) |

# %% [markdown]
# ## The step, phase by phase (000 §6; 004 §4)
#
# The walkthrough opens on step 0 at DRAFT 1; `]` goes on a phase, `[` back. Each screen below is
# the same step at another phase (their SVGs are in the lesson's output folder).

# %%
phases = {"DRAFT 1": [], "VERIFY": at("VERIFY"), "ACCEPT": at("ACCEPT"), "COMMIT": at("COMMIT"),
          "EXTEND": at("EXTEND")}
for phase, keys in phases.items():
    text = screen(PATH, keys, size=(110, 32), name=f"02_{phase.replace(' ', '_').lower()}")
    if phase in ("VERIFY", "COMMIT"):
        print(text)
    assert f"KV cache · {phase}" in text, phase  # the panels show the step as of that phase

# %% [markdown]
# ## The record, field by field
#
# `correct_drafts` are the drafts the walk accepted, `bonus_token` the target's own token after
# them, `accept_tokens` both, `committed_tokens` what entered the output (cut at EOS or the token
# limit). `draft` is the tree (tokens, parents, q, path scores, each node's fate), `verify` the
# target's rows, `accept` the walk's decisions, `kv` every KV event tagged with its phase.

# %%
rec = t.steps[0]
for key in ("correct_drafts", "bonus_token", "accept_tokens", "accept_len", "committed_tokens"):
    print(f"{key:<17} {rec[key]}")
print(f"{'accept_nodes':<17} {rec['accept']['accept_nodes']}  (tree nodes of the accepted path, root first)")
print(f"{'draft.fates':<17} {rec['draft']['fates']}")
events = Counter((e["phase"], e["pool"], e["op"]) for e in rec["kv"]["events"])
print("\nKV events of this step (phase, pool, op): count")
for (phase, pool, op), count in events.items():
    print(f"  {phase:<7} {pool:<6} {op:<7} {count}")

# %% [markdown]
# The draft phase allocates scratch slots in the draft's pool, writes its levels there and frees
# them when the tree is built; verify allocates the target's slots for the tree's nodes; commit
# keeps the accepted path's slots and frees the rest; extend writes the accepted tokens into the
# draft's own KV, so its next draft starts from the committed prefix.
#
# The chapter says the decode loop "extends only after verify succeeds" (000 §5). In SGLang and
# here, every step that leaves its request running extends the draft, whatever the verify
# accepted (even the bonus alone must enter the draft's KV); the steps that do not extend are the
# ones that finish their request.

# %%
extended = [any(e["phase"] == "extend" for e in r["kv"]["events"]) for r in t.steps]
print(f"steps that extend: {sum(extended)} of {len(t.steps)}; those that do not finish their request: "
      f"{[(r['request'], r['finish_reason']) for r, x in zip(t.steps, extended) if not x]}")
per_request = Counter(r["request"] for r in t.steps)
cut = sum(r["accept_len"] for r in t.steps) - sum(len(r["committed_tokens"]) for r in t.steps)
print(f"steps per request {dict(per_request)}; tokens accepted but cut at the limit: {cut}")

# %% [markdown]
# ## Live: the same steps on your machine
#
# The walkthrough's trace is committed, so no change to the engine can move what it shows. Run
# the same shape yourself (EAGLE tree (5, 4, 8), two held-out prompts, 16 tokens each) with
# plain decoding beside it, and check what every step of any run must satisfy: the accepted path
# follows the tree's parent links from the root; each accepted draft is the target's argmax after
# its parent (greedy), the bonus the argmax after the last one; COMMIT grows the target's KV by
# exactly accept_len (the root and the correct drafts; the bonus is the next step's root); and
# the output is plain decoding's, token for token.

# %%
from spectrace.zoo.prompts import HELD_OUT_PROMPTS  # noqa: E402

live, live_trace = run("02_live", algo="eagle", topk=4, prompts=HELD_OUT_PROMPTS[:2], max_new_tokens=16)
plain, _ = run("02_plain", algo="none", prompts=HELD_OUT_PROMPTS[:2], max_new_tokens=16)


def step_is_sound(r) -> bool:
    d, v, nodes = r["draft"], r["verify"], r["accept"]["accept_nodes"]
    parents = [None] + d["parents"]  # node j's parent; node 0 is the root
    tokens = [v["tokens"][0]] + d["tokens"]
    path_ok = nodes[0] == 0 and all(parents[b] == a for a, b in zip(nodes, nodes[1:]))
    greedy_ok = all(tokens[b] == v["target_predict"][a] for a, b in zip(nodes, nodes[1:])) and \
        r["bonus_token"] == v["target_predict"][nodes[-1]]
    drafts_ok = r["correct_drafts"] == [tokens[j] for j in nodes[1:]]
    before, after = r["kv"]["target_seq_len"]
    kv_ok = r["finish_reason"] is not None or after - before == r["accept_len"]
    return path_ok and greedy_ok and drafts_ok and kv_ok


live_steps = read_trace(live_trace.path).steps
print(f"live: {len(live_steps)} step records, all sound: {all(map(step_is_sound, live_steps))}; "
      f"the same text as plain decoding: {live.texts == plain.texts}")

# %% [markdown]
# ## Check yourself

# %%
# one prefill record per request, then one step record per request per step (= its verifies)
assert len(t.prefills) == len(t.summary["requests"]) == 2
assert sum(per_request.values()) == t.summary["metrics"]["verify_ct"]
# accept_len = correct + bonus; the accepted path starts at the root
assert rec["accept_len"] == len(rec["correct_drafts"]) + 1 and rec["accept"]["accept_nodes"][0] == 0
# the five phases each left their events: draft (scratch), verify (alloc), commit, extend
assert {phase for phase, _, _ in events} == {"draft", "verify", "commit", "extend"}
# scratch is given back within the draft phase: as many draft-pool slots freed as allocated
draft_ev = [e for e in rec["kv"]["events"] if e["phase"] == "draft"]
assert sum(len(e["slots"]) for e in draft_ev if e["op"] == "alloc") == \
    sum(len(e["slots"]) for e in draft_ev if e["op"] == "free")
# only a finishing step skips the draft extend
assert all(x or r["finish_reason"] for r, x in zip(t.steps, extended))
# the reading route's files are all here
from _lib import ROOT  # noqa: E402

route = ["spectrace/algos.py", "spectrace/run.py", "spectrace/core/engine.py", "spectrace/core/drafters/eagle_worker.py",
         "spectrace/core/tree.py", "spectrace/core/acceptance", "spectrace/core/acceptance/rejection.py",
         "spectrace/core/metrics.py"]
assert all((ROOT / path).exists() for path in route)
# every step of the committed run and of the live one: the path, the greedy verdicts, the KV
assert all(map(step_is_sound, t.steps)) and all(map(step_is_sound, live_steps))
assert live.texts == plain.texts  # speculation changed no token
# live: COMMIT keeps exactly the accepted path, so the target's KV grows by accept_len a step
assert all(s["kv"]["target_seq_len"][1] - s["kv"]["target_seq_len"][0] == s["accept_len"]
           for s in live_steps if not s["finish_reason"])
# the fixture's step 0 (a committed trace: these move only when it is remade)
expect("02", "step0_correct_drafts", rec["correct_drafts"])
expect("02", "step0_bonus_token", rec["bonus_token"])
expect("02", "step0_accept_nodes", rec["accept"]["accept_nodes"])
expect("02", "step0_kv_events", len(rec["kv"]["events"]))
expect("02", "cut_at_the_limit", cut)
print("all checks passed")
