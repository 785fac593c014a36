"""Acceptance rules, one module each, chosen with --acceptance:

    greedy          temperature 0: draft == argmax p                      (greedy.py, trees)
    target_only     SGLang's tree sampling with thresholds                (target_only.py, trees)
    rejection       SGLang's chain rejection sampling, coin * q < p       (rejection.py, chains)
    vllm            vLLM's rejection sampler, p / q >= u, recovered tokens (vllm.py, chains)
    tree_rejection  lossless sampling on trees, recursive rejection       (tree_rejection.py, trees)
    typical         Medusa's typical acceptance, entropy threshold, lossy (typical.py, trees)

`check` applies the engines' configuration rules; the default follows SGLang: greedy at
temperature 0, target_only otherwise.
"""
from __future__ import annotations

from spectrace.core.config import SpectraceError

RULES = ("greedy", "target_only", "rejection", "vllm", "tree_rejection", "typical")
CHAIN_RULES = ("rejection", "vllm")  # verify a chain
SAMPLED_RULES = ("rejection", "vllm", "tree_rejection")  # drafts are sampled from q, and q is kept
EAGLE_WORKER_ALGOS = ("eagle", "eagle3", "nextn", "mtp")


def default_rule(temperature: float) -> str:
    return "greedy" if temperature == 0.0 else "target_only"


def check(rule: str, algo: str, topk: int, temperature: float, threshold_single: float, threshold_acc: float) -> None:
    """One clear line for a combination the engines refuse (or that would silently do nothing)."""
    if rule not in RULES:
        raise SpectraceError(f"unknown --acceptance {rule!r} (choose from {', '.join(RULES)})")
    for name, t in (("single", threshold_single), ("acc", threshold_acc)):
        if not 0.0 <= t <= 1.0:
            raise SpectraceError(f"--speculative-accept-threshold-{name} must lie in [0, 1], got {t}")
    if temperature < 0:
        raise SpectraceError(f"--temperature must be >= 0, got {temperature}")
    if algo == "none":
        return
    if rule == "greedy" and temperature > 0:
        raise SpectraceError("--acceptance greedy needs --temperature 0 (sampling rules: target_only, rejection, "
                             "vllm, tree_rejection, typical)")
    if rule != "greedy" and temperature == 0:
        raise SpectraceError(f"--acceptance {rule} samples: give --temperature > 0")
    if rule != "target_only" and (threshold_single, threshold_acc) != (1.0, 1.0):
        raise SpectraceError(f"the accept thresholds belong to target_only; --acceptance {rule} needs both at 1.0")
    if rule in CHAIN_RULES and topk != 1:
        raise SpectraceError(f"--acceptance {rule} verifies a chain: it needs --topk 1 (tree_rejection samples "
                             f"trees losslessly)")
    if rule in SAMPLED_RULES and algo == "medusa":
        raise SpectraceError(f"--acceptance {rule} needs drafts sampled from q; Medusa's static tree takes each "
                             f"head's top-k (use target_only or typical)")
    if rule in ("rejection", "tree_rejection") and algo in ("ngram", "dflash"):
        what = "n-gram drafts are copied" if algo == "ngram" else "DFLASH drafts are the argmax of a block, as in SGLang"
        raise SpectraceError(f"--acceptance {rule} needs drafts sampled from a draft model's q; {what} "
                             f"(use target_only, or vllm, which takes them as one-hot)")
    if rule == "rejection" and algo not in EAGLE_WORKER_ALGOS:
        raise SpectraceError(f"SGLang allows rejection sampling only for EAGLE / EAGLE3 (and NEXTN, MTP), "
                             f"not --algo {algo}")
