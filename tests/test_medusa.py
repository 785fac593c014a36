"""Medusa: static trees from Medusa choices, strict loading of the public layout, and greedy
Medusa runs equal autoregressive decoding."""
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import generate, prompts

from spectrace.errors import SpectraceError
from spectrace.core.drafters.medusa import MC_SIM_7B_63, MedusaDrafter, MedusaHeads, MedusaTree, check_choices, \
    load_medusa
from spectrace.zoo import MEDUSA_DIR


@pytest.fixture(scope="module")
def heads(target):
    return load_medusa(MEDUSA_DIR, target)


def test_the_static_tree_follows_the_choices(heads):
    """Node i+1 is choices[i] (sorted by length, then ranks); its token is head depth-1's rank-th
    best, whatever its parent; the mask holds the root and the path's prefixes."""
    choices = [[1], [0], [0, 0], [0, 1], [1, 0], [0, 0, 2]]
    d = MedusaDrafter(heads, MedusaTree.from_choices(choices, heads.num_heads))
    assert d.tree.choices == [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 2]]
    assert d.tree.parent == [0, 0, 1, 1, 2, 3]
    torch.manual_seed(0)
    d.last_hidden[0] = torch.randn(heads.medusa_head[0][-1].weight.shape[1])
    tree = d.draft([0], [7], [10])
    probs = torch.softmax(heads(d.last_hidden[0].view(1, -1)).float(), -1)[:, 0]  # (K, V)
    order = torch.argsort(probs, dim=-1, descending=True)
    want = [int(order[len(c) - 1, c[-1]]) for c in d.tree.choices]
    assert tree.draft_tokens[0].tolist() == [7] + want
    assert tree.parents(0) == d.tree.parent
    assert tree.positions[0].tolist() == [10, 11, 11, 12, 12, 12, 13]
    assert tree.retrive_next_token[0].tolist()[:3] == [1, 3, 5] and tree.retrive_next_sibling[0, 1] == 2


@pytest.mark.parametrize("choices, message", [
    ([[0, 0]], "no parent"), ([[0], [0]], "repeat"), ([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]], "3 heads"),
    ([[]], "non-empty"), ([[0], [-1]], "ranks >= 0")])
def test_bad_choices_are_refused(choices, message):
    with pytest.raises(SpectraceError, match=message):
        check_choices(choices, 3)


def test_the_default_choices_are_a_tree():
    assert check_choices(MC_SIM_7B_63, 4) == sorted(MC_SIM_7B_63, key=lambda p: (len(p), p))


def test_loader_checks_the_key_set(target, tmp_path):
    from safetensors.torch import save_file

    H, V = target.config.hidden_size, target.config.vocab_size
    good = {k: v.contiguous() for k, v in MedusaHeads(H, V, 2).state_dict().items()}
    for name, state, cfg, message in [
        ("missing", {k: v for k, v in good.items() if "1.1" not in k}, {"medusa_num_heads": 2}, "missing"),
        ("heads", good, {"medusa_num_heads": 3}, "missing"),
        ("noconfig", good, {"hidden_size": H}, "not a Medusa config"),
        ("hidden", good, {"medusa_num_heads": 2, "hidden_size": H + 1}, "hidden size"),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        save_file(state, tmp_path / name / "medusa_lm_head.safetensors")
        with pytest.raises(SpectraceError, match=message):
            load_medusa(tmp_path / name, target)
    # the ModuleList saved alone (keys without `medusa_head.`) loads too
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    save_file({k.removeprefix("medusa_head."): v for k, v in good.items()}, tmp_path / "bare" / "medusa_lm_head.safetensors")
    assert load_medusa(tmp_path / "bare", target).num_heads == 2


trees = st.sampled_from([MC_SIM_7B_63[:24], MC_SIM_7B_63[:6], [[0], [0, 0], [0, 0, 0]], [[0], [1], [2], [3]],
                         [[0], [1], [0, 0], [1, 0], [0, 0, 0]]])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), choices=trees, max_new=st.integers(1, 20))
def test_medusa_output_equals_autoregressive(target, heads, tokenizer, data, choices, max_new):
    ids = data.draw(prompts(tokenizer))
    ar, _ = generate(target, None, "none", ids, max_new=max_new)
    depth, width = max(map(len, choices)), max(max(c) for c in choices) + 1
    spec, _ = generate(target, heads, "medusa", ids, depth, max_new, "sglang", (0,), width, len(choices) + 1,
                       medusa_tree=MedusaTree.from_choices(choices, heads.num_heads))
    assert spec == ar
