"""Real model families beside the embedded pair, on small random checkpoints that transformers
writes (spectrace/zoo/random_checkpoint.py's --tiny: each family's traits at a few MB):
Llama 3.x with llama3 RoPE (tied and untied), Qwen2.5, Qwen3 (q/k norm, its own head_dim),
Mistral with a sliding window. transformers is the reference: logits, and greedy tokens of
generate. The EAGLE heads in their published layouts, hub names from a cache laid out here, the
chat template and readable token pieces."""
import json
import re
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from spectrace.core.batch import ForwardBatch
from spectrace.core.drafters.eagle3 import load_eagle3
from spectrace.core.model import load_model
from spectrace.errors import SpectraceError
from spectrace.run import RunConfig, run
from spectrace.zoo.random_checkpoint import make

PROMPT = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"


@pytest.fixture(scope="session")
def families(tmp_path_factory, qwen2_dir):
    """family -> a directory of random-weight checkpoints (OUT/target and the heads written)."""
    from transformers import MistralConfig, MistralForCausalLM

    root = tmp_path_factory.mktemp("families")
    dirs = {"llama3": make("llama-3.1-8b", root / "llama3", ("eagle3", "eagle3-sglang", "eagle3-speculators", "eagle"),
                           tiny=True, dtype=torch.float32),
            "llama3-tied": make("llama-3.2-1b", root / "llama3-tied", (), tiny=True, dtype=torch.float32),
            "qwen3": make("qwen3-8b", root / "qwen3", ("eagle3",), tiny=True, dtype=torch.float32),
            "qwen2.5": make("qwen2.5-7b", root / "qwen2.5", ("draft",), tiny=True, dtype=torch.float32),
            "mistral-v0.3": make("mistral-7b", root / "mistral-v0.3", (), tiny=True, dtype=torch.float32)}
    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                               num_attention_heads=4, num_key_value_heads=2, sliding_window=48))
    mistral.save_pretrained(root / "mistral" / "target")
    for f in ("tokenizer.json", "tokenizer_config.json"):  # ids below 1024: any tokenizer of that size runs it
        shutil.copy(dirs["llama3"] / "target" / f, root / "mistral" / "target" / f)
    dirs["mistral"] = root / "mistral"
    dirs["qwen2"] = qwen2_dir  # no tokenizer: logits only
    return dirs


def target_dir(families, family):
    return families[family] if family == "qwen2" else families[family] / "target"


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the fused kernels: compiled there, else interpreted


@pytest.mark.parametrize("family, fused", [(f, False) for f in ("llama3", "llama3-tied", "qwen2", "qwen2.5", "qwen3",
                                                                  "mistral", "mistral-v0.3")]
                         + [("llama3", True), ("qwen3", True)])
def test_logits_equal_transformers(families, family, fused):
    """fp32 prefill (inside Mistral's window of 48): logits and every layer's input equal
    transformers'; `fused`: the fast engine's layers (kernels/fused.py, on DEVICE: llama3's RoPE
    table, Qwen3's q/k norms inside split_rope)."""
    from spectrace.kernels import backend, fused as fusing

    path, device = target_dir(families, family), DEVICE if fused else "cpu"
    model = load_model(path, device=device)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    ids = torch.randint(0, 300, (12 if fused else 40,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids], device=device), output_hidden_states=True)
    if fused:
        backend.install()
        fusing.fuse(model, 64)
    kv = model.new_kv_cache("target", "sglang", 64, 1, 64)
    L = model.config.num_hidden_layers
    out = model(ForwardBatch.build(kv, [(0, 0, ids)]), kv, capture_layers=tuple(range(L)))
    assert (out.logits - ref.logits[0]).abs().max() <= 1e-4
    for i in range(L):
        assert (out.aux_hidden_states[i] - ref.hidden_states[i][0]).abs().max() <= 1e-4


def hf_greedy(path, prompt_ids, n):
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                      pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("family, backend", [("llama3", "explicit"), ("llama3-tied", "explicit"), ("qwen3", "explicit"),
                                             ("mistral", "explicit"), ("qwen3", "fast"), ("qwen2.5", "explicit"),
                                             ("mistral-v0.3", "explicit")])
def test_greedy_tokens_equal_transformers_generate(families, family, backend):
    """Plain decoding, 12 tokens: the ids of transformers' greedy generate from the same prompt ids
    (the fast engine on DEVICE: with CUDA graphs there, interpreted on a CPU)."""
    cfg = RunConfig(algo="none", target_model=str(target_dir(families, family)), prompts=["def fib(n):"], max_new_tokens=12,
                    trace_level="off", backend=backend, raw_prompt=True, dtype="float32",
                    device=DEVICE if backend == "fast" else "cpu")
    req = run(cfg).requests[0]
    assert req.output_ids == hf_greedy(cfg.target_model, req.prompt_ids, len(req.output_ids))


def test_a_qwen25_draft_lm_drafts_for_its_target(families):
    """random_checkpoint's Qwen2.5 pair (7B's shape and 0.5B's as --tiny): standalone drafting gives
    plain decoding's tokens, the chat template is Qwen's."""
    root = families["qwen2.5"]
    common = dict(target_model=str(root / "target"), prompts=["def fib(n):"], max_new_tokens=10, trace_level="off",
                  dtype="float32")
    plain, spec = run(RunConfig(algo="none", **common)), run(RunConfig(algo="standalone", draft_model=str(root / "draft"),
                                                                       **common))
    assert spec.requests[0].output_ids == plain.requests[0].output_ids and spec.metrics["verify_ct"] > 0
    template = AutoTokenizer.from_pretrained(root / "target").apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    assert template == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("head", ["eagle3", "eagle3-sglang", "eagle3-speculators", "eagle"])
def test_published_heads_give_plain_decodings_tokens(families, head):
    """Each layout loads strictly and drafts EAGLE-2 trees whose greedy output is plain decoding's."""
    target = str(families["llama3"] / "target")
    common = dict(target_model=target, prompts=[PROMPT], max_new_tokens=16, trace_level="off", raw_prompt=True)
    plain = run(RunConfig(algo="none", **common)).requests[0].output_ids
    res = run(RunConfig(algo="eagle" if head == "eagle" else "eagle3", draft_model=str(families["llama3"] / head),
                        num_steps=3, topk=2, num_draft_tokens=4, **common))
    assert res.requests[0].output_ids == plain and res.metrics["verify_ct"] > 0


def test_a_qwen3_target_with_its_eagle3_head(families):
    common = dict(target_model=str(families["qwen3"] / "target"), prompts=[PROMPT], max_new_tokens=12,
                  trace_level="off", raw_prompt=True)
    plain = run(RunConfig(algo="none", **common)).requests[0].output_ids
    assert run(RunConfig(algo="eagle3", draft_model=str(families["qwen3"] / "eagle3"),
                         **common)).requests[0].output_ids == plain


def _edited(src, dst, config=None, rename=None, drop=(), add=None):
    """A copy of a head directory with its config.json and weight names edited."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**raw, **(config or {})}))
    state = load_file(dst / "model.safetensors")
    state = {(rename(k) if rename else k): v for k, v in state.items() if k not in drop}
    save_file({**state, **(add or {})}, dst / "model.safetensors")
    return dst


def test_aux_layer_ids_mean_outputs_in_sglang_and_inputs_in_vllm(families, tmp_path):
    """The same id list names different layers: SGLang's and SpecForge's id i is the output of
    layer i (the input of i + 1), vLLM's the input of layer i. Without ids: inputs of 2, L//2, L-3."""
    target = load_model(families["llama3"] / "target")
    heads = families["llama3"]
    assert load_eagle3(heads / "eagle3", target).capture_layers == (2, 4, 5)  # SafeAILab: none given
    assert load_eagle3(heads / "eagle3-sglang", target).capture_layers == (2, 4, 5)  # ids [1, 3, 4]
    assert load_eagle3(heads / "eagle3-speculators", target).capture_layers == (2, 4, 5)  # ids null
    ids = [1, 3, 6]
    vllm = _edited(heads / "eagle3-speculators", tmp_path / "v", {"eagle_aux_hidden_state_layer_ids": ids})
    sglang = _edited(heads / "eagle3-sglang", tmp_path / "s", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}})
    assert load_eagle3(vllm, target).capture_layers == (1, 3, 6)
    assert load_eagle3(sglang, target).capture_layers == (2, 4, 7)
    # SGLang reads the layer under any of its names, with or without a `model.` prefix
    moved = _edited(heads / "eagle3-sglang", tmp_path / "m", rename=lambda k: "model." + k.replace("midlayer.", "layers.0."))
    assert load_eagle3(moved, target).capture_layers == (2, 4, 5)


@pytest.mark.parametrize("edit, says", [
    (dict(drop=("norm.weight",)), r"missing \['norm.weight'\]"),
    (dict(add={"extra.weight": torch.zeros(2)}), r"unexpected \['extra.weight'\]"),
    (dict(add={"fc.weight": torch.zeros(64, 100)}), r"fc.weight is \(64, 100\)"),
    (dict(config={"target_hidden_size": 128}), "made for a target of hidden size 128"),
    (dict(config={"transformer_layer_config": {"model_type": "llama", "vocab_size": 2048, "hidden_size": 64,
                                               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                                               "intermediate_size": 128, "num_hidden_layers": 1}}),
     "vocabulary 2048, the target 1024"),
    (dict(config={"norm_before_fc": True}), "norm_before_fc is set"),
    (dict(add={"layers.0.self_attn.q_proj.weight": torch.zeros(64, 64)}), r"q_proj.weight is \(64, 64\)"),
])
def test_a_head_that_does_not_fit_is_refused_in_one_line(families, tmp_path, edit, says):
    target = load_model(families["llama3"] / "target")
    bad = _edited(families["llama3"] / "eagle3-speculators", tmp_path / "bad", **edit)
    with pytest.raises(SpectraceError, match=says) as e:
        load_eagle3(bad, target)
    assert "\n" not in str(e.value)


def test_the_legacy_rope_scaling_fields_read_as_rope_parameters(families, tmp_path):
    """Llama 3.1's published config.json says rope_scaling (type llama3) and a top-level rope_theta,
    as transformers 4 wrote it: the same model."""
    src = families["llama3"] / "target"
    old = tmp_path / "old"
    shutil.copytree(src, old)
    raw = json.loads((old / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
    (old / "config.json").write_text(json.dumps(raw))
    assert load_model(old).config == load_model(src).config and load_model(old).config.rope_scaling


def test_llama31_stops_at_any_of_its_eos_ids(families, tmp_path):
    """eos_token_id is a list in Llama 3.1-Instruct: a request finishes at whichever comes."""
    src = families["llama3"] / "target"
    common = dict(algo="none", prompts=[PROMPT], max_new_tokens=12, trace_level="off", raw_prompt=True)
    free = run(RunConfig(target_model=str(src), **common)).requests[0].output_ids
    stop = free[4]
    listed = tmp_path / "listed"
    shutil.copytree(src, listed)
    raw = json.loads((listed / "config.json").read_text())
    (listed / "config.json").write_text(json.dumps({**raw, "eos_token_id": raw["eos_token_id"] + [stop]}))
    req = run(RunConfig(target_model=str(listed), **common)).requests[0]
    assert req.output_ids == free[:free.index(stop) + 1] and req.finish_reason == "eos"


def test_the_prompt_goes_through_the_chat_template_unless_raw(families):
    """A checkpoint with a chat template: the prompt's ids are apply_chat_template's (one user
    turn, the assistant's header after); --raw-prompt: the text as the tokenizer encodes it."""
    path = str(families["llama3"] / "target")
    tok = AutoTokenizer.from_pretrained(path)
    common = dict(algo="none", target_model=path, prompts=["hello there"], max_new_tokens=1, trace_level="off")
    chat = run(RunConfig(**common)).requests[0].prompt_ids
    assert chat == list(tok.apply_chat_template([{"role": "user", "content": "hello there"}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False))
    assert tok.decode(chat).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert run(RunConfig(**common, raw_prompt=True)).requests[0].prompt_ids == tok("hello there").input_ids
    assert tok("hello there").input_ids[0] == tok.bos_token_id  # Llama 3's tokenizer adds <|begin_of_text|>


def test_token_pieces_read_as_bytes_where_they_split_a_character(families):
    from spectrace.loading.tokenizer import load_tokenizer

    tok = load_tokenizer(families["llama3"] / "target")
    ids = tok.encode("中 x")[1:]  # after <|begin_of_text|>
    assert [tok.piece(i) for i in ids] == ["<0xE4>", "<0xB8>", "<0xAD>", " x"]
    assert tok.decode(ids) == "中 x"


def test_a_sliding_window_runs_while_it_holds_and_is_refused_past_it(families):
    path = str(families["mistral"] / "target")
    common = dict(algo="none", target_model=path, trace_level="off", raw_prompt=True)
    run(RunConfig(prompts=["x " * 10], max_new_tokens=8, **common))
    with pytest.raises(SpectraceError, match="more than the 48-token sliding window of the target"):
        run(RunConfig(prompts=["x " * 30], max_new_tokens=20, **common))


def _hub_cache(root, repo, files_from):
    """huggingface_hub's layout: models--ORG--NAME/{refs/main, snapshots/<commit>/...}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    shutil.copytree(files_from, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return repo_dir / "snapshots" / commit


def test_hub_names_resolve_from_the_local_cache_only(families, tmp_path, monkeypatch, capsys):
    from spectrace.cli import main

    cache = tmp_path / "hub"
    snapshot = _hub_cache(cache, "meta-llama/Llama-3.1-8B-Instruct", families["llama3"] / "target")
    _hub_cache(cache, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", families["llama3"] / "eagle3")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    trace = tmp_path / "t.jsonl"
    assert main(["run", "--algo", "eagle3", "--target-model", "meta-llama/Llama-3.1-8B-Instruct", "--draft-model",
                 "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "--no-tui", "--max-new-tokens", "4", "--trace", str(trace)]) == 0
    header = json.loads(trace.read_text().splitlines()[0])
    assert header["models"]["target"]["path"] == str(snapshot)
    assert header["models"]["target"]["hub_name"] == "meta-llama/Llama-3.1-8B-Instruct"
    spec = json.dumps({"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3})
    assert main(["run", "--speculative-config", spec, "--target-model", "meta-llama/Llama-3.1-8B-Instruct", "--no-tui",
                 "--max-new-tokens", "4", "--trace-level", "off"]) == 0  # vLLM's spelling of the draft model
    capsys.readouterr()
    assert main(["run", "--target-model", "Qwen/Qwen3-8B", "--algo", "none", "--no-tui"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(cache) in err and "hf download Qwen/Qwen3-8B" in err


def test_weights_that_cannot_fit_are_refused_before_loading(families):
    cfg = RunConfig(algo="none", target_model=str(families["llama3"] / "target"), mem_fraction_static=1e-6)
    with pytest.raises(SpectraceError, match=re.escape("the weights in float32 would need")):
        run(cfg)


@pytest.mark.parametrize("draft, says", [("qwen3", "draft tokenizer differs from the target's: same size, other tokens"),
                                         ("embedded", r"draft vocabulary \(4096 tokens\) differs from the target's \(1024\)")])
def test_a_draft_lm_of_another_tokenizer_is_refused(families, draft, says):
    from spectrace.zoo import DRAFT_DIR

    path = DRAFT_DIR if draft == "embedded" else families[draft] / "target"
    with pytest.raises(SpectraceError, match=says):
        run(RunConfig(algo="standalone", target_model=str(families["llama3"] / "target"), draft_model=str(path)))
