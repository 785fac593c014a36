"""The algorithms spectrace runs, in one table: the `--algo` names, what SGLang resolves each to,
the embedded drafter each runs with by default, and the facts about its drafts that decide which
options apply. Torch-free: the CLI lists the choices from here without loading torch.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algo:
    name: str  # --algo
    resolved: str  # SGLang's SpeculativeAlgorithm once resolved: NEXTN and MTP run the EAGLE worker
    about: str  # one line of --help
    checkpoint: str | None  # the drafter's checkpoint format (spectrace.run picks its loader); None: no model
    embedded: str | None  # the embedded drafter, a directory under spectrace/zoo/models
    drafts: str = "sampled"  # sampled: from a draft model's q; fixed: copied or argmax (no q to
    #                          sample); static: a tree fixed before the run (Medusa's top-k per head)
    eagle_worker: bool = False  # SGLang's EAGLE worker: rejection sampling and adaptive steps apply
    llama_tree: bool = True  # SGLang's automatic shape on a Llama target is the (5, 4, 8) tree
    shaped: bool = True  # its draft loop takes (num_steps, topk, num_draft_tokens): a batch policy chooses them


ALGOS: dict[str, Algo] = {a.name: a for a in (
    Algo("none", "NONE", "plain autoregressive decoding", None, None, llama_tree=False, shaped=False),
    Algo("standalone", "STANDALONE", "a draft LM", "lm", "tiny-draft", llama_tree=False),
    Algo("eagle", "EAGLE", "EAGLE-1 head drafting EAGLE-2 trees", "eagle", "tiny-eagle", eagle_worker=True),
    Algo("eagle3", "EAGLE3", "EAGLE-3 head", "eagle3", "tiny-eagle3", eagle_worker=True),
    Algo("nextn", "EAGLE", "MTP module, run as EAGLE", "mtp", "tiny-mtp", eagle_worker=True),
    Algo("mtp", "EAGLE", "MTP module, run as EAGLE", "mtp", "tiny-mtp", eagle_worker=True),
    Algo("frozen_kv_mtp", "FROZEN_KV_MTP", "MTP assistant reading the target's KV", "frozen_kv_mtp",
         "tiny-frozen-kv-mtp"),
    Algo("ngram", "NGRAM", "vLLM's prompt lookup or SGLang's trie, no model", None, None, drafts="fixed",
         llama_tree=False, shaped=False),
    Algo("medusa", "MEDUSA", "Medusa heads, static tree", "medusa", "tiny-medusa", drafts="static", shaped=False),
    Algo("dflash", "DFLASH", "a block drafted in one non-causal pass", "dflash", "tiny-dflash", drafts="fixed",
         shaped=False),
)}

DEFAULT_ALGO = "standalone"  # what a run drafts with when --algo is not given
