"""EAGLE-3 heads as the three publishers lay them out, read into one description.

    layout       config.json                        weight names             aux-layer ids
    SafeAILab    a one-layer Llama config plus      midlayer.*, fc, norm,    none: the inputs of
                 draft_vocab_size                   lm_head, d2t, t2d        layers 2, L//2, L-3
                 (LlamaForCausalLM)
    SGLang /     the same, LlamaForCausalLMEagle3,  midlayer.*, layers.0.*   eagle_config's: id i =
    SpecForge    target_hidden_size, eagle_config   or model.layers.0.*;     the OUTPUT of layer i
                                                    any may carry a
                                                    `model.` prefix
    speculators  speculators_model_type "eagle3",   layers.0.*, fc, norm,    top-level: id i = the
    (vLLM)       transformer_layer_config,          lm_head, d2t, t2d        INPUT of layer i
                 draft_vocab_size,                                           (vLLM's rule)
                 norm_before_residual

(the aux-layer ids: `eagle_aux_hidden_state_layer_ids`)

The trap the table shows: SGLang and SpecForge count an aux id as the layer's output, vLLM as
its input, so the same list names different layers (SGLang [1, 15, 28] = vLLM [2, 16, 29]). Here
`capture_layers` are always inputs (CausalLM.forward's `capture_layers`). `d2t` holds offsets:
draft id i is target id i + d2t[i]. A head with the target's whole vocabulary may leave out d2t
and t2d (SafeAILab deletes them). What SGLang or vLLM read and no published Llama or Qwen3 head
uses (a normed fc input, per-tap norms, a normed output, several layers) is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass

from spectrace.errors import SpectraceError


LAYOUTS = ("safeailab", "sglang", "speculators")  # Eagle3Layout.name, the zoo's makers write each


def default_capture_layers(num_target_layers: int) -> tuple[int, ...]:
    L = num_target_layers
    return (2, L // 2, L - 3)


@dataclass(frozen=True)
class Eagle3Layout:
    name: str  # safeailab, sglang or speculators
    layer_config: dict  # the one decoder layer's config.json fields (a Llama or Qwen3 config)
    draft_vocab_size: int
    target_hidden_size: int  # the width of each target feature fc reads
    capture_layers: tuple[int, ...]  # target layers whose inputs are the features
    norm_before_residual: bool  # the residual stream is hidden_norm(h), not h (speculators, vLLM)

    def our_name(self, key: str) -> str:
        """The head's module name of a stored weight name (`midlayer.` for the decoder layer)."""
        key = key.removeprefix("model.") if self.name == "sglang" else key
        for prefix in ("midlayer.", "layers.0."):
            if key.startswith(prefix):
                return "midlayer." + key[len(prefix):]
        return key


def _refuse(config: dict, path, *fields: str) -> None:
    for field in fields:
        if config.get(field):
            raise SpectraceError(f"EAGLE-3 checkpoint {path}: {field} is "
                                 f"set; spectrace runs heads without it")


def read_layout(raw: dict, num_target_layers: int, path) -> Eagle3Layout:
    """The layout of an EAGLE-3 config.json, checked for what spectrace runs."""
    L = num_target_layers
    if raw.get("speculators_model_type") is not None or "speculators_config" in raw:
        if raw.get("speculators_model_type") != "eagle3":
            raise SpectraceError(f"{path} is a speculators checkpoint of type "
                                 f"{raw.get('speculators_model_type')!r}, " "not eagle3")
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise SpectraceError(f"speculators checkpoint {path} has no transformer_layer_config")
        _refuse(raw, path, "norm_before_fc", "fc_norm", "norm_output")
        ids = raw.get("eagle_aux_hidden_state_layer_ids")
        return Eagle3Layout("speculators", layer,
                            raw.get("draft_vocab_size") or layer.get("vocab_size"),
                            raw.get("target_hidden_size") or layer.get("hidden_size"),
                            tuple(ids) if ids else default_capture_layers(L),
                            # vLLM's default when absent
                            bool(raw.get("norm_before_residual", True)))
    eagle = raw.get("eagle_config") or {}
    _refuse(raw, path, "norm_before_fc")
    _refuse(eagle, path, "norm_before_fc")
    if eagle.get("use_aux_hidden_state") is False:
        raise SpectraceError(f"EAGLE-3 checkpoint {path}: eagle_config.use_aux_hidden_state is "
                             "false; spectrace runs heads that read the target's aux hidden states")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    sglang = "LlamaForCausalLMEagle3" in (raw.get("architectures") or []) or bool(eagle)
    return Eagle3Layout("sglang" if sglang else "safeailab", raw,
                        raw.get("draft_vocab_size") or raw.get("vocab_size"),
                        raw.get("target_hidden_size") or raw.get("hidden_size"),
                        tuple(i + 1 for i in ids) if ids else default_capture_layers(L), False)


def rename(weights: dict, layout: Eagle3Layout, path) -> dict:
    """The stored weights under the head's module names; two stored names for one module refused."""
    out = {}
    for key, stored in weights.items():
        name = layout.our_name(key)
        if name in out:
            raise SpectraceError(f"EAGLE-3 checkpoint {path} stores {name} "
                                 f"twice ({out[name].key} and {key})")
        out[name] = stored
    return out
