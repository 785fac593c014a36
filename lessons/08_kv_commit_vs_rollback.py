# %% [markdown]
# # 08 · The KV cache after a verify: SGLang's commit and free, vLLM's rollback
#
# **Objectives.** Say where a verify writes the target's K/V, what becomes of the rows the walk
# rejected in SGLang (their slots freed, the accepted ones kept) and in vLLM (a counter rolled
# back, the stale slots overwritten next step), and check on a live run that both give the same
# tokens.
#
# **Chapter sections.** vLLM's chapter (`002`) §12.3.4; SGLang's ModelRunner section (`004`) §7.
#
# > 写进目标模型 KV Cache 的不是 draft 阶段，而是 verify 那一次 forward——它把这一步调度到的全部 k+1 个位置的 K/V 都算好并写进了块里。 (《第12章 投机解码：以小博大》§12.3.4)
# > *What writes the target's KV cache is not the draft phase but the one verify forward: it computes
# > the K/V of all k+1 positions scheduled this step and writes them into the blocks.*
#
# > V1 不做任何物理擦除，只是把进度指针往回拨。 (《第12章 投机解码：以小博大》§12.3.4)
# > *vLLM V1 erases nothing; it only moves the progress pointer back.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## One chain, two commit styles
#
# `spectrace run --algo standalone --topk 1 --num-steps 5 --commit-style sglang|vllm`: the same
# draft LM and target, greedy, 24 tokens. Each verify scores 6 rows (the root and 5 drafts); the
# target's K/V of all 6 rows is written into the target's pool by that one forward.

# %%
from _lib import at, expect, run, screen

from spectrace.core.trace_reader import read_trace

runs = {style: run(f"08_{style}", algo="standalone", topk=1, num_steps=5, commit_style=style)
        for style in ("sglang", "vllm")}
traces = {style: read_trace(trace.path) for style, (_, trace) in runs.items()}


def target_events(rec):
    return [e for e in rec["kv"]["events"] if e["pool"] == "target"]


for style, t in traces.items():
    print(f"--- {style}")
    for rec in t.steps[:2]:
        print(f"step {rec['step']}: accept_len {rec['accept_len']}")
        for e in target_events(rec):
            fields = {k: v for k, v in e.items() if k not in ("pool", "op", "req", "phase", "tokens")}
            print(f"   {e['phase']:<7} {e['op']:<9} {fields}")

# %% [markdown]
# **SGLang** (page size 1) maps each verify row to a fresh slot (`alloc`), and at commit keeps
# the accepted path's slots as the next positions of `req_to_token` (`commit`) and returns the
# rest to the allocator (`free`). **vLLM** keeps a request's blocks: a position that had a slot
# keeps it; commit only rolls `num_computed_tokens` back by the rejected rows (`rollback`), and
# the next verify `reuse`s those stale slots, overwriting their K/V. Neither copies K/V for a
# chain; for a tree, whose accepted nodes need not be the first rows, vLLM-style commits move the
# kept rows down (`move`, SGLang's `move_kv_cache`).
#
# The ModelRunner section (004 §7) describes draft K/V going to a `speculative_kv_buffer` and
# "only the accepted tokens' KV" being committed to the main pool. For the target's K/V, what
# the trace shows is the verify writing every row into the main pool and commit keeping or
# rolling back; the separate, short-lived K/V is the drafter's: its draft-phase slots in the
# draft's own pool, freed once the tree is built (lesson 02).

# %%
print(screen(runs["vllm"][1], at("COMMIT"), size=(110, 32), name="08_vllm_commit"))

# %% [markdown]
# ## Check yourself

# %%
(sg_result, _), (vl_result, _) = runs["sglang"], runs["vllm"]
# both styles give the same tokens and the same τ
assert sg_result.texts == vl_result.texts
assert sg_result.metrics["accept_length"] == vl_result.metrics["accept_length"]
for rec in traces["sglang"].steps:
    rows = len(rec["verify"]["tokens"])
    ev = {e["op"]: e for e in target_events(rec) if e["phase"] == "commit"}
    # keep accept_len slots (the path), free the other rows; the sequence grows by accept_len
    assert len(ev["commit"]["slots"]) == rec["accept_len"]
    assert len(ev.get("free", {"slots": []})["slots"]) == rows - rec["accept_len"]
    assert ev["commit"]["seq_len_after"] - ev["commit"]["seq_len_before"] == rec["accept_len"]
previous_stale = None
for rec in traces["vllm"].steps:
    rows = len(rec["verify"]["tokens"])
    (rollback,) = [e for e in target_events(rec) if e["op"] == "rollback"]
    # roll back the rejected rows; a step frees no slot (only a finished request returns its slots)
    assert rollback["num_rejected"] == rows - rec["accept_len"]
    assert rollback["num_computed_tokens_before"] - rollback["num_computed_tokens_after"] == rollback["num_rejected"]
    assert all(e["phase"] == "finish" for e in target_events(rec) if e["op"] == "free")
    # the next verify writes over the stale slots it left
    if previous_stale:
        reused = [s for e in target_events(rec) if e["op"] == "reuse" for s in e["slots"]]
        assert reused == previous_stale
    previous_stale = rollback["stale_slots"]
expect("08", "chain_tau", sg_result.metrics["accept_length"])
expect("08", "chain_verify_ct", sg_result.metrics["verify_ct"])
print("all checks passed")
