"""EAGLE-1 and NEXTN/MTP heads: training forward == engine forward; strict, checked loading."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from spectrace.cli import main
from spectrace.core.batch import ForwardBatch
from spectrace.core.config import SpectraceError
from spectrace.core.drafters.eagle import EagleHead, load_eagle
from spectrace.core.drafters.mtp import MtpHead, load_mtp
from spectrace.zoo import EAGLE_DIR, MTP_DIR
from spectrace.zoo.train_eagle import dense_forward


@pytest.mark.parametrize("cls", [EagleHead, MtpHead])
def test_dense_training_forward_equals_paged_forward(target, cls):
    torch.manual_seed(0)
    head = cls(target.config).eval()
    for p in head.parameters():  # RMSNorm weights start at 1: perturb everything
        p.data.add_(torch.randn_like(p) * 0.02)
    ids = torch.randint(0, target.config.vocab_size, (2, 24))
    feats = torch.randn(2, 24, target.config.hidden_size)
    with torch.no_grad():
        dense = dense_forward(head, ids, feats)
    kv = head.new_kv_cache("draft", "sglang", 64, 2, 64)
    batch = ForwardBatch.build(kv, [(0, 0, ids[0].tolist()), (1, 0, ids[1].tolist())])
    paged = head(batch, kv, feats.flatten(0, 1))
    torch.testing.assert_close(paged, dense.flatten(0, 1), atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("src, load, key", [(EAGLE_DIR, load_eagle, "layers.0.mlp.up_proj.weight"),
                                            (MTP_DIR, load_mtp, "hnorm.weight")])
def test_loaders_reject_missing_and_unexpected_keys(target, tmp_path, src, load, key):
    with pytest.raises(SpectraceError, match="missing"):
        load(_copy(src, tmp_path / "missing", lambda s: s.pop(key)), target)
    with pytest.raises(SpectraceError, match="unexpected"):
        load(_copy(src, tmp_path / "extra", lambda s: s.__setitem__("lm_head.weight", torch.zeros(1))), target)
    # the target's embedding may stand in for the head's copy, as EAGLE's loader assumes
    head = load(_copy(src, tmp_path / "noembed", lambda s: s.pop("embed_tokens.weight")), target)
    assert torch.equal(head.embed_tokens.weight, target.model.embed_tokens.weight)


def test_eagle_checkpoint_of_another_hidden_size_is_refused(target, tmp_path, capsys):
    def shrink(state):
        for k in list(state):
            state[k] = torch.zeros([d // 2 if d in (256, 512) else d for d in state[k].shape], dtype=state[k].dtype)

    bad = _copy(EAGLE_DIR, tmp_path / "small", shrink, lambda c: c.update(hidden_size=128))
    with pytest.raises(SpectraceError, match="does not fit the target"):
        load_eagle(bad, target)
    capsys.readouterr()
    assert main(["run", "--algo", "eagle", "--draft-model", str(bad), "--no-tui", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "does not fit the target" in err


@pytest.mark.parametrize("args, message", [
    (["--topk", "0"], "--topk must be at least 1"),
    (["--topk", "2", "--num-steps", "2", "--num-draft-tokens", "8"], "holds 2 to 7 nodes"),
])
def test_bad_tree_shapes_are_one_line_and_exit_2(capsys, args, message):
    capsys.readouterr()
    assert main(["run", "--algo", "eagle", "--no-tui", "--max-new-tokens", "2", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err
