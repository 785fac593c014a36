# %% [markdown]
# # 06 · EAGLE-2 trees: top-k expansion, path scores, and the n - 1 best
#
# **Objectives.** Grow a draft tree the way SGLang's EAGLE worker does (each level expands the
# topk best paths by their topk best next tokens), score a path by the product of its drafts'
# q, keep the num_draft_tokens - 1 best, and see what a tree buys over a chain.
#
# **Chapter sections.** SGLang end to end (`000`) §6.2, §6.3.
#
# > Tree 在每一层保留 topk 个 sibling：draft 不是赌一条路，而是长出一棵候选树，再在 verify 时按层挑选。 (《投机解码（Speculative Decoding）端到端深挖》§6.2)
# > *A tree keeps topk siblings at each level: the draft does not bet on one path, it grows a tree of candidates, then picks level by level at verify.*
#
# **Time.** About 15 minutes.

# %% [markdown]
# ## How many candidates, and how many are kept
#
# With topk K and num_steps S, the draft loop scores K candidates at the first level and K x K
# at each later one (the K best paths so far, each with its K best next tokens): K + (S - 1) K²
# candidates, not the K + K² + ... + K^S of a full tree, because only K paths are expanded per
# level. Of these, the num_draft_tokens - 1 with the best path scores become the tree
# (`organize_draft_results`).

# %%
from _lib import WALKTHROUGH, expect, run, show, tree_figure

from spectrace.core.trace_reader import TraceFile, read_trace
from spectrace.core.tree import tree_capacity
from spectrace.zoo.prompts import HELD_OUT_PROMPTS

def full_tree(K, S):
    """Nodes of a complete K-ary tree of depth S, what expanding every path would score."""
    return sum(K ** i for i in range(1, S + 1))


for K, S in ((2, 2), (4, 5), (8, 8)):
    print(f"topk {K}, num_steps {S}: {tree_capacity(K, S)} candidates scored; a full tree: {full_tree(K, S)} nodes")

# %% [markdown]
# ## A real tree: step 0 of the walkthrough's trace (tree 5, 4, 8)
#
# Every node carries its q (the draft's probability of its token after its parent) and its path
# score, the product of q along the path from the root. Since each q is at most 1, a child never
# scores above its parent, so the best n - 1 candidates always form a tree: no kept node is
# missing its parent.

# %%
t = read_trace(WALKTHROUGH)
d = t.steps[0]["draft"]
print(f"{'node':>4} {'parent':>6} {'depth':>5} {'q':>9} {'score':>9}  token")
for j, (par, depth, q, score, tok) in enumerate(zip(d["parents"], d["depths"], d["q"], d["scores"], d["tokens"]),
                                                 start=1):
    print(f"{j:>4} {par:>6} {depth:>5} {q:>9.6f} {score:>9.6f}  {t.token_text(tok)!r}")
show(tree_figure(TraceFile(WALKTHROUGH), 0, "06_step0_tree"))

# %% [markdown]
# The root's four children are its top 4 by q; node 3's and node 4's children come next because
# their path scores (q of the parent times q of the child) beat every other candidate of the
# second level; nothing deeper made the 7. With SGLang's Llama shape (5, 4, 8) the 7 best paths
# here sit at depth 2 or less: five levels are drafted, few are kept.

# %% [markdown]
# ## A chain against a tree on the same prompts (000 §6.3)
#
# The same EAGLE head, as a chain (topk 1, 5 drafts) and as SGLang's tree (topk 4, 8 nodes), on
# two held-out prompts: the tree tries alternatives at each level, so a step accepts more.

# %%
tau = {}
for name, shape in (("chain", dict(topk=1, num_steps=5)), ("tree", dict(topk=4, num_steps=5, num_draft_tokens=8))):
    tokens = verify = 0
    for i, prompt in enumerate(HELD_OUT_PROMPTS[:2]):
        result, _ = run(f"06_{name}_{i}", algo="eagle", prompts=[prompt], **shape)
        tokens, verify = tokens + result.metrics["completion_tokens"], verify + result.metrics["verify_ct"]
    tau[name] = tokens / verify
    print(f"{name}: τ {tau[name]:.3f}")

# %% [markdown]
# ## Grow one live, and check it against a reference
#
# The trace of a run keeps every candidate the draft loop scored: its level, q, path score, the
# candidate it was expanded from, and the tree node it became (or -1, cut). That is enough to
# check the loop against the rule written out independently: level 0 is the root's top K by q;
# each later level expands exactly the K best paths of the level before by path score (not by
# their own q); a path score is the parent's times q; the tree is the n - 1 best scores of all.

# %%
_, live_trace = run("06_live", algo="eagle", topk=4, num_steps=5, num_draft_tokens=8,
                    prompts=HELD_OUT_PROMPTS[:2], max_new_tokens=16)


def follows_eagle2(c, K: int, n: int) -> bool:
    levels = sorted(set(c["levels"]))
    of = {lv: [i for i, x in enumerate(c["levels"]) if x == lv] for lv in levels}
    ok = all(c["parents"][i] == -1 and abs(c["scores"][i] - c["q"][i]) < 2e-6 for i in of[0])
    for lv in levels[1:]:
        best = sorted(of[lv - 1], key=lambda i: -c["scores"][i])[:K]  # the K best paths, by path score
        expanded = {c["parents"][i] for i in of[lv]}
        ties = {i for i in of[lv - 1] if abs(c["scores"][i] - c["scores"][best[-1]]) < 2e-6}
        ok &= expanded <= set(best) | ties and len(expanded) == K
        ok &= all(abs(c["scores"][i] - c["scores"][c["parents"][i]] * c["q"][i]) < 2e-6 for i in of[lv])
    kept = sorted((c["scores"][i] for i, node in enumerate(c["nodes"]) if node > 0), reverse=True)
    return ok and len(kept) == n - 1 and all(abs(a - b) < 2e-6 for a, b in zip(kept, sorted(c["scores"], reverse=True)))


live_steps = [r for r in read_trace(live_trace.path).steps if r["draft"]]
print(f"{len(live_steps)} live trees; each follows EAGLE-2's rule: "
      f"{all(follows_eagle2(r['draft']['candidates'], 4, 8) for r in live_steps)}")

# %% [markdown]
# ## The text's example: topk 2, depth 2 (000 §6.2)
#
# The SGLang text draws a tree of topk 2 and depth 2: A1 and A2 under the root, two children
# under each, and walks it greedily: find the target's argmax among {A1, A2}; on a hit, go on
# among that node's children only; at the first level with no hit, stop. With
# num_draft_tokens 7 every one of the 2 + 4 candidates is kept, so the tree is the text's.

# %%
_, small_trace = run("06_topk2_depth2", algo="eagle", topk=2, num_steps=2, num_draft_tokens=7,
                     prompts=HELD_OUT_PROMPTS[:1], max_new_tokens=16)
small = [r for r in read_trace(small_trace.path).steps if r["draft"]]
print("parents of nodes 1..6:", small[0]["draft"]["parents"], " depths:", small[0]["draft"]["depths"])


def walks_as_the_text_says(r) -> bool:
    """Every node the walk tried is a child of the last accepted node, siblings in order, and it
    stops at the first level where no child matched."""
    parents, path, ok = [None] + r["draft"]["parents"], [0], True
    for dec in r["accept"]["decisions"]:
        ok &= parents[dec["node"]] == path[-1]
        if dec["accepted"]:
            path.append(dec["node"])
    return ok and path == r["accept"]["accept_nodes"]


for r in small[:4]:
    print(f"step {r['step']}: tried {[d['node'] for d in r['accept']['decisions']]}, accepted path "
          f"{r['accept']['accept_nodes']}")

# %% [markdown]
# ## Check yourself

# %%
assert tree_capacity(4, 5) == 68 and full_tree(4, 5) == 1364 and tree_capacity(2, 2) == full_tree(2, 2) == 6
# path score = product of q along the path (the trace rounds to 6 decimals)
for j, (par, q, score) in enumerate(zip(d["parents"], d["q"], d["scores"]), start=1):
    parent_score = 1.0 if par == 0 else d["scores"][par - 1]
    assert abs(score - parent_score * q) < 2e-6, j
    assert par < j and (par == 0 or d["depths"][j - 1] == d["depths"][par - 1] + 1)  # parents come first
# no kept node outscores its parent, so the kept set is closed under parents
assert all(par == 0 or d["scores"][j - 1] <= d["scores"][par - 1] for j, par in enumerate(d["parents"], start=1))
# the root's children are the draft's top candidates after the root, best first
root_children = [tok for tok, par in zip(d["tokens"], d["parents"]) if par == 0]
assert root_children == [tok for tok, _ in d["draft_topk"][0][:len(root_children)]]
# a tree grown now follows EAGLE-2's rule, checked against the reference above
assert live_steps and all(follows_eagle2(r["draft"]["candidates"], 4, 8) for r in live_steps)
# topk 2, depth 2: the text's tree (A1, A2; two children each) and its greedy walk
assert all(r["draft"]["parents"] == [0, 0, 1, 1, 2, 2] and r["draft"]["depths"] == [1, 1, 2, 2, 2, 2] for r in small)
assert all(map(walks_as_the_text_says, small))
expect("06", "chain_tau", tau["chain"])
expect("06", "tree_tau", tau["tree"])
print("all checks passed")
