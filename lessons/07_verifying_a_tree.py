# %% [markdown]
# # 07 · One forward over a tree: mask, positions, retrive lists, cu_seqlens
#
# **Objectives.** Read what a verify forward is given for a tree: the tree mask (which nodes a
# node sees), the RoPE positions (a node's depth, not its column), the retrive lists the walk
# follows, and the packed lengths that let one attention call serve a batch; and see why a
# chain needs no mask beyond the causal one.
#
# **Chapter sections.** vLLM's chapter (`002`) §12.3.3; SGLang end to end (`000`) §9.
#
# > spec decode 对 attention backend 来说，无非是"每个 decode 请求的 Q 长度从 1 变成 k+1" (《第12章 投机解码：以小博大》§12.3.3)
# > *To the attention backend, spec decode only changes each decoding request's Q length from 1 to k+1.*
#
# **Time.** About 15 minutes. The tree is step 0 of the committed trace
# `tests/data/walkthrough.jsonl` (EAGLE, topk 4, 8 nodes).

# %%
import torch
from _lib import WALKTHROUGH, expect, show

from spectrace.compat.sglang import reconstruct_indices_from_tree_mask
from spectrace.compat.vllm import calc_spec_decode_metadata
from spectrace.core.trace_reader import read_trace

t = read_trace(WALKTHROUGH)
rec = t.steps[0]
draft, verify = rec["draft"], rec["verify"]
n = len(draft["tree_mask"])
parents = [None] + draft["parents"]  # node 0 is the root
print("nodes", n, " parents", parents[1:], " depths", draft["depths"])
print("positions", verify["positions"])
print("tree mask rows (QLEN_ONLY):", draft["tree_mask"])
print("retrive_next_token", draft["retrive_next_token"], " retrive_next_sibling", draft["retrive_next_sibling"])

# %% [markdown]
# ## What a node sees, and where it sits
#
# Row j of the tree mask marks the nodes j attends to among the step's new tokens: itself and
# its ancestors. With the committed prefix in front (all visible), SGLang's FULL_MASK row is the
# prefix's ones followed by this row. A node's RoPE position is the prefix length plus its
# depth, so siblings share a position while their K/V sit in different slots (columns).

# %%
def ancestors(j):
    while j is not None:
        yield j
        j = parents[j]


seq_len = verify["positions"][0]  # the root sits right after the committed prefix
mask = torch.tensor([[c == "1" for c in row] for row in draft["tree_mask"]])
full_mask_len = n * (seq_len + n)
print(f"prefix {seq_len} tokens; FULL_MASK for this request: {n} rows x {seq_len + n} columns = {full_mask_len} bits")

import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(3, 3))
ax.imshow(mask.int().tolist(), cmap="Greys")
ax.set_xlabel("sees node")
ax.set_ylabel("node")
fig.tight_layout()
show(fig, "07_tree_mask")

# %% [markdown]
# ## The mask says it all: rebuilding the tree from it (000 §9)
#
# sgl-kernel's `reconstruct_indices_from_tree_mask` (used by SGLang's n-gram path) recovers the
# positions and retrive lists from a QLEN_ONLY mask alone: the mask is the tree.

# %%
positions = torch.empty(n, dtype=torch.int64)
ri, rnt, rns = torch.full((3, 1, n), -1, dtype=torch.int64)
reconstruct_indices_from_tree_mask(mask.flatten(), torch.tensor([seq_len]), positions, ri, rnt, rns, 1, n)
print("positions", positions.tolist(), " next_token", rnt.tolist()[0], " next_sibling", rns.tolist()[0])

# %% [markdown]
# ## A chain needs only the causal mask
#
# In a chain every node's ancestors are exactly the nodes before it, so its tree mask is the
# lower triangle: the bottom-right-aligned causal mask attention kernels already have. This is
# how vLLM verifies its chains with causal=True and no custom mask at all.

# %%
k = 5
chain_mask = [[i in range(j + 1) for i in range(k + 1)] for j in range(k + 1)]
causal = torch.ones(k + 1, k + 1, dtype=torch.bool).tril()
print("chain mask equals tril:", torch.equal(torch.tensor(chain_mask), causal))

# %% [markdown]
# ## Many requests in one forward (002 §12.3.3)
#
# The batch's new tokens are packed along one axis; `cu_seqlens_q` marks where each request's
# rows start: three requests verifying chains of 5 drafts give 6 rows each. vLLM's model runner
# then picks, among all scheduled rows, the ones whose logits judge a draft or give a bonus
# (`_calc_spec_decode_metadata`, its example below: five requests with 3, 0, 2, 0 and 1 drafts).

# %%
extend_lens = torch.tensor([6, 6, 6])
cu_seqlens_q = torch.cat((torch.zeros(1, dtype=torch.int64), extend_lens.cumsum(0)))
print("cu_seqlens_q", cu_seqlens_q.tolist())
meta = calc_spec_decode_metadata([3, 0, 2, 0, 1], [4, 104, 107, 207, 209], torch.arange(209))
print("logits_indices", meta.logits_indices.tolist())
print("bonus_logits_indices", meta.bonus_logits_indices.tolist(), " target_logits_indices",
      meta.target_logits_indices.tolist())

# %% [markdown]
# ## Live: every tree of a run of your own
#
# The trees above are from a committed trace. Draft some now (EAGLE, topk 4, 8 nodes, two
# held-out prompts) and check each against what the draft loop itself chose: the trace keeps
# every candidate the loop scored, the tree node each kept one became, and the candidate it was
# expanded from. build_tree must turn exactly those parent links into mask rows, positions and
# retrive lists.

# %%
from _lib import run  # noqa: E402

from spectrace.zoo.prompts import HELD_OUT_PROMPTS  # noqa: E402

_, live_trace = run("07_live", algo="eagle", topk=4, prompts=HELD_OUT_PROMPTS[:2], max_new_tokens=16)


def tree_is_built_right(r) -> bool:
    d, v = r["draft"], r["verify"]
    c = d["candidates"]
    node_of = {cand: node for cand, node in enumerate(c["nodes"]) if node > 0}
    # each kept candidate's parent candidate is a kept node too (or the root, -1)
    loop_parent = {node: 0 if c["parents"][cand] == -1 else node_of[c["parents"][cand]]
                   for cand, node in node_of.items()}
    size = len(d["tree_mask"])
    par = [None] + [loop_parent[j] for j in range(1, size)]

    def up(j):
        while j is not None:
            yield j
            j = par[j]
    rows_ok = all(d["tree_mask"][j] == "".join("1" if i in set(up(j)) else "0" for i in range(size))
                  for j in range(size))
    depth = [0] + [len(list(up(j))) - 1 for j in range(1, size)]
    m = torch.tensor([[ch == "1" for ch in row] for row in d["tree_mask"]])
    pos, nt, ns = torch.empty(size, dtype=torch.int64), *torch.full((2, 1, size), -1, dtype=torch.int64)
    reconstruct_indices_from_tree_mask(m.flatten(), torch.tensor([v["positions"][0]]), pos,
                                       torch.full((1, size), -1), nt, ns, 1, size)
    return (rows_ok and d["parents"] == par[1:] and v["positions"] == [v["positions"][0] + x for x in depth]
            and nt.tolist()[0] == d["retrive_next_token"] and ns.tolist()[0] == d["retrive_next_sibling"])


live_steps = [r for r in read_trace(live_trace.path).steps if r["draft"]]
print(f"live: {len(live_steps)} trees, every one built from the draft loop's own parent links: "
      f"{all(map(tree_is_built_right, live_steps))}")

# %% [markdown]
# ## Check yourself

# %%
# every mask row is the node's ancestors and itself, nothing else
for j in range(n):
    assert [bool(x) for x in mask[j]] == [i in set(ancestors(j)) for i in range(n)]
# positions are the prefix length plus the depth
assert verify["positions"] == [seq_len] + [seq_len + d for d in draft["depths"]]
# the mask alone gives back the positions and the retrive lists the trace recorded
assert positions.tolist() == verify["positions"]
assert rnt.tolist()[0] == draft["retrive_next_token"] and rns.tolist()[0] == draft["retrive_next_sibling"]
assert all(map(tree_is_built_right, live_steps))  # every live tree, against the loop's own choices
assert chain_mask == causal.tolist()
assert cu_seqlens_q.tolist() == [0, 6, 12, 18]
assert meta.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
assert meta.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
assert meta.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
expect("07", "step0_positions", verify["positions"])
expect("07", "step0_full_mask_bits", full_mask_len)
print("all checks passed")
