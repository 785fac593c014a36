import pytest
import torch

from spectrace.core.drafters.eagle import load_eagle
from spectrace.core.drafters.eagle3 import load_eagle3
from spectrace.core.drafters.frozen_kv_mtp import load_frozen_kv_mtp
from spectrace.core.drafters.mtp import load_mtp
from spectrace.core.model import load_model
from spectrace.zoo import DRAFT_DIR, EAGLE3_DIR, EAGLE_DIR, FROZEN_KV_MTP_DIR, MTP_DIR, TARGET_DIR


@pytest.fixture(scope="session")
def target():
    return load_model(TARGET_DIR, torch.float32)


@pytest.fixture(scope="session")
def draft():
    return load_model(DRAFT_DIR, torch.float32)


@pytest.fixture(scope="session")
def drafters(target, draft):
    """The embedded draft model of every algorithm, by --algo name."""
    mtp = load_mtp(MTP_DIR, target)
    return {"standalone": draft, "eagle": load_eagle(EAGLE_DIR, target), "eagle3": load_eagle3(EAGLE3_DIR, target),
            "mtp": mtp, "nextn": mtp, "frozen_kv_mtp": load_frozen_kv_mtp(FROZEN_KV_MTP_DIR, target)}


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TARGET_DIR)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory):
    """A random-weight Qwen2-style model (q/k/v bias, GQA, untied head) saved by transformers."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, rope_theta=5000.0)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # transformers initialises biases to zero: make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def dflash_dir(tmp_path_factory, target):
    """A random-weight DFLASH checkpoint for the target (2 layers, block 6, mask token 5) in
    z-lab's layout: for tests of loading, errors and viewers, not of acceptance."""
    import json

    from safetensors.torch import save_file

    from spectrace.core.config import ModelConfig
    from spectrace.core.drafters.dflash import DFlashDraftModel, build_target_layer_ids

    tc = target.config
    torch.manual_seed(0)
    ids = build_target_layer_ids(tc.num_hidden_layers, 2)
    model = DFlashDraftModel(ModelConfig(**{**tc.__dict__, "num_hidden_layers": 2}), ids, 6, 5)
    path = tmp_path_factory.mktemp("dflash")
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "llama", "hidden_size": tc.hidden_size,
           "intermediate_size": tc.intermediate_size, "num_hidden_layers": 2,
           "num_attention_heads": tc.num_attention_heads, "num_key_value_heads": tc.num_key_value_heads,
           "head_dim": tc.head_dim, "vocab_size": tc.vocab_size, "max_position_embeddings": tc.max_position_embeddings,
           "block_size": 6, "num_target_layers": tc.num_hidden_layers,
           "dflash_config": {"mask_token_id": 5, "target_layer_ids": ids}}
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path / "model.safetensors")
    return path
