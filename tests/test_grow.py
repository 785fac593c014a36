"""Grown pairs (spectrace/zoo/grow): at the small shape (hidden 512, 10 layers, 16 / 8 heads of 64
dims, vocabulary 8192) every grown model computes its embedded model, in float32: the target's
logits and greedy tokens, every drafter's trees step for step; the free entries change no bit;
the constant channel holds; padded tokens get no probability. tests/test_gpu.py runs the full
Llama-3.1-8B shape."""
import json

import pytest
import torch
from hypothesis import given, strategies as st

from spectrace.algos import ALGOS
from spectrace.core.model import RotaryEmbedding
from spectrace.run import RunConfig, run
from spectrace.zoo import TARGET_DIR
from spectrace.zoo.grow import HEADS, main
from spectrace.zoo.grow.axes import C_VALUE, gqa_map, head_dim_position
from spectrace.zoo.grow.layers import place_layers
from spectrace.zoo.prompts import HELD_OUT_PROMPTS


@pytest.fixture(scope="session")
def grown(tmp_path_factory):
    out = tmp_path_factory.mktemp("grown")
    assert main(["--shape", "small", "--dtype", "float32", str(out)]) == 0
    return out


def hf_logits(path, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], out.hidden_states


def test_the_grown_target_computes_the_embedded_target(grown):
    """Teacher-forced on each held-out prompt: the real vocabulary's logits within float32
    rounding, the same argmax, exactly 0 probability on every padded token, and after every layer
    the stream's constant channel exactly c and the rest past R exactly 0."""
    from spectrace.loading.tokenizer import load_tokenizer

    tok = load_tokenizer(TARGET_DIR)
    d = json.loads((TARGET_DIR / "config.json").read_text())["hidden_size"]
    for prompt in HELD_OUT_PROMPTS:
        ids = tok.encode(prompt)
        tiny, _ = hf_logits(TARGET_DIR, ids)
        big, hidden = hf_logits(grown / "target", ids)
        V = tiny.shape[-1]
        assert (big[:, :V] - tiny).abs().max() < 1e-4
        assert torch.equal(big.argmax(-1), tiny.argmax(-1))
        assert torch.softmax(big, -1)[:, V:].max() == 0
        for x in hidden[:-1]:  # the last is after the final norm
            assert torch.all(x[0, :, d] == C_VALUE) and torch.all(x[0, :, d + 1:] == 0)


def test_the_free_entries_change_no_bit(grown, tmp_path):
    """Another seed changes every random entry; the logits stay bit for bit the same."""
    main(["--shape", "small", "--dtype", "float32", "--heads", "", "--seed", "1", str(tmp_path)])
    ids = list(range(1, 40))
    a, _ = hf_logits(grown / "target", ids)
    b, _ = hf_logits(tmp_path / "target", ids)
    assert torch.equal(a, b)
    one = json.loads((grown / "target" / "config.json").read_text())
    assert one == json.loads((tmp_path / "target" / "config.json").read_text())


def records(algo, target, draft, prompts, max_new_tokens, backend="explicit"):
    steps = []
    cfg = RunConfig(algo=algo, prompts=prompts, batch=len(prompts), max_new_tokens=max_new_tokens, dtype="float32",
                    trace_level="off", backend=backend, **({"target_model": str(target)} if target else {}),
                    **({"draft_model": str(draft)} if draft else {}))
    res = run(cfg, on_step=lambda r: steps.append((r["request"], r["accept_len"], (r.get("draft") or {}).get("tokens"))))
    return [r.output_ids for r in res.requests], steps


def test_the_grown_target_decodes_the_embedded_targets_tokens(grown):
    """Greedy, the 8 held-out prompts x 64 tokens, explicit engine."""
    assert records("none", None, None, HELD_OUT_PROMPTS, 64) == \
        records("none", grown / "target", None, HELD_OUT_PROMPTS, 64)


SUBDIR = {fmt: fmt for fmt in HEADS} | {"lm": "draft"}


@pytest.mark.parametrize("algo", ["standalone", "eagle", "eagle3", "mtp", "frozen_kv_mtp", "medusa", "dflash"])
def test_each_grown_drafter_drafts_the_embedded_drafters_trees(grown, algo):
    """Every step of every request: the same draft tokens and the same accept length."""
    prompts = HELD_OUT_PROMPTS[::3]
    tiny = records(algo, None, None, prompts, 40)
    assert tiny[1], "no steps"
    assert records(algo, grown / "target", grown / SUBDIR[ALGOS[algo].checkpoint], prompts, 40) == tiny


@pytest.mark.parametrize("algo", ["none", "eagle3"])
def test_the_fast_engine_runs_the_grown_pair_as_the_embedded_one(grown, algo):
    prompts = HELD_OUT_PROMPTS[2:3]
    draft = grown / "eagle3" if algo == "eagle3" else None
    assert records(algo, grown / "target", draft, prompts, 10, "fast") == records(algo, None, None, prompts, 10, "fast")


@given(st.sampled_from([16, 32, 64]), st.sampled_from([1, 2, 4]))
def test_a_tiny_rope_pair_keeps_its_frequency_bit_for_bit(tiny_dim, ratio):
    tiny, big = RotaryEmbedding(tiny_dim, 10000.0).inv_freq, RotaryEmbedding(tiny_dim * ratio, 10000.0).inv_freq
    for i in range(tiny_dim // 2):
        j = head_dim_position(i, tiny_dim, tiny_dim * ratio)
        assert big[j] == tiny[i] and head_dim_position(i + tiny_dim // 2, tiny_dim, tiny_dim * ratio) == j + ratio * tiny_dim // 2


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
def test_every_grown_q_head_reads_its_tiny_heads_kv_head(kv, group, rk, more):
    """Grown q head Q attends grown KV head Q // group'; it must carry a tiny q head of the tiny
    KV head that grown KV head carries, and every tiny q head gets the same number of copies."""
    heads, gk, gg = kv * group, kv * rk, group * more
    q_of, kv_of, copies = gqa_map(heads, kv, gk * gg, gk)
    assert all(q_of[Q] // group == kv_of[Q // gg] for Q in range(gk * gg))
    assert all(q_of.count(h) == copies for h in range(heads))


def test_shapes_that_cannot_be_grown_are_refused():
    with pytest.raises(ValueError, match="multiple"):
        gqa_map(8, 4, 12, 6)
    with pytest.raises(ValueError, match="cannot place"):
        place_layers(8, 9, (2, 4, 5), (2, 4, 8))
    assert place_layers(8, 32, (2, 4, 5), (2, 16, 29)) == [0, 1, 2, 9, 16, 29, 30, 31]


@pytest.mark.parametrize("args, says", [(["--shape", "llama-9"], "invalid choice"),
                                        (["--shape", "small", "--heads", "eagle3,eagle9"], "no drafter 'eagle9'")])
def test_the_grow_command_refuses_what_it_cannot_grow(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as e:
        main([*args, str(tmp_path)])
    assert e.value.code == 2 and says in capsys.readouterr().err
