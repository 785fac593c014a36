# %% [markdown]
# # 13 · The drafter zoo: who proposes the tokens
#
# **Objectives.** Run every drafter spectrace has on the same prompt, greedy, and compare what
# they buy (τ, α, target forwards) and what they cost (which KV they keep, how many forwards a
# draft takes); see that under greedy acceptance every one of them produces the target's own
# text; meet the details that set them apart (EAGLE-3's reduced vocabulary, NEXTN resolved to the
# EAGLE worker, Medusa's static tree, DFLASH's one-pass block).
#
# **Chapter sections.** SGLang end to end (`000`) §2, §11; vLLM's chapter (`002`) §12.4, §12.4.1,
# §12.4.2, §12.4.3; SGLang's ModelRunner section (`004`) §2, §3.
#
# > 无独立 MTP enum：MTP 走 EAGLE/NEXTN + 内置 MTP 头。 (《投机解码（Speculative Decoding）端到端深挖》§2)
# > *There is no MTP enum of its own: MTP goes through EAGLE/NEXTN plus the model's built-in MTP head.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## One prompt, every drafter, greedy (000 §2, §11; 002 §12.4, §12.4.1, §12.4.3)
#
# Each runs at SGLang's automatic shape for a Llama target (the (5, 4, 8) tree for the EAGLE
# family, a (3, 1, 4) chain for the standalone LM; Medusa's 24 paths; DFLASH's block of 8), on the
# embedded models, 24 tokens.

# %%
from _lib import expect, run, show

from spectrace.algos import ALGOS

import matplotlib.pyplot as plt  # noqa: E402

DRAFTERS = ["standalone", "eagle", "eagle3", "nextn", "frozen_kv_mtp", "medusa", "dflash", "ngram"]
results, traces = {}, {}
for algo in ["none"] + DRAFTERS:
    results[algo], traces[algo] = run(f"13_{algo}", algo=algo)
print(f"{'algo':<14} {'resolved':<14} {'steps,topk,n':>12} {'tau':>6} {'alpha':>6} {'verify_ct':>9}  draft KV")
for algo in DRAFTERS:
    m, t = results[algo].metrics, traces[algo]
    c = t.header["config"]
    has_draft_kv = "draft_seq_len" in t.step(0)["kv"]
    print(f"{algo:<14} {c['resolved_algorithm']:<14} {c['num_steps']:>4},{c['topk']},{c['num_draft_tokens']:<5} "
          f"{m['accept_length']:>6.3f} {m['accept_rate'] or 0:>6.3f} {m['verify_ct']:>9}  "
          f"{'yes' if has_draft_kv else 'no'}")

fig, ax = plt.subplots(figsize=(6.5, 2.6))
ax.bar(DRAFTERS, [results[a].metrics["accept_length"] for a in DRAFTERS])
ax.set_ylabel("tau")
ax.tick_params(axis="x", labelsize=7, rotation=30)
fig.tight_layout()
show(fig, "13_drafters")

# %% [markdown]
# What the table says:
# - **Heads that read the target's features** (EAGLE, EAGLE-3, NEXTN/MTP) accept the most: they
#   continue the target's own hidden state instead of guessing from tokens alone.
# - **NEXTN** is resolved to the EAGLE worker (SGLang's `SpeculativeAlgorithm` does this): the same
#   draft loop and tree, an MTP module as the head.
# - **FROZEN_KV_MTP** keeps no draft KV: its queries read the target's KV, frozen at the root.
# - **Medusa**'s heads each guess one position from the same hidden state, so its 24-path static
#   tree buys width, not depth. **DFLASH** drafts its whole block in one non-causal pass.
# - **n-gram** needs no model and keeps no KV; on prose that does not repeat itself it rarely finds
#   a match and most steps are plain decodes (lesson 14).
#
# > **Erratum (004 §3, §2: 「speculative decoding 怎样进入 ModelRunner」, 「一张图先看整体结构」).** The
# > ModelRunner text lists SGLang's modes as 「EAGLE / EAGLE2」, 「DRAFT_MODEL」 and 「MEDUSA」.
# > SGLang's `SpeculativeAlgorithm` has none of the last three: its members are EAGLE, EAGLE3,
# > STANDALONE, NGRAM, DFLASH and FROZEN_KV_MTP (and NONE), NEXTN resolving to EAGLE, or to
# > FROZEN_KV_MTP on a Gemma 4 target (server_args' `_resolve_speculative_algorithm`), as 000 §2's
# > table has it: 「别名→多为 EAGLE；Gemma4→FROZEN_KV_MTP」. EAGLE-2 is
# > not a mode but EAGLE drafting a tree (topk > 1, lesson 06); a separate small LM is
# > STANDALONE; Medusa heads are vLLM's (V0), which spectrace also runs, under its own name. The
# > text places the acceptance in `speculative_algorithm.verify_step(...)`; SGLang verifies in the
# > EAGLE worker's `verify()`, whose walk is `eagle_sample()` (lesson 02). And where it says a
# > target forward over 「K+1 个位置」 「等于原本 K 次 autoregressive decode」, it is worth up to
# > K + 1: the K drafts and the bonus (lessons 01 and 03).
#
# ## EAGLE-3 drafts over its own vocabulary (002 §12.4.2)
#
# Its lm_head scores `draft_vocab_size` tokens, mapped to target ids by `d2t` (SGLang's
# `hot_token_id`); every other target token gets -inf, so it can never be proposed.

# %%
import torch  # noqa: E402

from spectrace.core.drafters.eagle3 import load_eagle3  # noqa: E402
from spectrace.core.model import load_model  # noqa: E402
from spectrace.zoo import EAGLE3_DIR, TARGET_DIR  # noqa: E402

head = load_eagle3(EAGLE3_DIR, load_model(TARGET_DIR, torch.float32))
hot = set(head.hot_token_id.tolist())
proposed = {tok for i in range(len(traces["eagle3"].index)) for tok in traces["eagle3"].step(i)["draft"]["tokens"]}
print(f"draft vocabulary {len(hot)} of {head.config.vocab_size}; the run proposed {len(proposed)} distinct tokens, "
      f"all in it: {proposed <= hot}")

# %% [markdown]
# ## Check yourself

# %%
# greedy acceptance is lossless: every drafter gives plain decoding's text
assert all(results[a].texts == results["none"].texts for a in DRAFTERS)
# SGLang's names: no EAGLE2 or DRAFT_MODEL mode (a tree is EAGLE, a small LM STANDALONE)
assert traces["eagle"].header["config"]["resolved_algorithm"] == "EAGLE"
assert traces["standalone"].header["config"]["resolved_algorithm"] == "STANDALONE"
# the names SGLang resolves: NEXTN and MTP run the EAGLE worker
assert traces["nextn"].header["config"]["resolved_algorithm"] == "EAGLE" == ALGOS["mtp"].resolved
# shapes: Medusa's 24 paths over 3 heads, DFLASH's block of 8, the EAGLE tree
shape = lambda a: tuple(traces[a].header["config"][k] for k in ("num_steps", "topk", "num_draft_tokens"))  # noqa: E731
assert shape("medusa")[2] == 25 and shape("dflash") == (7, 1, 8) and shape("eagle") == (5, 4, 8)
# who keeps a draft KV
assert "draft_seq_len" not in traces["frozen_kv_mtp"].step(0)["kv"] and "draft_seq_len" in traces["eagle"].step(0)["kv"]
# EAGLE-3 proposes only tokens of its draft vocabulary
assert proposed <= hot and len(hot) < head.config.vocab_size
for algo in DRAFTERS:
    expect("13", f"tau {algo}", results[algo].metrics["accept_length"])
print("all checks passed")
