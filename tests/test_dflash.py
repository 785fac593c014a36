"""DFLASH: the block is read without a causal mask, the per-request context cache equals the
dense context the training forward uses, loading is strict, and greedy runs equal autoregressive
decoding."""
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import generate, prompts

from spectrace.errors import SpectraceError
from spectrace.core.drafters.dflash import DFlashDrafter, build_target_layer_ids, load_dflash
from spectrace.zoo import DFLASH_DIR


@pytest.fixture(scope="module")
def small(target, dflash_dir):
    return load_dflash(dflash_dir, target)  # random weights, 2 layers, block 6


def test_build_target_layer_ids():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab's Qwen3-8B drafter
    assert build_target_layer_ids(8, 3) == [1, 3, 5] and build_target_layer_ids(8, 1) == [4]


def test_the_block_is_not_causal(target, small):
    """Row 1's output depends on row 4's input: every block row sees the whole block."""
    m = small
    H, T = target.config.hidden_size, 7
    feats = torch.randn(1, T, 2 * H)
    ctx = m.context_kv(feats, torch.arange(T)[None])
    noise = torch.randn(1, 6, H)
    pos = torch.arange(T, T + 6)[None]
    out = m(noise, pos, ctx, torch.ones(1, T, dtype=torch.bool))
    noise2 = noise.clone()
    noise2[0, 4] += 1.0
    out2 = m(noise2, pos, ctx, torch.ones(1, T, dtype=torch.bool))
    assert not torch.allclose(out[0, 1], out2[0, 1])


def test_the_context_cache_equals_the_dense_context(target, small):
    """The drafter caches context K/V as tokens commit (prefill, then accepted rows); drafting
    from it equals the training forward over all features with the prefix mask."""
    m = small
    H = target.config.hidden_size
    d = DFlashDrafter(m, target)
    feats = torch.randn(13, 2 * H)
    d.draft_extend_for_prefill([(0, [], feats[:5])])
    d.draft_extend([(0, [], feats[5:9])])
    d.draft_extend([(0, [], feats[9:13])])
    root = 42
    block = torch.tensor([root] + [m.mask_token_id] * 5)
    pos = torch.arange(13, 19)[None]
    cached = m(target.model.embed_tokens(block)[None], pos, d.ctx[0], torch.ones(1, 13, dtype=torch.bool))
    # dense: all 16 features, keys after the prefix masked out (as dflash_losses does)
    extra = torch.cat([feats, torch.randn(3, 2 * H)])
    dense_ctx = m.context_kv(extra[None], torch.arange(16)[None])
    mask = torch.arange(16)[None] < 13
    dense = m(target.model.embed_tokens(block)[None], pos, dense_ctx, mask)
    torch.testing.assert_close(cached, dense, atol=1e-5, rtol=1e-5)
    tree = d.draft([0], [root], [13])
    assert tree.draft_tokens[0, 0] == root and tree.draft_tokens.shape[1] == 6
    assert tree.draft_tokens[0, 1:].tolist() == torch.argmax(target.lm_head(cached[0, 1:]), -1).tolist()


def test_loader_checks_the_checkpoint(target, dflash_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    cfg = json.loads((dflash_dir / "config.json").read_text())
    state = load_file(dflash_dir / "model.safetensors")
    for name, c, st_, message in [
        ("layers", {**cfg, "num_target_layers": 12}, state, "num_target_layers 12"),
        ("missing", cfg, {k: v for k, v in state.items() if "q_norm" not in k}, "missing"),
        ("block", {**cfg, "block_size": 1}, state, "block_size 1"),
        ("taps", {**cfg, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 9]}}, state, "target layers"),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(c))
        save_file(st_, tmp_path / name / "model.safetensors")
        with pytest.raises(SpectraceError, match=message):
            load_dflash(tmp_path / name, target)


@pytest.fixture(scope="module")
def dflash(target):
    return load_dflash(DFLASH_DIR, target)  # the embedded drafter: its drafts do get accepted


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), max_new=st.integers(1, 24))
def test_dflash_output_equals_autoregressive(target, dflash, tokenizer, data, max_new):
    ids = data.draw(prompts(tokenizer))
    ar, _ = generate(target, None, "none", ids, max_new=max_new)
    B = dflash.block_size
    spec, _ = generate(target, dflash, "dflash", ids, B - 1, max_new, "sglang", (0,), 1, B)
    assert spec == ar
