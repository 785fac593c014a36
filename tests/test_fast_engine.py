"""`--backend fast` (spectrace/fast/) decides every step as the explicit engine does:
for each algorithm it runs, chains and trees, batch 1 and ragged batches padded to a bucket,
greedy and sampled (target_only, plain sampling; the same seeds), the same draft trees, the same
walk, the same committed tokens, correct_drafts and bonus_token, the same sequence lengths; its
numbers (q, path scores, p) equal to float32 rounding. On the CPU it
runs eagerly with the kernels interpreted, so runs are a few tokens long; tests/test_gpu.py checks
it compiled, its CUDA graphs against eager, bit for bit."""
import functools
import json

import pytest
import torch

from spectrace.core import adaptive
from spectrace.errors import SpectraceError
from spectrace.traces import read_whole
from spectrace.zoo.prompts import HELD_OUT_PROMPTS, REPEATING_PROMPTS
from spectrace.run import RunConfig, run

pytest.importorskip("triton")

CASES = [  # (algo, options): batch 3 is a ragged batch in a bucket of 4 (one padding row)
    ("none", dict(batch=2)),
    ("standalone", dict(batch=1)),
    ("eagle", dict(topk=4, batch=1)),
    ("eagle3", dict(topk=2, num_steps=3, num_draft_tokens=6, batch=3)),
    ("mtp", dict(topk=1, num_steps=3, batch=1)),
    ("frozen_kv_mtp", dict(topk=2, num_steps=3, num_draft_tokens=5, batch=1)),  # reads the target's KV
    ("medusa", dict(batch=1)),  # the static tree of 24 choices, depth 3
    ("dflash", dict(batch=2)),  # a block of 8 in one non-causal pass over each request's context
    ("ngram", dict(batch=2, prompt_lookup_min=1, prompt_lookup_max=3)),  # chains of 0..5 drafted on the host
    ("ngram", dict(batch=2, ngram_style="sglang")),  # SGLang's trie: trees of 12 nodes
    # SGLang's stochastic default: target_only over the top-k tree, the same coins; and plain sampling
    ("eagle", dict(topk=4, batch=1, temperature=1.0, seed=5)),
    ("none", dict(batch=1, temperature=0.8, top_k=50, seed=2)),
    ("medusa", dict(batch=2, temperature=1.0, seed=3)),
    # an n-gram miss under sampling: a plain sample
    ("ngram", dict(batch=2, prompt_lookup_min=1, prompt_lookup_max=3, temperature=1.0, seed=4)),
    # drafts sampled from q (the exponential race's noise drawn on the host), then SGLang's chain
    # rejection sampling or vLLM's rejection sampler
    ("eagle", dict(topk=1, num_steps=3, batch=2, temperature=0.9, seed=6, acceptance="rejection")),
    ("standalone", dict(batch=2, temperature=1.0, seed=7, acceptance="vllm")),
    ("dflash", dict(batch=2, temperature=1.0, seed=13, acceptance="vllm")),  # one-hot drafts: q None
    ("frozen_kv_mtp", dict(topk=1, num_steps=3, batch=2, temperature=1.0, seed=8, acceptance="vllm")),
    # vLLM's sampler over n-gram chains, 0 or 5 drafts per request, packed as vLLM packs them
    # (the second request's drafts first when the first has none)
    ("ngram", dict(batch=2, prompts=[HELD_OUT_PROMPTS[0], REPEATING_PROMPTS[0]], prompt_lookup_min=1,
                   prompt_lookup_max=3, temperature=0.5, seed=11, acceptance="vllm")),
    # a sampled tree ranked by each request's sibling worth, walked by recursive rejection sampling
    ("eagle", dict(topk=3, num_steps=3, num_draft_tokens=6, batch=2, temperature=1.0, seed=12,
                   acceptance="tree_rejection")),
    ("medusa", dict(batch=2, temperature=1.0, seed=9, acceptance="typical")),  # Medusa's own rule
    ("eagle", dict(topk=4, batch=1, temperature=0.7, seed=10, acceptance="typical")),
    ("eagle", dict(topk=1, num_steps=3, adaptive=True, batch=2)),  # tiers switched (quick_tiers)
    ("eagle", dict(topk=2, num_steps=2, num_draft_tokens=4, batch=2, deterministic=True)),  # one-token verify rows
]
CASE_IDS = [f"{a}-{o.get('acceptance', 'sampled' if o.get('temperature') else 'greedy')}-batch{o['batch']}"
            + "".join(f"-{k}" for k in ("adaptive", "deterministic") if o.get(k)) for a, o in CASES]
EXACT_DRAFT = ("tokens", "parents", "depths", "tree_mask", "retrive_next_token", "retrive_next_sibling", "fates")
CLOSE_DRAFT = ("q", "scores")


@pytest.fixture
def quick_tiers(monkeypatch):
    """Adaptive steps that decide after every step on that step alone (SGLang's defaults wait 15
    batches), so a run of a few tokens switches tiers: 3 -> 7 when a step accepts all 3 drafts."""
    monkeypatch.setattr(adaptive, "AdaptiveConfig", functools.partial(
        adaptive.AdaptiveConfig, ema_alpha=1.0, warmup_batches=0, update_interval=1))


def step_records(path) -> list[dict]:
    """A trace's step records: the explicit run's lines, the fast run's built from its frames."""
    return read_whole(path).steps


def assert_close_pairs(got, want, tol: float):
    """[[token, p], ...] lists (nested): the same tokens, p within tol."""
    if want and isinstance(want[0], list) and want[0] and isinstance(want[0][0], list):
        for g, w in zip(got, want, strict=True):
            assert_close_pairs(g, w, tol)
        return
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [p for _, p in got] == pytest.approx([p for _, p in want], abs=tol)


def assert_same_accept(got: dict, want: dict, tol: float) -> None:
    """The same walk: path, rule, every decision and its reason, the bonus's source; the numbers
    it read (p, coins, accumulated mass, the bonus's top tokens) within tol."""
    assert (got["rule"], got["accept_nodes"]) == (want["rule"], want["accept_nodes"])
    for g, w in zip(got["decisions"], want["decisions"], strict=True):
        assert {k: v for k, v in g.items() if not isinstance(v, float)} == \
            {k: v for k, v in w.items() if not isinstance(v, float)}
        for k, v in w.items():  # typical's entropy is kept to 4 decimals, the rest to 6
            if isinstance(v, float):
                assert g[k] == pytest.approx(v, abs=tol + (1e-4 if k == "entropy" else 0)), k
    if want["bonus_from"] is None:
        assert got["bonus_from"] is None
        return
    assert {k: v for k, v in got["bonus_from"].items() if k != "topk"} == \
        pytest.approx({k: v for k, v in want["bonus_from"].items() if k != "topk"}, abs=tol)
    assert_close_pairs(got["bonus_from"]["topk"], want["bonus_from"]["topk"], tol)


def assert_same_steps(explicit_trace, fast_trace, batch: int, tol: float) -> None:
    """Every step record of the fast run decides what the explicit run's does: the same tree, walk,
    tokens and lengths; its numbers within `tol`."""
    explicit, fast = step_records(explicit_trace), step_records(fast_trace)
    assert len(explicit) >= batch
    for want, got in zip(explicit, fast, strict=True):
        for key in ("step", "request", "correct_drafts", "bonus_token", "accept_tokens", "committed_tokens",
                    "finish_reason", "adaptive"):
            assert got.get(key) == want.get(key), key
        assert_same_accept(got["accept"], want["accept"], tol)
        assert got["kv"]["target_seq_len"] == want["kv"]["target_seq_len"]
        for key in ("tokens", "positions", "target_predict"):
            assert got["verify"][key] == want["verify"][key], key
        assert got["verify"]["p_draft"] == pytest.approx(want["verify"]["p_draft"], abs=tol)
        assert_close_pairs(got["verify"]["target_topk"], want["verify"]["target_topk"], tol)
        if want["draft"] is None:
            assert got["draft"] is None
            continue
        for key in EXACT_DRAFT:
            assert got["draft"][key] == want["draft"][key], key
        for key in CLOSE_DRAFT:
            assert got["draft"][key] == pytest.approx(want["draft"][key], abs=tol), key
        assert_close_pairs(got["draft"]["draft_topk"], want["draft"]["draft_topk"], tol)
        assert ("candidates" in got["draft"]) == ("candidates" in want["draft"])
        for key in ("tokens", "levels", "parents", "nodes") if "candidates" in want["draft"] else ():
            assert got["draft"]["candidates"][key] == want["draft"]["candidates"][key], key  # the draft loop's
        for key in ("q", "scores") if "candidates" in want["draft"] else ():
            assert got["draft"]["candidates"][key] == pytest.approx(want["draft"]["candidates"][key], abs=tol), key


def run_both(algo: str, options: dict, tmp_path, **kw) -> dict:
    """The same run on --backend explicit and fast, each with a full trace: {backend: (result, trace)}."""
    out = {}
    for backend in ("explicit", "fast"):
        trace = tmp_path / f"{backend}.jsonl"
        out[backend] = run(RunConfig(algo=algo, trace=str(trace), backend=backend, **options, **kw)), trace
    return out


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests/test_gpu.py runs these compiled")
@pytest.mark.parametrize("algo,options", CASES, ids=CASE_IDS)
def test_fast_engine_decides_every_step_as_the_explicit_one(algo, options, tmp_path, quick_tiers):
    runs = run_both(algo, options, tmp_path, max_new_tokens=6)
    (explicit, explicit_trace), (fast, fast_trace) = runs["explicit"], runs["fast"]
    assert fast.texts == explicit.texts
    assert_same_steps(explicit_trace, fast_trace, options["batch"], 5e-6)  # 6-decimal values, rounded twice
    if options.get("adaptive"):
        assert {r["adaptive"]["switched_to"] for r in step_records(fast_trace)} > {None}, "no tier switched"
    for key in ("completion_tokens", "verify_ct", "accept_length", "accept_rate", "accept_len_histogram"):
        assert fast.metrics[key] == explicit.metrics[key], key
    # greedy tree drafters drafted through the fused levels (kernels/draft_level.py), the trace
    # recording their trees; without a trace tree_rejection ranks each tree by the sibling worth
    # the host kept from the device's counts alone: the same run
    if options.get("acceptance") != "tree_rejection":
        return
    untraced = run(RunConfig(algo=algo, backend="fast", trace_level="off", max_new_tokens=6, **options))
    assert untraced.texts == explicit.texts
    assert untraced.metrics["accept_len_histogram"] == explicit.metrics["accept_len_histogram"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU runs; tests/test_gpu.py covers the GPU")
def test_fast_engine_trace_opens_in_the_walkthrough(tmp_path):
    from spectrace.viz.tui.snapshot import snapshot

    trace = tmp_path / "fast.jsonl"
    run(RunConfig(algo="eagle", topk=4, max_new_tokens=4, trace=str(trace), backend="fast", trace_level="steps"))
    screen = snapshot(trace, keys=["right", "right"])
    assert "VERIFY" in screen or "DRAFT" in screen


@pytest.mark.parametrize("options,message", [
    (dict(algo="eagle", batch=65), "at most 64 requests"),
    (dict(algo="none", dtype="bfloat16"), "no bfloat16"),
])
def test_fast_engine_refuses_what_it_does_not_run(options, message):
    with pytest.raises(SpectraceError, match=message):
        run(RunConfig(backend="fast", max_new_tokens=2, trace_level="off", **options))


def test_typical_on_the_device_walks_as_the_explicit_walk_with_ties():
    """fast/acceptance/typical.py against core/acceptance/typical.py on 300 random trees whose
    target rows take three values, so sibling paths tie in depth and summed log p (as bf16 makes
    them): the same path, the same bonus."""
    import random

    from spectrace.core.acceptance import Randoms, RuleParams
    from spectrace.core.acceptance.typical import typical_walk
    from spectrace.core.tree import reconstruct_indices_from_tree_mask
    from spectrace.fast.acceptance import typical as fast_typical

    rng = random.Random(0)
    for _ in range(300):
        n, V = rng.randint(2, 12), 6
        mask = torch.eye(n, dtype=torch.bool)
        for j in range(1, n):  # node j under a random earlier node: parents come first
            mask[j] |= mask[rng.randint(0, j - 1)]
        positions, _, next_token, next_sibling = reconstruct_indices_from_tree_mask(mask.reshape(-1), [0], n)
        p = torch.softmax(torch.tensor([[float(rng.choice([0, 1, 2])) for _ in range(V)] for _ in range(n)]), -1)
        candidates = [rng.randrange(V) for _ in range(n)]
        coin = torch.tensor(rng.random(), dtype=torch.float32)
        depth = int(positions.max())
        want = typical_walk(candidates, next_token[0].tolist(), next_sibling[0].tolist(), p.argmax(-1).tolist(), p,
                            None, Randoms(coin_final=coin), depth, RuleParams())
        index, num, bonus = fast_typical.typical_walk(p[None], torch.tensor([candidates]), mask[None],
                                                      positions.view(1, n), coin.view(1), depth + 1)
        assert (index[0, :int(num[0]) + 1].tolist(), int(bonus[0])) == (want.accept_nodes, want.bonus_token)


@pytest.mark.parametrize("temperature,recording,fused", [(0.0, False, True), (0.0, True, True), (1.0, False, False),
                                                          (1.0, True, False)])
def test_only_greedy_runs_draft_through_the_fused_loop(target, drafters, temperature, recording, fused):
    """The fused loop breaks near-ties in q by the lowest token id, the explicit one as torch.topk
    does: it drafts where the tree cannot change the output (greedy decoding), recording or not, so
    a trace shows the trees an untraced run drafts."""
    from spectrace.engines import build_engine
    from spectrace.run import resolve

    spec, options = resolve(RunConfig(algo="eagle", topk=4, temperature=temperature, seed=1))
    engine = build_engine(target, drafters["eagle"], spec, [[1, 2, 3]], (0,), backend="fast",
                          on_step=(lambda rec: None) if recording else None, **options)
    assert engine.drafter.fused is fused


@pytest.mark.parametrize("algo, dropped, recording", [("eagle", "extend", False), ("eagle", "verify", True),
                                                      ("none", "verify", False), ("ngram", "verify", True)])
def test_a_phase_in_no_launch_group_stops_the_step(target, drafters, algo, dropped, recording):
    """Which phases share a CUDA graph is a table of Phase members (fast/graphs.py): a phase the
    step enters that is in no launch group, or one entered out of its group's order, raises at the
    first step on a CPU (and at capture, when the engine is built, on a GPU) instead of running
    outside every graph; the engine's own groups cover every phase."""
    from spectrace.engines import build_engine
    from spectrace.fast.graphs import Phase
    from spectrace.run import resolve

    spec, options = resolve(RunConfig(algo=algo, topk=1 if algo != "eagle" else 4, max_new_tokens=4))
    drafter = drafters.get(algo)
    engine = build_engine(target, drafter, spec, [[1, 2, 3]], (0,), backend="fast",
                          on_step=(lambda rec: None) if recording else None, **options)
    assert engine.generate([[1, 2, 3]])[0][0].output_ids  # the engine's own groups: every phase in one
    if recording:  # and the groups a GPU captures, the pack last in the last graph, in the order they run
        from contextlib import nullcontext
        from functools import partial

        from spectrace.fast.graphs import PhaseGroups, with_record

        opened = []
        runner = engine.runner
        step = engine.recorder.packed(partial(runner.step, engine.tier), engine.tier)
        step(PhaseGroups(with_record(runner.launches), lambda name: opened.append(name) or nullcontext()))
        assert opened == [name for name, _ in runner.launches]
    groups = engine.runner.launches
    for name, phases in groups:
        if name == dropped:
            kept = tuple(p for p in phases if p is not Phase.ACCEPT) if name == "verify" else ()
            engine.runner.launches = tuple((n, kept if n == name else ps) for n, ps in groups if kept or n != name)
    with pytest.raises(LookupError, match="Phase.ACCEPT|Phase.EXTEND"):
        engine.generate([[1, 2, 3]])
