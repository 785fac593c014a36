"""A step's shape, (num_steps, topk, num_draft_tokens) as SGLang names them, decided here and
nowhere else: the options given (the CLI's, vLLM's --speculative-config, a batch policy's choice
for the run's batch size: each sets the same three fields), a drafter's own shape, SGLang's
automatic choice, and the tree-size rule. SpecConfig carries the result (its `tiers`: every
shape a run may take) and every other module takes it as given.

    resolve_shape   a run's shape
    auto_shape      SGLang's `_auto_choose_speculative_params`
    draft_tokens    the tree-size rule: a chain takes num_steps + 1 nodes; a tree, 8 where it holds
                    them
"""
from __future__ import annotations

from spectrace.algos import ALGOS
from spectrace.core.adaptive import AdaptiveConfig
from spectrace.core.config import read_config_json
from spectrace.core.drafters.medusa import MedusaTree
from spectrace.core.tree import tree_capacity
from spectrace.errors import SpectraceError

LLAMA_TREE = (5, 4, 8)  # (num_steps, topk, num_draft_tokens)
CHAIN = (3, 1, 4)


def auto_shape(algo: str, target_architecture: str) -> tuple[int, int, int]:
    """SGLang's `_auto_choose_speculative_params` when no shape is given: the (5, 4, 8) tree on a
    Llama target (but for STANDALONE), else a chain of 3 steps."""
    return (LLAMA_TREE if ALGOS[algo].llama_tree and target_architecture == "LlamaForCausalLM"
            else CHAIN)


def draft_tokens(num_steps: int, topk: int, given: int | None) -> int | None:
    """num_draft_tokens (root included): SGLang's topk 1 forces num_steps + 1; not given, its Llama
    default of 8 where the tree holds it; else as given (SpecConfig checks it fits)."""
    if topk == 1 and num_steps >= 1:
        return num_steps + 1
    if given is None and topk >= 1 and num_steps >= 1:
        return min(8, tree_capacity(topk, num_steps) + 1)
    return given


def resolve_shape(cfg, target_architecture: str, tree: MedusaTree | None) -> tuple[int, int, int]:
    """(num_steps, topk, num_draft_tokens) of a run (cfg: spectrace.run's RunConfig, its shape
    as the options, vLLM's --speculative-config or a batch policy set it). Values given are kept,
    the rest follow SGLang's `_auto_choose_speculative_params` (auto_shape), then the tree-size
    rule (draft_tokens); drafters with a shape of their own (a DFLASH block, a Medusa tree,
    SGLang's n-gram tree, vLLM's n-gram k) set it. Plain decoding: (0, 1, 1)."""
    if cfg.algo == "none":
        return 0, 1, 1
    given = (cfg.num_steps, cfg.topk, cfg.num_draft_tokens)
    # SGLang: num_draft_tokens = the block (a given value must match it), topk 1;
    if cfg.algo == "dflash":
        # here num_steps = B - 1 bounds the walk
        B = read_config_json(cfg.draft_path).get("block_size") or 0
        if (cfg.topk not in (None, 1) or cfg.num_draft_tokens not in (None, B)
            or cfg.num_steps not in (None, B - 1)):
            raise SpectraceError(f"DFLASH drafts one block of {B} tokens (its block_size): "
                                 f"--num-draft-tokens must be "
                                 f"{B}, --num-steps {B - 1} and --topk 1, or left out")
        return B - 1, 1, B
    if cfg.algo == "medusa":  # the static tree's depth, widest rank and size
        if given != (None, None, None):
            raise SpectraceError("Medusa's tree is given by --medusa-choices: --num-steps, --topk "
                                 "and --num-draft-tokens do not apply")
        return tree.shape
    if cfg.algo == "ngram" and cfg.ngram_style == "sglang":
        # SGLang: topk = max_bfs_breadth, n = 12, num_steps = n // topk (unused by its n-gram
        # verify,
        # whose accept width is n); here num_steps bounds the walk, so n - 1
        n = cfg.num_draft_tokens or 12
        return n - 1, cfg.ngram_trie.max_bfs_breadth, n
    if cfg.algo == "ngram":  # a chain of k = num_steps copied tokens
        default = (5, 1, 6)
    elif cfg.adaptive:  # SGLang: topk 1, the middle tier
        tiers = AdaptiveConfig().candidate_steps
        default = (tiers[len(tiers) // 2], 1, tiers[len(tiers) // 2] + 1)
    else:
        default = auto_shape(cfg.algo, target_architecture)
    if given == (None, None, None):
        return default
    num_steps = cfg.num_steps if cfg.num_steps is not None else default[0]
    topk = cfg.topk if cfg.topk is not None else default[1]
    return num_steps, topk, draft_tokens(num_steps, topk, cfg.num_draft_tokens)
