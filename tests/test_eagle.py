"""Draft heads (EAGLE-1, NEXTN/MTP, EAGLE-3, FROZEN_KV_MTP): training forward == engine forward;
strict, checked loading."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from spectrace.cli import main
from spectrace.core.batch import ForwardBatch
from spectrace.errors import SpectraceError
from spectrace.core.drafters.eagle import load_eagle
from spectrace.core.drafters.eagle3 import load_eagle3
from spectrace.core.drafters.eagle3_layouts import default_capture_layers
from spectrace.core.drafters.frozen_kv_mtp import load_frozen_kv_mtp
from spectrace.core.drafters.mtp import load_mtp
from spectrace.core.drafters.scratch import TreeScratch
from spectrace.zoo import EAGLE3_DIR, EAGLE_DIR, FROZEN_KV_MTP_DIR, MTP_DIR, TARGET_DIR
from spectrace.zoo.head_losses import eagle_level, frozen_level
from spectrace.zoo.train_eagle import draft_vocab, head_config, new_head


def _random_head(kind, target):
    torch.manual_seed(0)
    cfg = head_config(target_hf_config(), kind, draft_vocab_size=1000)
    d2t, t2d, _ = draft_vocab(torch.randint(0, 4096, (20000,)), target.config.vocab_size, 1000)
    head = new_head(kind, cfg, target.config, d2t, t2d).eval()
    for p in head.parameters():  # RMSNorm weights start at 1: perturb everything
        p.data.add_(torch.randn_like(p) * 0.02)
    return head


def target_hf_config():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(TARGET_DIR)


def _prefill_target(target, ids):
    kv = target.new_kv_cache("target", "sglang", 128, 1, 128)
    out = target(ForwardBatch.build(kv, [(0, 0, ids)]), kv, default_capture_layers(8))
    kv.commit(0, 0, len(ids), list(range(len(ids))))
    return kv, out


@pytest.mark.parametrize("kind", ["eagle", "mtp", "eagle3"])
def test_unrolled_training_levels_equal_chain_drafting(target, kind):
    """Level j of the training-time test at anchor t == the head drafting a chain after t."""
    head, levels, t = _random_head(kind, target), 4, 9
    ids = torch.randint(0, 4096, (1, 20))
    _, out = _prefill_target(target, ids[0, :-1].tolist())
    feats = (torch.cat(out.aux_hidden_states, -1) if kind == "eagle3" else out.hidden_states).unsqueeze(0)
    n = feats.shape[1] - levels  # anchors, as unrolled_losses takes them
    dense, past, inputs = [], [], feats[:, :n]
    with torch.no_grad():
        for j in range(1, levels + 1):
            inputs = eagle_level(head, ids[:, j:j + n], inputs, j, past)
            dense.append(inputs[0])
    # the engine: prefill pairs (f_s, x_{s+1}) for s <= t, then a chain from anchor t in scratch KV
    kv = head.new_kv_cache("draft", "sglang", 64, 1, 64)
    h = head(ForwardBatch.build(kv, [(0, 0, ids[0, 1:t + 2].tolist())]), kv, feats[0, :t + 1])
    kv.commit(0, 0, t + 1, list(range(t + 1)))
    torch.testing.assert_close(h, dense[0][:t + 1], atol=1e-5, rtol=1e-5)
    scratch = TreeScratch(kv, [0], 1, levels, [t + 1])
    h = h[t:t + 1]
    for i in range(levels - 1):
        # a chain's kept path at level i is candidate i (one per level), the child of candidate i - 1
        batch = scratch.batch(i, ids[0, t + i + 2:t + i + 3], torch.tensor([[i]]))
        h = head(batch, kv, h)
        torch.testing.assert_close(h[0], dense[i + 1][t], atol=1e-5, rtol=1e-5)


def test_frozen_kv_training_levels_equal_drafting(target):
    head, t = _random_head("frozen_kv_mtp", target), 9
    ids = torch.randint(0, 4096, (1, 20))
    kv, out = _prefill_target(target, ids[0, :-1].tolist())
    slots = kv.req_to_token[0, :19]
    tk, tv = (x[target.config.num_hidden_layers - 1, slots].unsqueeze(0) for x in (kv.pool.k, kv.pool.v))
    embed = target.model.embed_tokens
    with torch.no_grad():
        h1, logits1 = frozen_level(head, embed(ids[:, 1:19]), out.hidden_states[None, :18], tk[:, :18], tv[:, :18])
        h2, logits2 = frozen_level(head, embed(ids[:, 2:20]), h1, tk[:, :18], tv[:, :18])
    # the drafter at anchor t: target KV holds x_0..x_t, the root x_{t+1} sits at position t + 1
    rows, pos = [(0, t + 1, 1)], torch.tensor([t + 1])
    h, logits = head(embed(ids[0, t + 1:t + 2]), out.hidden_states[t:t + 1], pos, kv, rows)
    torch.testing.assert_close(h[0], h1[0, t], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[0], logits1[0, t], atol=1e-4, rtol=1e-5)
    h, logits = head(embed(ids[0, t + 2:t + 3]), h, pos, kv, rows)
    torch.testing.assert_close(logits[0], logits2[0, t], atol=1e-4, rtol=1e-5)


def _copy(src, dst, edit_state=None, edit_config=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    if edit_config:
        edit_config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    state = load_file(src / "model.safetensors")
    if edit_state:
        edit_state(state)
    save_file(state, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize("src, load, key", [
    (EAGLE_DIR, load_eagle, "layers.0.mlp.up_proj.weight"),
    (MTP_DIR, load_mtp, "hnorm.weight"),
    (EAGLE3_DIR, load_eagle3, "midlayer.hidden_norm.weight"),
    (FROZEN_KV_MTP_DIR, load_frozen_kv_mtp, "model.layers.1.self_attn.q_proj.weight"),
])
def test_loaders_reject_missing_and_unexpected_keys(target, tmp_path, src, load, key):
    with pytest.raises(SpectraceError, match="missing"):
        load(_copy(src, tmp_path / "missing", lambda s: s.pop(key)), target)
    with pytest.raises(SpectraceError, match="unexpected"):
        load(_copy(src, tmp_path / "extra", lambda s: s.__setitem__("layers.9.extra.weight", torch.zeros(1))), target)
    if "embed_tokens.weight" in load_file(src / "model.safetensors"):
        # the target's embedding may stand in for the head's copy, as EAGLE's loader assumes
        head = load(_copy(src, tmp_path / "noembed", lambda s: s.pop("embed_tokens.weight")), target)
        assert torch.equal(head.embed_tokens.weight, target.model.embed_tokens.weight)


def _shrink(state):
    """Every hidden-size dimension halved: a head made for a target of hidden size 128."""
    for k in list(state):
        state[k] = torch.zeros([d // 2 if d in (256, 512, 768) else d for d in state[k].shape], dtype=state[k].dtype)


@pytest.mark.parametrize("algo, src, load", [("eagle", EAGLE_DIR, load_eagle), ("eagle3", EAGLE3_DIR, load_eagle3),
                                             ("frozen_kv_mtp", FROZEN_KV_MTP_DIR, load_frozen_kv_mtp)])
def test_head_of_another_hidden_size_is_refused(target, tmp_path, capsys, algo, src, load):
    def config(c):
        c.update(hidden_size=128)
        if "backbone_hidden_size" in c:
            c["backbone_hidden_size"] = 128

    bad = _copy(src, tmp_path / "small", _shrink, config)
    with pytest.raises(SpectraceError, match="does not fit the target"):
        load(bad, target)
    capsys.readouterr()
    assert main(["run", "--algo", algo, "--draft-model", str(bad), "--no-tui", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "does not fit the target" in err


def test_eagle3_head_drafts_only_its_vocabulary_and_reads_three_taps(target):
    head = load_eagle3(EAGLE3_DIR, target)
    assert head.capture_layers == (2, 4, 5)  # 2, L//2, L-3 for the 8-layer target
    logits = head.compute_logits(torch.randn(3, target.config.hidden_size))
    allowed = torch.isfinite(logits)
    assert torch.equal(allowed, head.t2d.expand(3, -1)) and head.t2d.sum() == len(head.d2t)


@pytest.mark.parametrize("args, message", [
    (["--topk", "0"], "--topk must be at least 1"),
    (["--topk", "2", "--num-steps", "2", "--num-draft-tokens", "8"], "holds 2 to 7 nodes"),
])
def test_bad_tree_shapes_are_one_line_and_exit_2(capsys, args, message):
    capsys.readouterr()
    assert main(["run", "--algo", "eagle", "--no-tui", "--max-new-tokens", "2", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err
