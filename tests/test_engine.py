"""Greedy speculative decoding reproduces greedy autoregressive decoding, and the KV stays sound."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from conftest import generate, prompts

from spectrace.core.batch import ForwardBatch
from spectrace.core.request import Request
from spectrace.core.spec import SpecConfig
from spectrace.core.tree import tree_capacity
from spectrace.run import build_engine
from spectrace.zoo import TARGET_DIR
from spectrace.zoo.prompts import HELD_OUT_PROMPTS

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ALGOS = ["standalone", "eagle", "eagle3", "mtp", "frozen_kv_mtp"]


@pytest.fixture(scope="module")
def newline_indent(tokenizer):
    """A frequent token ("\n" and an indent): taken as an extra EOS, runs stop mid-step."""
    (token,) = tokenizer.encode("\n   ")
    return token


def test_autoregressive_equals_transformers_greedy_generate(target, tokenizer):
    hf = AutoModelForCausalLM.from_pretrained(TARGET_DIR, dtype=torch.float32).eval()
    ids = [tokenizer.encode(p) for p in HELD_OUT_PROMPTS[:3]]
    ours, _ = generate(target, None, "none", ids, max_new=24, eos=())
    for p, out in zip(ids, ours):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
        assert out == ref[0, len(p):].tolist()


@st.composite
def tree_shapes(draw):
    """(topk, num_steps, num_draft_tokens) that SGLang accepts: topk 1 is a chain."""
    topk, steps = draw(st.integers(1, 8)), draw(st.integers(1, 7))
    cap = tree_capacity(topk, steps) + 1
    n = steps + 1 if topk == 1 else draw(st.integers(2, min(cap, 24)))
    return topk, steps, n


@SETTINGS
@given(data=st.data(), algo=st.sampled_from(ALGOS), shape=tree_shapes(), max_new=st.integers(1, 20),
       style=st.sampled_from(["sglang", "vllm"]), extra_eos=st.booleans())
def test_speculative_output_equals_autoregressive(target, drafters, tokenizer, newline_indent, data, algo, shape,
                                                  max_new, style, extra_eos):
    ids = data.draw(prompts(tokenizer))
    eos = (0, newline_indent) if extra_eos else (0,)
    topk, num_steps, n = shape
    ar, _ = generate(target, None, "none", ids, max_new=max_new, eos=eos)
    spec, metrics = generate(target, drafters[algo], algo, ids, num_steps, max_new, style, eos, topk, n)
    assert spec == ar
    assert metrics["completion_tokens"] == sum(map(len, ar))


def _fresh_kv(model, tokens):
    kv = model.new_kv_cache("check", "sglang", len(tokens), 1, len(tokens))
    model(ForwardBatch.build(kv, [(0, 0, tokens)]), kv)
    return kv.pool.k[:, : len(tokens)], kv.pool.v[:, : len(tokens)]


def _check_kv(kv, model, reqs, expected_tokens):
    """No slot leaks; committed KV equals a fresh prefill of the committed tokens."""
    held = [s for r in reqs if not r.finish_reason for s in kv.held_slots(r.req_pool_idx)]
    assert len(held) == len(set(held))
    assert not set(held) & set(kv.allocator.free_slots)
    assert len(held) + len(kv.allocator.free_slots) == kv.allocator.num_slots
    for r in reqs:
        if r.finish_reason:
            continue
        tokens = expected_tokens(r)
        assert kv.seq_lens[r.req_pool_idx] == len(tokens)
        k, v = _fresh_kv(model, tokens)
        slots = kv.committed_slots(r.req_pool_idx)
        torch.testing.assert_close(kv.pool.k[:, slots], k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv.pool.v[:, slots], v, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(data=st.data(), shape=tree_shapes(), style=st.sampled_from(["sglang", "vllm"]))
def test_kv_invariants_after_every_step(target, draft, tokenizer, newline_indent, data, shape, style):
    """Standalone: its draft KV is an LM's KV, so a fresh prefill can check it too."""
    ids = data.draw(prompts(tokenizer))
    topk, num_steps, n = shape
    spec = SpecConfig(algo="standalone", num_steps=num_steps, topk=topk, num_draft_tokens=n,
                      max_new_tokens=12, commit_style=style)
    engine = build_engine(target, draft, spec, ids, (0, newline_indent))
    reqs = [Request(i, p) for i, p in enumerate(ids)]
    engine.prefill(reqs)
    while True:
        # target KV lags one token (the last bonus); the draft's covers every committed token
        _check_kv(engine.kv, target, reqs, lambda r: r.prompt_ids + r.output_ids[:-1])
        _check_kv(engine.drafter.kv, draft, reqs, lambda r: r.prompt_ids + r.output_ids)
        live = [r for r in reqs if not r.finish_reason]
        if not live:
            break
        engine.speculative_step(live)
    for kv in (engine.kv, engine.drafter.kv):  # everything returned at the end
        assert len(kv.allocator.free_slots) == kv.allocator.num_slots


RULE_SHAPES = {"target_only": (4, 3, 8), "tree_rejection": (4, 3, 8), "rejection": (1, 3, None), "vllm": (1, 3, None),
               "typical": (4, 3, 8)}


@SETTINGS
@given(data=st.data(), rule=st.sampled_from(sorted(RULE_SHAPES)), algo=st.sampled_from(["eagle", "eagle3", "mtp"]),
       temperature=st.sampled_from([0.5, 1.0]), seed=st.integers(0, 2**31), style=st.sampled_from(["sglang", "vllm"]))
def test_sampling_rules_are_seeded_and_keep_the_step_invariants(target, drafters, tokenizer, data, rule, algo,
                                                                temperature, seed, style):
    """Every rule through the engine: accept_len = correct + 1 on every step (checked inside
    `generate`), no KV leaked, and a seeded run repeats bit for bit."""
    ids = data.draw(prompts(tokenizer))
    topk, steps, n = RULE_SHAPES[rule]
    kw = dict(acceptance=rule, temperature=temperature, seed=seed, top_k=data.draw(st.sampled_from([0, 20])),
              top_p=data.draw(st.sampled_from([1.0, 0.9])))
    first, m1 = generate(target, drafters[algo], algo, ids, steps, 12, style, (0,), topk, n, **kw)
    again, m2 = generate(target, drafters[algo], algo, ids, steps, 12, style, (0,), topk, n, **kw)
    assert first == again and m1["verify_ct"] == m2["verify_ct"]
