"""Model shapes read from a Hugging Face `config.json`, as transformers' Llama, Mistral, Qwen2 and
Qwen3 config classes read them.

The file is read as JSON, not through `transformers.AutoConfig`: importing transformers' config
classes costs about two seconds, more than a run of the embedded models. A field the file leaves
out takes the value the transformers class would give it (`DEFAULTS`); tests/test_model.py
checks this reading against transformers' own on full and on partial configs.

What the explicit forward does not compute is refused here, in one line naming the field: other
model types (MoE, MLA, ...), RoPE types but plain and Llama 3.1's `llama3`, a partial rotary
dimension, activations other than SiLU. A sliding window is kept: attention is exactly full
attention while a run's positions fit inside it, so the run checks that (run.check_prompts).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from spectrace.errors import SpectraceError

# what transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config assume for a missing
# field
_COMMON = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, rms_norm_eps=1e-6,
               tie_word_embeddings=False, mlp_bias=False, hidden_act="silu")
_QWEN = dict(_COMMON, vocab_size=151936, intermediate_size=22016, num_key_value_heads=32,
             max_position_embeddings=32768, eos_token_id=None, use_sliding_window=False,
             sliding_window=4096, max_window_layers=28)
DEFAULTS = {
    "llama": dict(_COMMON, vocab_size=32000, intermediate_size=11008, num_key_value_heads=None,
                  max_position_embeddings=2048, eos_token_id=2, attention_bias=False),
    "mistral": dict(_COMMON, vocab_size=32000, intermediate_size=14336, num_key_value_heads=8,
                    max_position_embeddings=131072, eos_token_id=2, sliding_window=4096),
    "qwen2": _QWEN,
    # Qwen3's head_dim is its own, not hidden / heads
    "qwen3": dict(_QWEN, head_dim=128, attention_bias=False),
}
# model_type -> (q/k/v bias, o_proj bias) as the transformers modules define them (None: the
# config's
# attention_bias applies to all four)
ATTENTION_BIAS = {"llama": None, "mistral": (False, False), "qwen2": (True, False), "qwen3": None}
QK_NORM = ("qwen3",)  # an RMSNorm over each head of q and k, before RoPE
# RoPE types the forward computes, and the fields each needs besides rope_theta
ROPE_TYPES = {"default": (), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


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


def read_rope(raw: dict) -> tuple[float, dict | None]:
    """(rope_theta, llama3 scaling or None) of a config. transformers 5 writes one
    `rope_parameters` dict holding rope_theta; older files say `rope_scaling` (`type` or
    `rope_type`) beside a top-level `rope_theta`; with neither, plain RoPE with theta 10000."""
    field = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
    rope = raw.get(field) or {}
    theta = positive_number("rope_theta", rope.get("rope_theta", raw.get("rope_theta") or 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise SpectraceError(f"config.json: {field}.rope_type {rope_type!r} is not supported "
                             f"(supported: {', '.join(ROPE_TYPES)})")
    if rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise SpectraceError("config.json: partial_rotary_factor is not "
                             "supported (RoPE over the whole head only)")
    if rope_type == "default":
        return theta, None
    missing = [k for k in ROPE_TYPES[rope_type] if rope.get(k) is None]
    if missing:
        raise SpectraceError(f"config.json: {field} of type {rope_type!r} has no {missing[0]}")
    scaling = {k: positive_number(f"{field}.{k}", rope[k]) for k in ROPE_TYPES[rope_type]}
    # transformers: the pre-scaling context defaults to max_position_embeddings
    old = rope.get("original_max_position_embeddings") or raw.get("max_position_embeddings")
    old = positive_int("original_max_position_embeddings", old)
    return theta, {"rope_type": rope_type, **scaling, "original_max_position_embeddings": old}


def read_sliding_window(model_type: str, c: dict) -> int | None:
    """The window of the layers that slide, None if none does: Mistral's `sliding_window`
    (null for v0.2 on); Qwen's only with use_sliding_window, on the layers from max_window_layers
    (or those `layer_types` names)."""
    if model_type == "mistral":
        return c.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and c.get("use_sliding_window"):
        types = c.get("layer_types") or ["sliding_attention" if i >= c["max_window_layers"]
                                         else "full_attention"
                                         for i in range(c["num_hidden_layers"])]
        return c.get("sliding_window") if "sliding_attention" in types else None
    return None


def positive_int(name: str, v) -> int:
    """v, or one line if config.json's `name` is not a positive integer (a hand-edited file)."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise SpectraceError(f"config.json: {name} must be a positive integer, got {v!r}")
    return v


def positive_number(name: str, v) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
        raise SpectraceError(f"config.json: {name} must be a finite number > 0, got {v!r}")
    return float(v)


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
    # llama3: factor, low/high_freq_factor, original_max_position_embeddings
    rope_scaling: dict | None
    max_position_embeddings: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_window: int | None  # exact full attention while a sequence's positions fit inside it
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_json(cls, raw: dict) -> "ModelConfig":
        """From a config.json of a Llama-family model (one line of error for anything else)."""
        mt = raw.get("model_type")
        if mt not in DEFAULTS:
            raise SpectraceError(f"config.json: model_type {mt!r} is not supported (supported: "
                                 f"{', '.join(DEFAULTS)})")
        c = {**DEFAULTS[mt], **raw}
        if c["hidden_act"] != "silu":
            raise SpectraceError(f"config.json: hidden_act {c['hidden_act']!r} is not supported "
                                 f"(SwiGLU with silu only)")
        sizes = {name: positive_int(name, c[name]) for name in
                 ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "max_position_embeddings")}
        heads = sizes["num_attention_heads"]
        kv_heads = positive_int("num_key_value_heads", c["num_key_value_heads"] or heads)
        if heads % kv_heads:
            raise SpectraceError(f"config.json: num_attention_heads {heads} is not a multiple of "
                                 f"num_key_value_heads {kv_heads}")
        theta, scaling = read_rope(raw)
        qkv_bias, o_bias = ATTENTION_BIAS[mt] or (bool(c["attention_bias"]),) * 2
        eos = c.get("eos_token_id")
        return cls(
            model_type=mt,
            **sizes,
            num_key_value_heads=kv_heads,
            head_dim=positive_int("head_dim", c.get("head_dim") or sizes["hidden_size"] // heads),
            rms_norm_eps=positive_number("rms_norm_eps", c["rms_norm_eps"]),
            rope_theta=theta,
            rope_scaling=scaling,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=bool(c["mlp_bias"]),
            qk_norm=mt in QK_NORM,
            sliding_window=read_sliding_window(mt, c),
            tie_word_embeddings=bool(c["tie_word_embeddings"]),
            eos_token_ids=tuple(eos) if isinstance(eos, (list, tuple))
            else (() if eos is None else (eos,)),
        )
