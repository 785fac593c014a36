"""Model shapes read from a Hugging Face config, and the errors users see."""
from __future__ import annotations

from dataclasses import dataclass


class SpectraceError(Exception):
    """A problem with the user's input: the CLI prints it as one line and exits with code 2."""


# model_type -> (q/k/v bias, o_proj bias) as the transformers classes define them
SUPPORTED_MODEL_TYPES = {
    "llama": None,  # attention_bias applies to q, k, v and o
    "mistral": (False, False),
    "qwen2": (True, False),  # Qwen2 always biases q, k, v, never o
}


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
    def from_hf(cls, hf) -> "ModelConfig":
        """From a `transformers` PretrainedConfig of a Llama-family model."""
        mt = hf.model_type
        if mt not in SUPPORTED_MODEL_TYPES:
            raise SpectraceError(
                f"model type {mt!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        rope = getattr(hf, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise SpectraceError(f"RoPE type {rope_type!r} is not supported; only plain RoPE is")
        if getattr(hf, "use_sliding_window", False) or (mt == "mistral" and hf.sliding_window):
            raise SpectraceError("sliding-window attention is not supported")
        if mt == "llama":
            qkv_bias = o_bias = bool(hf.attention_bias)
        else:
            qkv_bias, o_bias = SUPPORTED_MODEL_TYPES[mt]
        heads = hf.num_attention_heads
        eos = hf.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            model_type=mt,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            num_hidden_layers=hf.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=hf.num_key_value_heads or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
            intermediate_size=hf.intermediate_size,
            rms_norm_eps=hf.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))),
            max_position_embeddings=hf.max_position_embeddings,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            eos_token_ids=eos_ids,
        )
