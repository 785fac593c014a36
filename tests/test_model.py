"""Our explicit forward over the paged KV cache equals transformers' forward."""
import json
import re

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from spectrace.core.batch import ForwardBatch
from spectrace.core.config import ModelConfig, read_config_json
from spectrace.core.model import load_model
from spectrace.errors import SpectraceError
from spectrace.zoo import TARGET_DIR


def _reference(path, ids):
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids]), output_hidden_states=True)


def _prefill(model, ids, capture=()):
    kv = model.new_kv_cache("target", "sglang", 256, 1, 256)
    batch = ForwardBatch.build(kv, [(0, 0, ids)])
    out = model(batch, kv, capture_layers=capture)
    kv.commit(0, 0, len(ids), list(range(len(ids))))
    return out, kv


@pytest.mark.parametrize("which", ["embedded", "qwen2"])
def test_prefill_logits_and_hidden_states_equal_transformers(which, target, qwen2_dir):
    path = TARGET_DIR if which == "embedded" else qwen2_dir
    model = target if which == "embedded" else load_model(qwen2_dir)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (57,), generator=g).tolist()
    ref = _reference(path, ids)
    L = model.config.num_hidden_layers
    out, _ = _prefill(model, ids, capture=tuple(range(L)))
    torch.testing.assert_close(out.logits, ref.logits[0], atol=2e-5, rtol=1e-5)
    for i in range(L):  # input of layer i == transformers' hidden_states[i]
        torch.testing.assert_close(out.aux_hidden_states[i], ref.hidden_states[i][0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out.hidden_states, ref.hidden_states[L][0], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_prefill_then_decode_then_verify_equals_one_full_forward(style, qwen2_dir):
    """Logits of tokens fed in three phases through the paged cache equal a single pass."""
    model = load_model(qwen2_dir)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 300, (30,), generator=g).tolist()
    ref = _reference(qwen2_dir, ids).logits[0]
    kv = model.new_kv_cache("target", style, 64, 2, 64)
    # request 1 holds slots first, so request 0's slots are not contiguous
    kv.prepare(1, 0, 5)
    kv.commit(1, 0, 5, list(range(5)))
    chunks = [(0, 20), (20, 21), (21, 25), (25, 30)]  # prefill, decode, verify, verify
    for a, b in chunks:
        out = model(ForwardBatch.build(kv, [(0, a, ids[a:b])]), kv)
        kv.commit(0, a, b - a, list(range(b - a)))
        torch.testing.assert_close(out.logits, ref[a:b], atol=2e-5, rtol=1e-5)


def test_custom_mask_rows_see_only_what_the_mask_allows(qwen2_dir):
    """Four verify rows as siblings (each sees the prefix and itself) equal transformers run on
    prefix + that one token at that row's position."""
    model = load_model(qwen2_dir)
    hf = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32).eval()
    ids = list(range(10, 30))
    kv = model.new_kv_cache("target", "sglang", 64, 1, 64)
    model(ForwardBatch.build(kv, [(0, 0, ids[:16])]), kv)
    kv.commit(0, 0, 16, list(range(16)))
    mask = torch.zeros(4, 20, dtype=torch.bool)
    mask[:, :16] = True
    mask[torch.arange(4), 16 + torch.arange(4)] = True
    out = model(ForwardBatch.build(kv, [(0, 16, ids[16:20])], masks=[mask]), kv)
    for j in range(4):
        pos = torch.tensor([list(range(16)) + [16 + j]])
        with torch.no_grad():
            ref = hf(torch.tensor([ids[:16] + [ids[16 + j]]]), position_ids=pos).logits[0, -1]
        torch.testing.assert_close(out.logits[j], ref, atol=2e-5, rtol=1e-5)


def _copy_checkpoint(src, dst, edit):
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    state = load_file(src / "model.safetensors")
    edit(state)
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})


def test_loader_rejects_missing_and_unexpected_keys(qwen2_dir, tmp_path):
    _copy_checkpoint(qwen2_dir, tmp_path / "missing", lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(SpectraceError, match="missing.*up_proj"):
        load_model(tmp_path / "missing")
    _copy_checkpoint(qwen2_dir, tmp_path / "extra", lambda s: s.__setitem__("model.extra.weight", torch.zeros(2)))
    with pytest.raises(SpectraceError, match="unexpected.*extra"):
        load_model(tmp_path / "extra")


@pytest.mark.parametrize("edit, says", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope_parameters.rope_type 'yarn'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type 'dynamic'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling of type 'llama3' has no low_freq_factor"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"model_type": "qwen3_moe"}, "model_type 'qwen3_moe'"),
    ({"model_type": "deepseek_v3"}, "model_type 'deepseek_v3'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
])
def test_loader_refuses_what_it_does_not_compute_naming_the_field(qwen2_dir, tmp_path, edit, says):
    d = tmp_path / "unsupported"
    _copy_checkpoint(qwen2_dir, d, lambda s: None)
    cfg = {k: v for k, v in json.loads((d / "config.json").read_text()).items() if k not in ("rope_parameters",)}
    (d / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(SpectraceError, match=f"config.json: {re.escape(says)}"):
        load_model(d)


# ---- config.json, read as transformers reads it --------------------------------------------

def _as_transformers_reads_it(raw: dict) -> dict:
    """The fields of ModelConfig from transformers' own config class: the reference reading."""
    from transformers import AutoConfig

    hf = AutoConfig.for_model(**raw)
    heads = hf.num_attention_heads
    rope = dict(getattr(hf, "rope_parameters", None) or {})
    if hf.model_type in ("llama", "qwen3"):
        qkv_bias = o_bias = bool(hf.attention_bias)
    else:
        qkv_bias, o_bias = {"mistral": (False, False), "qwen2": (True, False)}[hf.model_type]
    window = None  # the window of the layers that slide (Qwen's per layer_types)
    if hf.model_type == "mistral" or "sliding_attention" in (getattr(hf, "layer_types", None) or []):
        window = hf.sliding_window
    scaling = None
    if rope.get("rope_type", "default") == "llama3":
        scaling = {k: rope[k] for k in ("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings")}
    eos = hf.eos_token_id
    return dict(model_type=hf.model_type, vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
                num_hidden_layers=hf.num_hidden_layers, num_attention_heads=heads,
                num_key_value_heads=hf.num_key_value_heads or heads,
                head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
                intermediate_size=hf.intermediate_size, rms_norm_eps=hf.rms_norm_eps,
                rope_theta=float(rope.get("rope_theta", 10000.0)), rope_scaling=scaling,
                max_position_embeddings=hf.max_position_embeddings,
                qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=bool(getattr(hf, "mlp_bias", False)),
                qk_norm=hf.model_type == "qwen3", sliding_window=window,
                tie_word_embeddings=bool(hf.tie_word_embeddings),
                eos_token_ids=tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,)))


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
FIELDS = {"vocab_size": st.integers(10, 300), "hidden_size": st.sampled_from([64, 96]),
          "num_hidden_layers": st.integers(1, 4), "num_attention_heads": st.sampled_from([4, 8]),
          "num_key_value_heads": st.sampled_from([None, 2, 4]), "head_dim": st.sampled_from([16, 32]),
          "intermediate_size": st.integers(32, 128), "rms_norm_eps": st.sampled_from([1e-5, 1e-6]),
          "max_position_embeddings": st.integers(64, 4096), "attention_bias": st.booleans(),
          "tie_word_embeddings": st.booleans(), "eos_token_id": st.sampled_from([None, 0, [0, 2]]),
          "rope_theta": st.sampled_from([5000.0, 1e6]),
          "rope_scaling": st.sampled_from([None, LLAMA3, {**LLAMA3, "original_max_position_embeddings": 32}]),
          "sliding_window": st.sampled_from([None, 64, 4096]), "use_sliding_window": st.booleans(),
          "max_window_layers": st.integers(0, 4)}


@settings(max_examples=60, deadline=None)
@given(model_type=st.sampled_from(["llama", "mistral", "qwen2", "qwen3"]), data=st.data())
def test_config_json_is_read_as_transformers_reads_it(model_type, data):
    """Any subset of the fields, the rest left to the defaults: the same reading as transformers'
    LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config (ModelConfig reads config.json without them)."""
    raw = {"model_type": model_type}
    for name, values in FIELDS.items():
        if data.draw(st.booleans(), label=f"has {name}"):
            raw[name] = data.draw(values, label=name)
    from huggingface_hub.errors import StrictDataclassError

    try:
        reference = _as_transformers_reads_it(raw)
    except StrictDataclassError:  # a file transformers refuses (Mistral's KV heads null): not a reference
        assume(False)
    if reference["num_attention_heads"] % reference["num_key_value_heads"]:  # transformers builds it; no forward can
        with pytest.raises(SpectraceError, match="not a multiple of num_key_value_heads"):
            ModelConfig.from_json(raw)
        return
    assert ModelConfig.from_json(raw).__dict__ == reference


def test_embedded_configs_are_read_as_transformers_reads_them(qwen2_dir):
    from spectrace.zoo import MODELS_DIR

    for path in [qwen2_dir] + [d for d in MODELS_DIR.iterdir() if d.name != "tiny-medusa"]:
        raw = read_config_json(path)
        assert ModelConfig.from_json(raw).__dict__ == _as_transformers_reads_it(raw), path


def tree_verify_and_decodes(device: str, invariant: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """bf16 embedded target: a 7-node tree verified in one pass (batch_invariant or not), and each
    node's logits from decoding its path root..node one token a pass after the same prefill.
    Returns (verified row, decoded row) per node."""
    model = load_model(TARGET_DIR, torch.bfloat16, device)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(5, 4000, (20,), generator=g).tolist()
    parents = [None, 0, 0, 1, 1, 2, 3]  # node 0 is the root (the last committed token)
    tokens = torch.randint(5, 4000, (len(parents),), generator=g).tolist()
    paths = []  # each node's path from the root
    for j, p in enumerate(parents):
        paths.append([j] if p is None else paths[p] + [j])
    n, P = len(parents), len(prompt)
    mask = torch.zeros(n, P + n, dtype=torch.bool, device=device)
    mask[:, :P] = True
    for j, path in enumerate(paths):
        mask[j, [P + k for k in path]] = True

    def prefilled():
        kv = model.new_kv_cache("target", "sglang", 128, 1, 128)
        model(ForwardBatch.build(kv, [(0, 0, prompt)]), kv)
        kv.commit(0, 0, P, list(range(P)))
        return kv
    kv = prefilled()
    batch = ForwardBatch.build(kv, [(0, P, tokens)], masks=[mask], positions=[[P + len(p) - 1 for p in paths]])
    batch.batch_invariant = invariant
    verified = model(batch, kv).logits
    pairs = []
    for j, path in enumerate(paths):
        kv = prefilled()
        for k, node in enumerate(path):  # plain decoding of the path, one token a pass
            logits = model(ForwardBatch.build(kv, [(0, P + k, [tokens[node]])]), kv).logits[0]
            kv.commit(0, P + k, 1, [0])
        pairs.append((verified[j], logits))
    return pairs


def test_batch_invariant_verify_gives_each_node_its_one_token_decode_bit_for_bit():
    """--deterministic in bf16: every node of a verified tree gets exactly the logits that decoding
    its path gives (what makes greedy speculative output bit-identical to plain decoding's). On
    this CPU the batched verify happens to agree too; tests/test_gpu.py shows where it does not."""
    for j, (verified, decoded) in enumerate(tree_verify_and_decodes("cpu", invariant=True)):
        assert torch.equal(verified, decoded), j
