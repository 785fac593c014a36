# %% [markdown]
# # 05 · Chains and greedy verification
#
# **Objectives.** Run SGLang's greedy verification by hand on a chain and on a small tree, read
# its in-place outputs (`predicts`, `accept_index`, `accept_token_num`), and see a live chain's
# shape: its parents, depths, causal mask and positions, and the k + 1 rows one verify scores.
#
# **Chapter sections.** SGLang end to end (`000`) §6.1, §7, §7.1; vLLM's chapter (`002`) §12.2.4,
# §12.3.1, §12.3.2.
#
# > 某层拒绝 → 该层之后全部丢弃（不回头试更深层）。 (《投机解码（Speculative Decoding）端到端深挖》§7)
# > *A level rejected: everything after it is dropped (no going back to try deeper ones).*
#
# > draft_token == target_token → 接受
# > draft_token != target_token → 拒绝，用 target 的 argmax (《第12章 投机解码：以小博大》§12.2.4)
# > *The draft's token equals the target's: accept; it differs: reject, and take the target's argmax.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## The chapter's chain, through SGLang's kernel signature (000 §6.1, §7.1)
#
# Draft A → B → C; the target's greedy choices after the root, A and B are A, B and X. The walk
# accepts A and B, stops at C, and writes the target's X as the bonus. `verify_tree_greedy`
# (sgl-kernel's signature; `spectrace.compat.sglang`) fills `predicts` at each accepted node's
# row with the token that follows it, `accept_index` with the accepted path's rows (root first)
# and `accept_token_num` with the number of accepted drafts.

# %%
import torch
from _lib import at, expect, run, screen

from spectrace.compat.sglang import verify_tree_greedy
from spectrace.core.trace_reader import read_trace

R, A, B, C, X, Y = 100, 1, 2, 3, 9, 8


def greedy(candidates, next_token, next_sibling, target_predict, num_spec_step):
    """One call of SGLang's greedy verify on bs requests of n nodes; returns its three outputs."""
    bs, n = len(candidates), len(candidates[0])
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec_step), -1, dtype=torch.int32)
    accept_token_num = torch.zeros(bs, dtype=torch.int32)
    retrive_index = torch.arange(bs * n).view(bs, n)
    verify_tree_greedy(predicts, accept_index, accept_token_num, torch.tensor(candidates), retrive_index,
                       torch.tensor(next_token), torch.tensor(next_sibling), torch.tensor(target_predict))
    return predicts.tolist(), accept_index.tolist(), accept_token_num.tolist()


# root R, then A, B, C in a chain; the target's argmax after each row: A after R, B after A, X after B, Y after C
chain = greedy([[R, A, B, C]], [[1, 2, 3, -1]], [[-1, -1, -1, -1]], [[A, B, X, Y]], num_spec_step=4)
print("predicts", chain[0], " accept_index", chain[1], " accept_token_num", chain[2])

# %% [markdown]
# `predicts` [A, B, X, -1]: the root's row holds A (accepted), A's row B, B's row the bonus X, and
# C's row nothing (rejected, never a parent). The path is rows [0, 1, 2]: the root and two
# correct drafts; accept_len = 2 + 1.

# %% [markdown]
# ## A tree: sgl-kernel's own test vector
#
# The same kernel walks trees level by level, trying a node's children in sibling order
# (`retrive_next_token` is a node's first child, `retrive_next_sibling` its next sibling). These
# two requests of 6 nodes are the inputs of sgl-kernel's `test_eagle_utils.py`; the target's
# argmax after each row is 3, 4, 5, 11, 12 at the rows the test marks and 18 elsewhere.

# %%
candidates = [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]]
next_token = [[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]]
next_sibling = [[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]]
argmax = [[3, 18, 18, 4, 5, 18], [11, 18, 18, 18, 12, 18]]
tree = greedy(candidates, next_token, next_sibling, argmax, num_spec_step=4)
print("predicts", tree[0])
print("accept_index", tree[1], " accept_token_num", tree[2])

# %% [markdown]
# Request 0: the root's children are node 1 (token 1) and its sibling node 3 (token 3); the
# target wants 3, so the walk skips node 1 and accepts node 3, then node 4 (4), then node 5 (5),
# and the bonus after it is 18. Request 1 accepts node 4 (token 11, the first child) and node 5
# (12). Rejecting node 1 did not end the walk: a level fails only when no sibling matches.

# %% [markdown]
# ## A live chain (002 §12.3.1, §12.3.2)
#
# `spectrace run --algo standalone --topk 1 --num-steps 5`: the draft LM proposes 5 tokens one
# forward at a time, and one target forward scores 6 rows: after the root and after each draft.
# The tree of a chain is a line: each node's parent is the one before, its mask row sees the
# root and every earlier node (a causal mask), and its position is the prefix length plus its
# depth.

# %%
result, trace = run("05_chain", algo="standalone", topk=1, num_steps=5)
t = read_trace(trace.path)
first = t.steps[0]
print("parents", first["draft"]["parents"], " depths", first["draft"]["depths"])
print("tree mask rows", first["draft"]["tree_mask"])
print("verify rows", len(first["verify"]["tokens"]), " positions", first["verify"]["positions"])
print(screen(trace, at("VERIFY"), size=(110, 30), name="05_chain_verify"))

# %% [markdown]
# ## Check yourself

# %%
# the chapter's chain: A and B correct, X the bonus, C never a parent
assert chain == ([A, B, X, -1], [[0, 1, 2, -1]], [2])
# sgl-kernel's expected outputs for its own vector
assert tree[0] == [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
assert tree[1] == [[0, 3, 4, 5], [6, 10, 11, -1]] and tree[2] == [3, 2]
# a live chain of 5: a line of parents, a causal mask, consecutive positions, 6 verify rows
for rec in t.steps:
    if rec["draft"] is None:
        continue
    k = len(rec["draft"]["tokens"])
    assert rec["draft"]["parents"] == list(range(k)) and rec["draft"]["depths"] == list(range(1, k + 1))
    assert rec["draft"]["tree_mask"] == ["1" * (i + 1) + "0" * (k - i) for i in range(k + 1)]
    positions = rec["verify"]["positions"]
    assert len(positions) == k + 1 and positions == list(range(positions[0], positions[0] + k + 1))
    assert 1 <= rec["accept_len"] <= k + 1
    # greedy: the bonus is the target's argmax after the last accepted node
    last = rec["accept"]["accept_nodes"][-1]
    assert rec["bonus_token"] == rec["verify"]["target_predict"][last]
m = result.metrics
expect("05", "chain_verify_ct", m["verify_ct"])
expect("05", "chain_tau", m["accept_length"])
expect("05", "chain_correct_of_proposed", [m["num_correct_drafts"], m["num_proposed_drafts"]])
print("all checks passed")
