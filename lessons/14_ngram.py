# %% [markdown]
# # 14 · n-gram drafting: vLLM's prompt lookup and SGLang's trie
#
# **Objectives.** Draft with no model at all: find the context's last n tokens earlier in the
# context and propose what followed them. Read vLLM's KMP search and its two matching policies
# (v0.8.5's first match, today's longest), count why KMP is linear, and run the n-gram drafters
# on text that does and does not repeat itself, beside SGLang's trie, which proposes a tree.
#
# **Chapter sections.** vLLM's chapter (`002`) §12.4.4, §12.7.4; SGLang end to end (`000`) §2
# (NGRAM), §11.
#
# > 最简单但在对的场景下惊人有效。原理：在已生成的上下文里找重复模式。 (《第12章 投机解码：以小博大》§12.4.4)
# > *The simplest, yet surprisingly effective in the right setting. The principle: look for repeated
# > patterns in the context generated so far.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## The proposer (002 §12.4.4)
#
# v0.8.5's `NgramProposer.propose` tries n = max_n down to min_n; for each it searches the
# context for an earlier occurrence of its own last n tokens, and the first occurrence found
# gives the proposal: the k tokens after it. vLLM's docstring example:

# %%
import numpy as np
from _lib import expect, run

from spectrace.compat.vllm import NgramProposer, _kmp_lps_array
from spectrace.core.ngram.lookup import propose_longest_match
from spectrace.zoo.prompts import REPEATING_PROMPTS

proposal = NgramProposer(min_n=2, max_n=3, k=4, max_model_len=1024).propose(np.array([1, 2, 3, 4, 2, 3]))
print("context [1, 2, 3, 4, 2, 3], n 2..3, k 4 ->", proposal.tolist())

# %% [markdown]
# [4, 2, 3] never occurred before the suffix, [2, 3] did (at index 1): the proposal is what followed
# it, cut short where the context ends.
#
# ## KMP: why the search is linear (002 §12.4.4)
#
# `lps[i]` is the length of the longest proper prefix of pattern[:i+1] that is also its suffix.
# After a mismatch KMP slides the pattern to that border instead of re-reading the text, so each
# text token is read a bounded number of times. Below: lps against its definition, then the
# character comparisons of a naive search and of KMP on the naive search's worst case.

# %%
def lps_by_definition(p):
    return [max(k for k in range(i + 1) if k <= i and p[:k] == p[i + 1 - k:i + 1]) for i in range(len(p))]


pattern = [1, 2, 1, 2, 1]
print("lps", _kmp_lps_array(np.array(pattern)).tolist(), " by definition", lps_by_definition(pattern))


def naive_comparisons(text, pat):
    count = 0
    for start in range(len(text) - len(pat) + 1):
        for j in range(len(pat)):
            count += 1
            if text[start + j] != pat[j]:
                break
        else:
            return count
    return count


def kmp_comparisons(text, pat):
    lps, count, i, j = _kmp_lps_array(np.array(pat)).tolist(), 0, 0, 0
    while i < len(text):
        count += 1
        if text[i] == pat[j]:
            i, j = i + 1, j + 1
            if j == len(pat):
                return count
        elif j:
            j = lps[j - 1]
        else:
            i += 1
    return count


text, pat = [0] * 4096 + [1], [0] * 8 + [1]  # the worst case of the naive search
naive, kmp = naive_comparisons(text, pat), kmp_comparisons(text, pat)
print(f"context 4097 tokens, n-gram of 9: naive {naive} comparisons, KMP {kmp}")

# %% [markdown]
# ## First match against longest match (002 §12.7.4)
#
# Today's vLLM looks for the *longest* suffix n-gram (up to max_n) that occurred before, in one KMP
# pass over the reversed context, and takes its earliest occurrence. v0.8.5 tries n from max_n down
# and takes the first occurrence too, so the two mostly agree; they part where an occurrence
# overlaps the suffix itself. v0.8.5 searches only the context before the suffix starts, so on a
# run of one token it cannot match n = 3 in five tokens and falls back to n = 2; today's search
# lets the occurrence overlap:

# %%
context = [1, 1, 1, 1, 1]
first = NgramProposer(2, 3, 3, 1024).propose(np.array(context))
longest = propose_longest_match(context, 2, 3, 3, 1024)
print("v0.8.5 first match:", first.tolist(), "  longest match:", longest.tokens, f"(n {longest.n})")

# %% [markdown]
# ## Live: text that repeats, and text that does not
#
# On held-out prose the context rarely repeats 5 tokens, so most steps propose nothing and decode
# plainly. On code that repeats itself (a class whose accessors follow one pattern) the matches
# copy whole accessors. SGLang's NGRAM keeps a trie of recent n-grams and proposes a *tree* of
# its likeliest continuations (`--ngram-style sglang`; 000 §2, §11).

# %%
held_out, _ = run("14_held_out", algo="ngram")
repeat = {name: run(f"14_{name}", algo="ngram", prompts=REPEATING_PROMPTS, max_new_tokens=48, **opts)[0]
          for name, opts in (("first 5..5", {}),
                             ("longest 2..5", dict(ngram_match="longest", prompt_lookup_min=2, prompt_lookup_max=5)),
                             ("sglang trie", dict(ngram_style="sglang")))}
print(f"held-out prose, first match 5..5: tau {held_out.metrics['accept_length']:.3f} "
      f"({held_out.metrics['vllm']['num_drafts']} of {held_out.metrics['verify_ct']} steps proposed)")
for name, r in repeat.items():
    print(f"repeating code, {name}: tau {r.metrics['accept_length']:.3f}, verify_ct {r.metrics['verify_ct']}")

# %% [markdown]
# ## Check yourself

# %%
# vLLM's docstring example
assert proposal.tolist() == [4, 2, 3]
# lps is the border function, and KMP reads each token at most twice
assert _kmp_lps_array(np.array(pattern)).tolist() == lps_by_definition(pattern) == [0, 0, 1, 2, 3]
assert kmp <= 2 * len(text) < naive
# the two policies differ where an occurrence overlaps the suffix: v0.8.5 falls back to n 2
assert first.tolist() == [1, 1, 1] and longest.n == 3 and longest.tokens == [1, 1]
# repeating code is where n-gram pays: every policy beats the held-out prose's τ
assert all(r.metrics["accept_length"] > held_out.metrics["accept_length"] + 1 for r in repeat.values())
assert held_out.texts == run("14_none", algo="none")[0].texts  # and greedy stays lossless
expect("14", "tau held-out", held_out.metrics["accept_length"])
for name, r in repeat.items():
    expect("14", f"tau repeating {name}", r.metrics["accept_length"])
print("all checks passed")
