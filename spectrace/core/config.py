"""Model shapes read from a Hugging Face `config.json`, as transformers' Llama, Mistral and Qwen2
config classes read them.

The file is read as JSON, not through `transformers.AutoConfig`: importing transformers' config
classes costs about two seconds, more than a run of the embedded models. A field the file leaves
out takes the value the transformers class would give it (`DEFAULTS`); tests/test_model.py
checks this reading against transformers' own on full and on partial configs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from spectrace.errors import SpectraceError

# what transformers' LlamaConfig, MistralConfig and Qwen2Config assume for a missing field
_COMMON = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, rms_norm_eps=1e-6,
               tie_word_embeddings=False, mlp_bias=False)
DEFAULTS = {
    "llama": dict(_COMMON, vocab_size=32000, intermediate_size=11008, num_key_value_heads=None,
                  max_position_embeddings=2048, eos_token_id=2, attention_bias=False),
    "mistral": dict(_COMMON, vocab_size=32000, intermediate_size=14336, num_key_value_heads=8,
                    max_position_embeddings=131072, eos_token_id=2, sliding_window=4096),
    "qwen2": dict(_COMMON, vocab_size=151936, intermediate_size=22016, num_key_value_heads=32,
                  max_position_embeddings=32768, eos_token_id=None, use_sliding_window=False),
}
# model_type -> (q/k/v bias, o_proj bias) as the transformers modules define them (None: Llama's
# attention_bias applies to all four)
ATTENTION_BIAS = {"llama": None, "mistral": (False, False), "qwen2": (True, False)}


def read_config_json(path: str | Path) -> dict:
    """The parsed config.json of a model directory, with one-line errors."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise SpectraceError(f"model directory {path} not found or has no config.json")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpectraceError(f"cannot load model from {path}: config.json: {e}") from None
    if not isinstance(raw, dict):
        raise SpectraceError(f"cannot load model from {path}: config.json is not a JSON object")
    return raw


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_json(cls, raw: dict) -> "ModelConfig":
        """From a config.json of a Llama-family model (one line of error for anything else)."""
        mt = raw.get("model_type")
        if mt not in DEFAULTS:
            raise SpectraceError(f"model type {mt!r} is not supported (supported: {', '.join(DEFAULTS)})")
        c = {**DEFAULTS[mt], **raw}
        # transformers 5 keeps RoPE in rope_parameters; older files say rope_scaling and rope_theta
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise SpectraceError(f"RoPE type {rope_type!r} is not supported; only plain RoPE is")
        if c.get("use_sliding_window") or (mt == "mistral" and c.get("sliding_window")):
            raise SpectraceError("sliding-window attention is not supported")
        qkv_bias, o_bias = ATTENTION_BIAS[mt] or (bool(c["attention_bias"]),) * 2
        heads = c["num_attention_heads"]
        eos = c.get("eos_token_id")
        return cls(
            model_type=mt,
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            num_hidden_layers=c["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=c["num_key_value_heads"] or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            intermediate_size=c["intermediate_size"],
            rms_norm_eps=c["rms_norm_eps"],
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta") or 10000.0)),
            max_position_embeddings=c["max_position_embeddings"],
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=bool(c["mlp_bias"]),
            tie_word_embeddings=bool(c["tie_word_embeddings"]),
            eos_token_ids=tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,)),
        )
