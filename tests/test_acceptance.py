"""Which acceptance rules keep the target's distribution: chi-square tests of the rules' own code
against the exact target distribution, on small vocabularies, for one step and for whole
two-token continuations; and through the engine on the embedded models.

The synthetic model is a Markov chain over V tokens: the target's distribution after token x is
P[x] (the root's is p0) and the draft's is Q[x] (q0). target_only's and typical's tree takes the
draft's top 2 at each node, two levels deep; tree_rejection's is sampled by the engine's draft
loop (topk 2, two levels, 4 of the 6 candidates kept); chains sample two drafts. A two-token
continuation is the first two tokens a run emits: one step when it emits two or more, else a
second step rooted at the first token. Exact: P(t1, t2) = p0[t1] * P[t1][t2].

How many samples. A lossless rule must pass; a rule whose output moves BIAS (2%) of probability
between the two likeliest continuations, the place where a bias is hardest to see, must fail.
That shift gives Pearson's statistic the noncentrality N * BIAS^2 * (1/p_a + 1/p_b);
`samples_for` picks the N at which it fails with probability 0.99 at the test's alpha of 0.001,
and `test_the_test_catches_the_bias` checks that it does. A subtler known failure, a sampled
tree whose shape depends on its draws, has a test of its own.
"""
import math

import pytest
import torch

from spectrace.core.acceptance import RULES, RuleParams
from spectrace.core.drafters import SampledDrafts
from spectrace.core.drafters.eagle_worker import build_draft_tree, draft_forward
from spectrace.core.sampling import sample

V = 4
BIAS = 0.02
ENGINE_BIAS = 0.08
Z_ALPHA = 3.09  # alpha 0.001, one-sided
Z_POWER = 2.33  # power 0.99


def chi_square(counts: torch.Tensor, probs: torch.Tensor, z: float = Z_ALPHA) -> tuple[float, float]:
    """Pearson's statistic (bins with expected count < 5 merged) and its critical value at
    alpha = 0.001 (Wilson-Hilferty)."""
    n = counts.sum()
    exp = probs.double().flatten() * n
    obs = counts.double().flatten()
    small = exp < 5
    if small.any():
        exp = torch.cat([exp[~small], exp[small].sum().view(1)])
        obs = torch.cat([obs[~small], obs[small].sum().view(1)])
        if exp[-1] == 0:  # outcomes the target never produces: any count there is a failure
            assert obs[-1] == 0, f"{int(obs[-1])} samples where the target has no mass"
            exp, obs = exp[:-1], obs[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(exp) - 1
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


def samples_for(exact: torch.Tensor, bias: float = BIAS) -> int:
    """The N at which a shift of `bias` between the two likeliest cells of `exact` fails the
    chi-square test with probability 0.99 (normal approximation of the noncentral chi-square)."""
    df = int((exact > 0).sum()) - 1
    crit = df * (1 - 2 / (9 * df) + Z_ALPHA * math.sqrt(2 / (9 * df))) ** 3
    lam = 0.0
    while df + lam - crit < Z_POWER * math.sqrt(2 * (df + 2 * lam)):
        lam += 0.5
    p_a, p_b = torch.topk(exact.flatten(), 2).values.tolist()
    return math.ceil(lam / (bias ** 2 * (1 / p_a + 1 / p_b)))


def markov(seed: int):
    g = torch.Generator().manual_seed(seed)
    p0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    P = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    q0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    Q = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    return p0, P, q0, Q


def walk(rule: str, candidates, next_token, next_sibling, target_probs, draft_probs, gen, params):
    """The rule's own walk over a depth-2 tree, its random numbers drawn as the engine draws them."""
    r = RULES[rule]
    return r.walk(candidates, next_token, next_sibling, target_probs.argmax(-1).tolist(), target_probs, draft_probs,
                  r.draw(len(candidates), V, gen), 2, params).accept_tokens


def target_probs_of(candidates, root_p, P):
    """p after each node: the root's given, then the chain's P after each node's token."""
    return torch.stack([root_p] + [P[t] for t in candidates[1:]])


class Top2Trees:
    """The draft's top-2, depth-2 tree after each root (it depends on the root alone): nodes 0
    root; 1, 2; 3, 4 under 1; 5, 6 under 2."""

    def __init__(self, q0, Q):
        self.q0, self.Q, self.trees = q0, Q, {}

    def step(self, rule, root, root_p, P, gen, params):
        if root not in self.trees:
            a = torch.topk(self.q0 if root is None else self.Q[root], 2).indices.tolist()
            kids = [torch.topk(self.Q[x], 2).indices.tolist() for x in a]
            candidates = [-1, a[0], a[1], kids[0][0], kids[0][1], kids[1][0], kids[1][1]]
            self.trees[root] = candidates, target_probs_of(candidates, root_p, P)
        candidates, target_probs = self.trees[root]
        return walk(rule, candidates, [1, 3, 5, -1, -1, -1, -1], [-1, 2, -1, 4, -1, 6, -1], target_probs, None, gen,
                    params)


class SampledTrees:
    """Trees the engine's draft loop samples (topk 2, two levels, the 4 best of 6 candidates by
    sibling worth 0.5, 0.25: the root's two children and the first one's first), drawn in
    batches of many requests per root, all on one generator."""

    WORTH = torch.tensor([[0.5, 0.25]])

    def __init__(self, q0, Q, gen):
        self.q0, self.Q, self.gen, self.pool = q0, Q, gen, {}

    def draw(self, root, count: int):
        root_q = self.q0 if root is None else self.Q[root]
        sampled = SampledDrafts([self.gen] * count, self.WORTH.expand(count, 2))
        levels = draft_forward(lambda i, ids, hidden, parents: (self.Q[ids], None), root_q.expand(count, V), None, 2,
                               2, sampled)
        tree = build_draft_tree(levels, torch.zeros(count, dtype=torch.int64), [5] * count, 5, 2, 5, sampled)
        return [(tree.draft_tokens[b].tolist(), tree.retrive_next_token[b].tolist(),
                 tree.retrive_next_sibling[b].tolist(), tree.draft_probs[b]) for b in range(count)]

    def step(self, rule, root, root_p, P, gen, params):
        if not self.pool.get(root):
            self.pool[root] = self.draw(root, 4096)
        candidates, next_token, next_sibling, draft_probs = self.pool[root].pop()
        return walk(rule, candidates, next_token, next_sibling, target_probs_of(candidates, root_p, P), draft_probs,
                    gen, params)


class Chains:
    """A chain of two drafts sampled from the draft (argmax drafts when one_hot)."""

    def __init__(self, q0, Q, one_hot):
        self.q0, self.Q, self.one_hot = q0, Q, one_hot

    def step(self, rule, root, root_p, P, gen, params):
        root_q = self.q0 if root is None else self.Q[root]
        d1 = int(root_q.argmax()) if self.one_hot else sample(root_q, gen)
        d2 = int(self.Q[d1].argmax()) if self.one_hot else sample(self.Q[d1], gen)
        draft_probs = None if self.one_hot else torch.stack([root_q, self.Q[d1]])
        return walk(rule, [-1, d1, d2], [1, 2, -1], [-1, -1, -1], target_probs_of([-1, d1, d2], root_p, P),
                    draft_probs, gen, params)


def drafts_for(rule, q0, Q, gen, one_hot):
    if rule == "tree_rejection":
        return SampledTrees(q0, Q, gen)
    return Chains(q0, Q, one_hot) if rule in ("rejection", "vllm") else Top2Trees(q0, Q)


def continuations(rule, seed, n=None, one_hot=False, **thresholds):
    """Counts of the first token and of two-token continuations over n runs (default: enough to
    catch BIAS)."""
    p0, P, q0, Q = markov(seed)
    exact = p0[:, None] * P
    n = n or samples_for(exact)
    params = RuleParams(**thresholds)
    gen = torch.Generator().manual_seed(seed + 1)
    drafts = drafts_for(rule, q0, Q, gen, one_hot)
    pairs = [0] * (V * V)
    for _ in range(n):
        out = drafts.step(rule, None, p0, P, gen, params)
        if len(out) < 2:
            out = out + drafts.step(rule, out[0], P[out[0]], P, gen, params)[:1]
        pairs[out[0] * V + out[1]] += 1
    pairs = torch.tensor(pairs, dtype=torch.float64).view(V, V)
    return (p0, exact), pairs.sum(1), pairs


LOSSLESS = [("target_only", False), ("tree_rejection", False), ("rejection", False), ("vllm", False), ("vllm", True)]


@pytest.mark.parametrize("rule, one_hot", LOSSLESS, ids=[f"{r}{'-one_hot' if h else ''}" for r, h in LOSSLESS])
def test_lossless_rules_keep_the_target_distribution(rule, one_hot):
    (p0, exact), first, pairs = continuations(rule, seed=3, one_hot=one_hot)
    stat, crit = chi_square(first, p0)
    assert stat < crit, f"first token: chi2 {stat:.1f} >= {crit:.1f}"
    stat, crit = chi_square(pairs, exact)
    assert stat < crit, f"two-token continuation: chi2 {stat:.1f} >= {crit:.1f}"


def test_a_sampled_trees_shape_does_not_depend_on_its_draws():
    """What tree_rejection's losslessness rests on (acceptance/tree_rejection.py), checked
    directly: ranked by sibling worth, every request's sampled tree has the same shape, whatever
    it drew (ranking by the draws' own q once biased the output by about 1.3% in total variation)."""
    g = torch.Generator().manual_seed(0)
    bs, K, S, n, vocab = 300, 3, 3, 8, 40
    q = torch.softmax(torch.randn(bs, vocab, generator=g) * 2, -1)
    sampled = SampledDrafts([g] * bs, torch.tensor([[0.6, 0.3, 0.1]]).expand(bs, K))

    def forward(i, input_ids, hidden_states, parents):
        return torch.softmax(torch.randn(len(input_ids), vocab, generator=g) * 2, -1), None

    tree = build_draft_tree(draft_forward(forward, q, None, S, K, sampled), torch.zeros(bs, dtype=torch.int64),
                            [0] * bs, n, K, 5, sampled)
    assert (tree.retrive_next_token == tree.retrive_next_token[0]).all()
    assert (tree.retrive_next_sibling == tree.retrive_next_sibling[0]).all()
    assert len({tuple(t) for t in tree.draft_tokens.tolist()}) > bs // 2  # while what they drew differs


def test_the_test_catches_the_bias():
    """A sampler whose two-token law moves BIAS from the likeliest continuation to the next
    fails the same test at the same N, in 99 of 100 seeded repetitions or more."""
    p0, P, _, _ = markov(3)
    exact = p0[:, None] * P
    n = samples_for(exact)
    a, b = torch.topk(exact.flatten(), 2).indices.tolist()
    biased = exact.flatten().clone()
    biased[a] -= BIAS
    biased[b] += BIAS
    gen = torch.Generator().manual_seed(5)
    draws = torch.multinomial(biased.expand(100, -1), n, replacement=True, generator=gen)  # 100 repetitions
    caught = sum(chi_square(torch.bincount(row, minlength=V * V), exact)[0] > chi_square(exact * n, exact)[1]
                 for row in draws)
    assert caught >= 97, f"the test caught a {BIAS} bias in {caught} of 100 repetitions of N = {n}"


LOSSY = [("target_only", {"threshold_single": 0.5, "threshold_acc": 1.0}),
         ("target_only", {"threshold_single": 1.0, "threshold_acc": 0.5}),
         ("typical", {})]  # Medusa's rule keeps plausible drafts without any rejection test


@pytest.mark.parametrize("rule, kw", LOSSY, ids=["threshold_single", "threshold_acc", "typical"])
def test_lossy_rules_are_biased(rule, kw, capsys):
    """The same chi-square rejects them, and the test prints how far they are from the target
    (4,000 runs: their biases are many times BIAS)."""
    (p0, exact), first, pairs = continuations(rule, seed=3, n=4000, **kw)
    stat, crit = chi_square(pairs, exact)
    tv = 0.5 * float((pairs / pairs.sum() - exact).abs().sum())
    with capsys.disabled():
        print(f"\n{rule} {kw or '(posterior_threshold 0.09, posterior_alpha 0.3)'}: total variation from the target "
              f"over two-token continuations {tv:.3f} (chi2 {stat:.0f}, critical {crit:.0f})")
    assert stat > crit and tv > 5 * BIAS


def test_sibling_worth_is_the_chance_each_draw_is_the_accepted_one():
    """r_j = accepted / tried per sibling rank (a prior of 1 in 2), a_j = r_j prod_{i<j} (1 - r_i),
    never increasing with j."""
    from spectrace.core.acceptance.tree_rejection import SiblingStats

    stats = SiblingStats(3)
    # root 0 with children 1, 2, 3 in sibling order: draws 1 and 2 rejected, 3 accepted; then 1 accepted
    nt, ns = [1, -1, -1, -1], [-1, 2, 3, -1]
    stats.observe([{"node": 1, "accepted": False}, {"node": 2, "accepted": False}, {"node": 3, "accepted": True}],
                  nt, ns)
    stats.observe([{"node": 1, "accepted": True}], nt, ns)
    r = torch.tensor([2 / 4, 1 / 3, 2 / 3], dtype=torch.float64)  # (1 + accepted) / (2 + tried)
    a = torch.stack([r[0], r[1] * (1 - r[0]), r[2] * (1 - r[0]) * (1 - r[1])])
    torch.testing.assert_close(stats.worth(), torch.cummin(a, 0).values.float())
    assert (stats.worth()[1:] <= stats.worth()[:-1]).all()


# ---- the embedded model: whole two-token continuations through the engine ------------------

def exact_two_token_law(prompt: list[int], top_k: int) -> torch.Tensor:
    """p(t1 | prompt) p(t2 | prompt, t1) at temperature 1 and top-k, from transformers' forward
    of the embedded target and a plain top-k softmax: none of the engine's code."""
    from transformers import AutoModelForCausalLM

    from spectrace.zoo import TARGET_DIR

    hf = AutoModelForCausalLM.from_pretrained(TARGET_DIR, dtype=torch.float32).eval()

    def p_next(ids):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, top_k)
        return torch.zeros_like(logits).scatter(0, top.indices, torch.softmax(top.values, -1))

    p1 = p_next(prompt)
    exact = torch.zeros(len(p1), len(p1))
    for t in torch.nonzero(p1).flatten().tolist():
        exact[t] = p1[t] * p_next(prompt + [t])
    return exact


@pytest.mark.parametrize("rule, algo, topk", [("target_only", "eagle", 4), ("tree_rejection", "eagle3", 4),
                                              ("rejection", "mtp", 1), ("vllm", "eagle", 1)])
def test_engine_two_token_continuations_follow_the_target(target, drafters, tokenizer, rule, algo, topk):
    """B requests of one prompt, each with its own generator, 2 new tokens: the first comes from
    prefill, the second from the rule's first verify; their joint law must be the target's,
    with temperature 1 and top-k 6 (36 outcomes). The rules' math is proven above at BIAS; here
    the engine's plumbing (generators, draft sampling, p after top-k), whose errors move far
    more: B catches a bias of ENGINE_BIAS."""
    from spectrace.core.engine import SpecConfig
    from spectrace.run import build_engine

    prompt = tokenizer.encode("    for line in text.split")
    exact = exact_two_token_law(prompt, 6)
    B = samples_for(exact, ENGINE_BIAS)
    spec = SpecConfig(algo=algo, num_steps=3, topk=topk, num_draft_tokens=6 if topk > 1 else None, max_new_tokens=2,
                      acceptance=rule, temperature=1.0, top_k=6, seed=11)
    reqs, _ = build_engine(target, drafters[algo], spec, [prompt] * B, ()).generate([prompt] * B)
    counts = torch.zeros_like(exact)
    for r in reqs:
        counts[r.output_ids[0], r.output_ids[1]] += 1
    stat, crit = chi_square(counts, exact)
    assert stat < crit, f"chi2 {stat:.1f} >= {crit:.1f}"
