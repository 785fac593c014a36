"""The chi-square harness that proves an acceptance rule lossless, importable by tests and lessons;
and `killed_once_written`, a `spectrace run` SIGKILLed mid-way, for the tests of what it leaves.

The synthetic model is a Markov chain over V tokens: the target's distribution after token x is
P[x] (the root's is p0) and the draft's is Q[x] (q0). target_only's and typical's tree takes the
draft's top 2 at each node, two levels deep; tree_rejection's is sampled by the engine's draft
loop (topk 2, two levels, 4 of the 6 candidates kept); chains sample two drafts. A two-token
continuation is the first two tokens a run emits: one step when it emits two or more, else a
second step rooted at the first token. Exact: P(t1, t2) = p0[t1] * P[t1][t2].

How many samples. A lossless rule must pass; a rule whose output moves BIAS (2%) of probability
between the two likeliest continuations, the place where a bias is hardest to see, must fail. That
shift gives Pearson's statistic the noncentrality N * BIAS^2 * (1/p_a + 1/p_b); `samples_for` picks
the N at which it fails with probability 0.99 at the test's alpha of 0.001, and
tests/test_acceptance.py's `test_the_test_catches_the_bias` checks that it does. A subtler known
failure, a sampled tree whose shape depends on its draws, has a test of its own.
"""
from __future__ import annotations

import math

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
            if obs[-1]:
                raise AssertionError(f"{int(obs[-1])} samples where the target has no mass")
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


def killed_once_written(argv: list[str], path, size: int, env: dict | None = None) -> None:
    """Start `python -m spectrace ARGV`, SIGKILL it once `path` holds `size` bytes (no handler
    runs, nothing is flushed or closed), and check it was killed mid-way, not finished."""
    import subprocess
    import sys
    import time

    run = subprocess.Popen([sys.executable, "-m", "spectrace", *argv], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while (not path.exists() or path.stat().st_size < size) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    run.kill()
    run.wait()
    assert run.returncode == -9, run.stderr.read()[-2000:]
