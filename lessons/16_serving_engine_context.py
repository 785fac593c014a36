# %% [markdown]
# # 16 · Around the loop: CUDA graphs, overlap, buckets and wasted rows
#
# **Objectives.** See what a serving engine wraps around the speculative step, using spectrace's
# fast engine (`--backend fast`, `spectrace/fast/engine.py`), which does it the way SGLang does:
# each phase a fixed-shape CUDA graph per batch bucket, the next step launched before the last one
# is read (overlap), finished requests frozen in their rows. Count what the fixed shapes cost:
# padded rows and verify rows that are thrown away.
#
# **Chapter sections.** SGLang end to end (`000`) §3, §3.1, §10, §10.1, §10.2, §10.3, §14; vLLM's
# chapter (`002`) §12.1.2, §12.6, §12.6.3, §12.6.4, §12.7.1, §12.7.2, §12.7.3.
#
# > 投机一步有 三个 GPU 阶段、两套模型、三种 token 布局，所以不能共用一张 graph——每阶段各自 capture 一套 runner。 (《投机解码（Speculative Decoding）端到端深挖》§10.3)
# > *A speculative step has three GPU phases, two models and three token layouts, so it cannot share
# > one graph: each phase captures a runner of its own.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## SGLang's automatic shape (000 §3, §14)
#
# With no shape given, SGLang picks (5, 4, 8) for an EAGLE-family head on a Llama target, and a
# (3, 1, 4) chain otherwise (STANDALONE among them):

# %%
import os

import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # the fast engine's kernels, interpreted on this CPU's tensors
from _lib import ROOT, run, show  # noqa: E402

from spectrace.core.acceptance import RULES
from spectrace.core.request import Request
from spectrace.core.trace_reader import read_trace
from spectrace.fast.graphs import BUCKETS, bucket
from spectrace.loading.models import load_drafter_model
from spectrace.run import RunConfig, build_engine, load_tokenizer, resolve
from spectrace.core.model import load_model
from spectrace.zoo.prompts import HELD_OUT_PROMPTS

shapes = {algo: tuple(getattr(resolve(RunConfig(algo=algo))[0], k) for k in ("num_steps", "topk", "num_draft_tokens"))
          for algo in ("eagle", "eagle3", "mtp", "standalone")}
print(shapes)

# %% [markdown]
# ## Fixed shapes per phase (000 §10, §10.3)
#
# A CUDA graph replays the same kernels on the same buffers, so every phase has one shape per
# batch bucket. For a batch of 3 requests (bucket 4) of an EAGLE (5, 4, 8) tree:
# - DRAFT: num_steps - 1 forwards of bs x topk rows (the kept paths of each level);
# - VERIFY: bs x num_draft_tokens rows, the whole tree of every request;
# - EXTEND: bs x (num_steps + 1) rows, each request's accepted tokens padded to the longest a step
#   can accept (the explicit engine extends only the accepted rows).
#
# > **Erratum, or rather a choice (000 §10.3).** The SGLang text sizes its draft-extend graph
# > (`EAGLEDraftExtendCudaGraphRunner`, mode DRAFT_EXTEND_V2) as 「bs × speculative_num_draft_tokens」:
# > SGLang's V2 worker runs the draft over the whole verify window and keeps the accepted rows.
# > spectrace's fast engine sizes it by what a step can accept, num_steps + 1 (the shape of
# > SGLang's V1 draft extend), which for (5, 4, 8) is 6 rows a request instead of 8.
# The fast engine runs here on the CPU, eagerly, with the Triton kernels interpreted: the same
# code as on a GPU, where each phase is replayed from a graph. We count the rows each forward
# reads by wrapping the models' forwards:

# %%
cfg = RunConfig(algo="eagle", batch=3, max_new_tokens=8)
spec, _ = resolve(cfg)
tok = load_tokenizer(cfg.target_model)
target = load_model(cfg.target_model, torch.float32)
draft = load_drafter_model("eagle", cfg.draft_path, target, tok, torch.float32, "cpu")
prompts = [tok.encode(p) for p in HELD_OUT_PROMPTS[:3]]
rows = []
for name, model in (("target", target), ("draft", draft)):
    forward = model.forward
    model.forward = (lambda batch, *a, _f=forward, _n=name, **k:
                     rows.append((_n, len(batch.input_ids))) or _f(batch, *a, **k))
engine = build_engine(target, draft, spec, prompts, [], backend="fast")
engine.prefill([Request(i, p) for i, p in enumerate(prompts)])
rows.clear()
out = engine.runner.step(engine.tier)  # one step's DRAFT, VERIFY + ACCEPT + COMMIT and EXTEND, eagerly
print("bucket for 3 requests:", engine.runner.bs, " forwards of one step (model, rows):", rows)
# what the batched walk accepted, request by request, beside the explicit greedy walk over the same trees
fast_accepted = out.verdict.accept_num.tolist()[:3]
tree, n_nodes = out.tree, out.tree.num_nodes
explicit_accepted = [len(RULES["greedy"].walk(
    tree.draft_tokens[b].tolist(), tree.retrive_next_token[b].tolist(), tree.retrive_next_sibling[b].tolist(),
    out.target_predict.view(-1, n_nodes)[b].tolist(), None, None, None, spec.num_steps, spec.rule_params).correct_drafts)
    for b in range(3)]
print("correct drafts, fast walk:", fast_accepted, " explicit walk:", explicit_accepted)

# %% [markdown]
# ## Wasted verify rows (002 §12.6, §12.6.3)
#
# Every verify computes all n rows of every tree; only accept_len of them are kept. On a run of
# the same three requests (explicit engine, eagle (5, 4, 8), 16 tokens each):

# %%
_, live = run("16_live", algo="eagle", prompts=HELD_OUT_PROMPTS[:3], batch=3, max_new_tokens=16)
live_steps = read_trace(live.path).steps
verified = sum(len(s["verify"]["tokens"]) for s in live_steps)
kept = sum(s["accept_len"] for s in live_steps)
print(f"{len(live_steps)} step records: {verified} verify rows, {kept} kept, {verified - kept} thrown away "
      f"({(verified - kept) / verified:.0%})")
trace = read_trace(ROOT / "tests/data/walkthrough.jsonl")  # its timings draw the overlap below

# %% [markdown]
# At batch 1 those rows are nearly free (002 §12.1.2): the GPU is waiting on memory, not arithmetic (lesson 01).
# As the batch grows the verify becomes compute-bound and the wasted rows start to cost what they
# compute, the reason speculation pays less at large batch (vLLM §12.6; docs/benchmarks.md's batch-scaling lab
# measures it on the H200).
#
# ## What a running request costs, and when to stop drafting
#
# > 这是保守默认值，不是算法硬约束。原因是开 spec 后每个 running request 比普通 AR 更贵： (《投机解码（Speculative Decoding）端到端深挖》§3.1)
# > *(SGLang's max_running_requests of 48 with speculation on) is a conservative default, not a
# > hard constraint of the algorithm: with speculation on, every running request costs more than
# > under plain decoding.*
#
# The first cost the text names is KV: each request reserves room for a whole tree besides its
# committed tokens. The fast engine sizes its per-request KV row the same way; compare the rows it
# reserves for plain decoding and for the (5, 4, 8) tree, same prompts, same token budget:

# %%
none_spec, _ = resolve(RunConfig(algo="none", batch=3, max_new_tokens=8))
plain_engine = build_engine(target, None, none_spec, prompts, [], backend="fast")
columns = {"none": plain_engine.runner.kv.req_to_token.shape[1], "eagle": engine.runner.kv.req_to_token.shape[1]}
print(f"KV columns a request reserves: plain decoding {columns['none']}, eagle (5, 4, 8) {columns['eagle']}")

# %% [markdown]
# The second cost is the verify's rows (above), which is why speculation should stop at some
# batch size. vLLM v0.8.5 had a knob for it, in V0 only:
#
# > 配置层有 disable_by_batch_size，但它只被 V0 的 SpecDecodeWorker 读取：运行队列长度 ≥ 阈值时，把本步各请求的投机长度置 0，且这些请求此后不再投机（vllm/spec_decode/spec_decode_worker.py:553-571）；V1 全目录不读这个字段。 (《第12章 投机解码：以小博大》§12.6.4)
# > *The config has disable_by_batch_size, but only V0's SpecDecodeWorker reads it: once the
# > running queue reaches the threshold, every request's speculative length is set to 0 for this
# > step and they never speculate again; nothing in V1 reads the field.*
#
# SGLang keys its adaptive steps on the batch size instead (0 steps: no drafting), and spectrace's
# `--batch-policy` chooses the shape by the run's number of requests, `off` where drafting cannot
# pay (docs/kernel-budget.md measures where that is). With drafting off at 3 requests and on at 1:

# %%
policy = '{"1": [5, 4, 8], "3": "off"}'
by_batch = {}
for batch in (1, 3):
    result, run_trace = run(f"16_policy_{batch}", algo="eagle", batch_policy=policy, prompts=HELD_OUT_PROMPTS[:batch],
                            batch=batch, max_new_tokens=8)
    by_batch[batch] = (run_trace.header["batch_policy"]["shape"], result.metrics["num_proposed_drafts"])
    print(f"batch {batch}: shape {by_batch[batch][0]}, drafts proposed {by_batch[batch][1]}")

# %% [markdown]
# ## One flag in vLLM v0.8.5 (002 §12.7.1, §12.7.2, §12.7.3)
#
# > v0.8.5 的 EngineArgs 里，投机解码只暴露一个命令行参数： (《第12章 投机解码：以小博大》§12.7.1)
# > *v0.8.5's EngineArgs expose a single command-line argument for speculative decoding:*
#
# `--speculative-config`, a JSON of SpeculativeConfig's fields. spectrace takes the same flag and
# maps it as vLLM's SpeculativeConfig does: every vLLM drafter proposes a chain of
# num_speculative_tokens. Two of the text's examples:

# %%
from spectrace.speculative_config import parse  # noqa: E402

eagle_template = parse('{"method": "eagle", "model": "tiny-eagle", "num_speculative_tokens": 5}')
deepseek_mtp = parse('{"method": "deepseek_mtp", "num_speculative_tokens": 3}')
print("eagle, k 5:", eagle_template)
print("deepseek_mtp, k 3:", deepseek_mtp)

# %% [markdown]
# The text's point about the second (§12.7.3): in v0.8.5 its V1 engine accepted only ngram, eagle
# and eagle3, so `deepseek_mtp` fell back to V0 (or failed with VLLM_USE_V1=1). Later vLLM
# versions rewrite every `*_mtp` method to `mtp` and run it in V1; spectrace follows them, so here
# it is an MTP chain of 3.
#
# ## Overlap (000 §10.1, §10.2)
#
# SGLang publishes a step's results right after VERIFY and schedules the next step while the GPU
# still runs this one's DRAFT_EXTEND. spectrace's fast engine does the same, one step ahead: with
# no trace to write it launches step t+1's graphs, then reads step t's tokens, so the host's EOS
# checks and bookkeeping run while the GPU works. A request that finished runs one step more,
# frozen (its `live` flag is cleared only after its tokens are read). A timeline of a synced step
# against an overlapped one, from the phase times of the walkthrough's trace and a host cost per
# step (illustrative, not measured):

# %%
import matplotlib.pyplot as plt  # noqa: E402

t = trace.steps[0]["timing"]
phases = [(p, t[p]) for p in ("draft", "verify", "accept", "commit", "extend") if p in t]
host = 0.3 * sum(ms for _, ms in phases)
fig, ax = plt.subplots(figsize=(6.5, 1.8))
for lane, overlapped in ((1, False), (0, True)):
    x = 0.0
    for step in range(3):
        for p, ms in phases:
            ax.barh(lane, ms, left=x, color=f"C{[q for q, _ in phases].index(p)}", edgecolor="white")
            x += ms
        if not overlapped:
            ax.barh(lane, host, left=x, color="lightgrey", edgecolor="white")
            x += host
ax.set_yticks([0, 1], ["overlapped", "synced"])
ax.set_xlabel("ms (three steps; grey: the host's part)")
fig.tight_layout()
show(fig, "16_overlap")

# %% [markdown]
# ## Check yourself

# %%
# SGLang's automatic shapes
assert shapes == {"eagle": (5, 4, 8), "eagle3": (5, 4, 8), "mtp": (5, 4, 8), "standalone": (3, 1, 4)}
# buckets: a batch of 3 runs in the bucket of 4; the largest is 64
assert bucket(3) == 4 and engine.runner.bs == 4 and BUCKETS[-1] == 64
# the step's forwards: 4 draft levels of bs x topk rows, one verify of bs x n, one extend of bs x (S + 1)
S, K, n = shapes["eagle"]
assert rows == [("draft", 4 * K)] * (S - 1) + [("target", 4 * n), ("draft", 4 * (S + 1))]
# the batched walk accepts what the explicit walk accepts over the same trees, and something at all
assert fast_accepted == explicit_accepted and sum(fast_accepted) > 0
# a request reserves more KV under speculation: room for the tree's nodes and the accepted tail
assert columns["eagle"] > columns["none"]
# --batch-policy: the tree at batch 1, plain decoding (no drafts) at batch 3
assert by_batch[1] == ([5, 4, 8], by_batch[1][1]) and by_batch[1][1] > 0 and by_batch[3] == (None, 0)
# vLLM's JSON: an eagle chain of 5; deepseek_mtp rewritten to mtp, a chain of 3
assert (eagle_template["algo"], eagle_template["num_steps"], eagle_template["topk"]) == ("eagle", 5, 1)
assert (deepseek_mtp["algo"], deepseek_mtp["num_draft_tokens"]) == ("mtp", 4)
# every live verify computed the whole tree of 8 nodes; what it kept fits the extend's S + 1 rows
assert all(len(s["verify"]["tokens"]) == n for s in live_steps)
assert all(1 <= s["accept_len"] <= S + 1 for s in live_steps) and kept < verified
print("all checks passed")
