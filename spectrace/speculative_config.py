"""vLLM's `--speculative-config '{"method": ..., "num_speculative_tokens": k, ...}'` on spectrace's
options, with the semantics of vLLM's SpeculativeConfig (vllm/config/speculative.py) and its
refusals, one line each.

    method         eagle, eagle3, mtp (and every *_mtp name, which vLLM rewrites to mtp), ngram,
                   draft_model (spectrace's standalone), dflash. Missing, vLLM infers it from the
                   model: "ngram" -> ngram; a name with "eagle3" -> eagle3, "eagle-" -> eagle,
                   "dflash" -> dflash; else draft_model
    num_speculative_tokens k   required, > 0: vLLM's drafters propose a chain of k tokens, so
                   num_steps k, topk 1, num_draft_tokens k + 1
    model          the draft model's directory; required but for mtp (vLLM's MTP uses the target's
                   own module; here the embedded MTP head) and ngram
    prompt_lookup_min / _max   ngram only, each >= 1; one missing copies the other, both missing 5 / 5
    medusa         vLLM's Medusa proposer drafts `argmax(head_i(hidden))` for i < k: a chain whose
                   node i is head i's top token. Here the static tree of choices [[0], [0, 0], ...]
                   (k deep, rank 0 at every level), which spectrace's Medusa drafter runs the same
                   way; k above the checkpoint's heads is refused
Methods vLLM has and spectrace does not model as vLLM runs them (mlp_speculator, suffix,
custom_class, extract_hidden_states, ngram_gpu), and any other key, are refused.
"""
from __future__ import annotations

import json

from spectrace.errors import SpectraceError

METHODS = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "ngram": "ngram", "draft_model": "standalone",
           "dflash": "dflash", "medusa": "medusa"}
NOT_MODELLED = ("mlp_speculator", "suffix", "custom_class", "extract_hidden_states", "ngram_gpu")
KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
NO_MODEL_NEEDED = ("mtp", "ngram")


def _fail(message: str):
    raise SpectraceError(f"--speculative-config: {message}")


def _method(cfg: dict) -> str:
    """The method, given or inferred from the model as vLLM infers it; *_mtp names become mtp."""
    method, model = cfg.get("method"), cfg.get("model")
    if method is None:
        if model is None:
            _fail("give a method or a model")
        name = str(model).lower()
        method = ("ngram" if name in ("ngram", "[ngram]") else "eagle3" if "eagle3" in name else
                  "eagle" if "eagle-" in name else "dflash" if "dflash" in name else "draft_model")
    method = str(method)
    if method.endswith("_mtp"):
        method = "mtp"
    if method in NOT_MODELLED:
        _fail(f"method {method!r} is vLLM's, and spectrace does not run it as vLLM does (it runs "
              f"{', '.join(METHODS)})")
    if method not in METHODS:
        _fail(f"unknown method {method!r} (spectrace runs {', '.join(METHODS)})")
    return method


def parse(text: str) -> dict:
    """The JSON -> spectrace's run options (algo, num_steps, topk, num_draft_tokens or, for medusa,
    medusa_choices; draft_model, prompt_lookup_min, prompt_lookup_max), or one line saying what is
    wrong."""
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        _fail(f"not JSON ({e.msg} at column {e.colno})")
    if not isinstance(cfg, dict):
        _fail("must be a JSON object, e.g. '{\"method\": \"eagle\", \"num_speculative_tokens\": 3, \"model\": DIR}'")
    unknown = sorted(set(cfg) - set(KEYS))
    if unknown:
        _fail(f"{unknown[0]!r} is not a key spectrace maps (it takes {', '.join(KEYS)})")
    method = _method(cfg)
    k = cfg.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        _fail(f"num_speculative_tokens must be a positive integer (vLLM requires it), got {k!r}")
    if method == "medusa":  # Medusa's shape is its tree: head i's top token at depth i + 1
        out = {"algo": "medusa", "medusa_choices": [[0] * depth for depth in range(1, k + 1)]}
    else:
        out = {"algo": METHODS[method], "num_steps": k, "topk": 1, "num_draft_tokens": k + 1}
    model = cfg.get("model")
    if method == "ngram":
        model = None
    elif model is None and method not in NO_MODEL_NEEDED:
        _fail(f"method {method!r} needs a draft model: add \"model\": \"DIR\" (vLLM refuses it without one)")
    if model is not None:
        out["draft_model"] = str(model)
    lookup = {key: cfg[key] for key in ("prompt_lookup_min", "prompt_lookup_max") if cfg.get(key) is not None}
    if lookup and method != "ngram":
        _fail(f"prompt_lookup_min / prompt_lookup_max belong to method ngram, not {method!r}")
    for key, v in lookup.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            _fail(f"{key} must be an integer >= 1, got {v!r}")
    if method == "ngram":  # vLLM: both missing 5 / 5; one missing copies the other
        lo = lookup.get("prompt_lookup_min", lookup.get("prompt_lookup_max", 5))
        hi = lookup.get("prompt_lookup_max", lookup.get("prompt_lookup_min", 5))
        if lo > hi:
            _fail(f"prompt_lookup_min {lo} is more than prompt_lookup_max {hi}")
        out.update(prompt_lookup_min=lo, prompt_lookup_max=hi)
    return out
