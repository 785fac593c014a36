"""Fixtures shared by the tests: the embedded models, small random checkpoints, and `generate`,
which runs the engine and checks the invariants every run must keep."""
import os

import pytest
import torch
from hypothesis import strategies as st

if not torch.cuda.is_available():  # Triton kernels run interpreted on CPU tensors; set before they are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:  # pytest -n: a core per worker, no thrashing
    torch.set_num_threads(1)

from spectrace.core.drafters.eagle import load_eagle
from spectrace.core.drafters.eagle3 import load_eagle3
from spectrace.core.drafters.frozen_kv_mtp import load_frozen_kv_mtp
from spectrace.core.drafters.mtp import load_mtp
from spectrace.core.spec import SpecConfig
from spectrace.core.model import load_model
from spectrace.run import build_engine
from spectrace.zoo import DRAFT_DIR, EAGLE3_DIR, EAGLE_DIR, FROZEN_KV_MTP_DIR, MTP_DIR, TARGET_DIR
from spectrace.zoo.prompts import HELD_OUT_PROMPTS



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


@st.composite
def prompts(draw, tokenizer):
    """Held-out code cut at a random point, sometimes after random token ids."""
    n = draw(st.integers(1, 4))
    out = []
    for _ in range(n):
        ids = tokenizer.encode(draw(st.sampled_from(HELD_OUT_PROMPTS)))
        ids = ids[: draw(st.integers(1, len(ids)))]
        noise = draw(st.lists(st.integers(1, 4095), max_size=6))
        out.append(noise + ids)
    return out


def generate(target, draft, algo, prompt_ids, num_steps=3, max_new=16, style="sglang", eos=(0,), topk=1, n=None,
             ngram=None, medusa_tree=None, steps=None, **sampling):
    """A run of the engine; checks that no KV slot leaked, that every step record keeps
    accept_len = correct + 1, and that the records add up to each request's output. `steps`,
    when given, collects the step records. Returns (output ids per request, metrics)."""
    spec = SpecConfig(algo=algo, num_steps=num_steps, topk=topk, num_draft_tokens=n, max_new_tokens=max_new,
                      commit_style=style, **sampling)
    records = [] if steps is None else steps
    engine = build_engine(target, draft if algo != "none" else None, spec, prompt_ids, eos, ngram=ngram,
                          medusa_tree=medusa_tree, on_step=records.append)
    reqs, metrics = engine.generate(prompt_ids)
    for kv in [engine.kv] + ([engine.drafter_kv] if engine.drafter_kv is not None else []):  # no slot leaked
        assert len(kv.allocator.free_slots) == kv.allocator.num_slots
    for rec in records:  # every step of every request
        assert rec["accept_len"] == len(rec["correct_drafts"]) + 1
        assert rec["accept_tokens"] == rec["correct_drafts"] + [rec["bonus_token"]]
        assert rec["committed_tokens"] == rec["accept_tokens"][: len(rec["committed_tokens"])]
    for r in reqs:  # the first token comes from prefill, every other one from a step's record
        mine = [s for s in records if s["request"] == r.req_pool_idx]
        assert [r.output_ids[0]] + [t for s in mine for t in s["committed_tokens"]] == r.output_ids
        if algo == "none":
            assert len(mine) == len(r.output_ids) - 1
    return [r.output_ids for r in reqs], metrics
