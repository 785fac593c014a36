"""Checkpoint formats (algos.Algo.checkpoint), a row each: how the format's model loads, and the
drafter each engine builds around it. Loading (models.py), both engines (engines.py) and the zoo's
makers (zoo/random_checkpoint.py, zoo/train_eagle.py) read this table; a new drafter adds its
files, its row in algos.ALGOS and its row here.

    format          loads with            explicit drafter (core/drafters/)   fast drafter (fast/drafters/)
    lm              load_draft_lm         StandaloneDrafter                   EagleWorker, over a draft LM
    eagle, eagle3,  load_eagle, ...       EagleDrafter                        EagleWorker, over a head
    mtp
    frozen_kv_mtp   load_frozen_kv_mtp    FrozenKVMtpDrafter (the target's KV) FrozenKVMtp
    medusa          load_medusa           MedusaDrafter                       Medusa
    dflash          load_dflash           DFlashDrafter                       DFlash

n-gram drafting has no checkpoint: engines.py builds it from its options.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from spectrace.algos import ALGOS
from spectrace.core.acceptance import RULES
from spectrace.core.drafters.dflash import DFlashDrafter, load_dflash
from spectrace.core.drafters.eagle import load_eagle
from spectrace.core.drafters.eagle3 import load_eagle3
from spectrace.core.drafters.eagle3_layouts import LAYOUTS
from spectrace.core.drafters.eagle_worker import EagleDrafter
from spectrace.core.drafters.frozen_kv_mtp import FrozenKVMtpDrafter, load_frozen_kv_mtp
from spectrace.core.drafters.medusa import MedusaDrafter, load_medusa
from spectrace.core.drafters.mtp import load_mtp
from spectrace.core.drafters.standalone import StandaloneDrafter
from spectrace.core.model import CausalLM, load_model
from spectrace.core.spec import SpecConfig
from spectrace.errors import SpectraceError
from spectrace.loading.tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class Built:
    """What a drafter of either engine is made from (engines.py fills it)."""

    target: CausalLM
    draft: object  # the format's loaded model
    spec: SpecConfig
    kv: object  # the target's KV: core/kv.py's (explicit, triton) or fast/kv.py StaticKV
    medusa_tree: object | None
    draft_kv: Callable[[], object] | None = None  # explicit: makes the drafter's own KV
    committed: int = 0  # fast: a request row's committed positions at most (engines.fast_engine)
    recording: bool = False  # fast: the run keeps a trace (or a step callback)
    record_probs: bool = False  # fast: --record-probs

    @property
    def shape(self) -> dict:
        """The explicit drafters' step shape and draft temperature."""
        spec = self.spec
        return dict(num_steps=spec.num_steps, topk=spec.topk, num_draft_tokens=spec.num_draft_tokens,
                    temperature=spec.temperature if RULES[spec.acceptance].samples_drafts else 1.0,
                    trace_topk=spec.trace_topk)

    @property
    def sampling(self) -> dict:
        """The fast drafters' options: sampled drafts, kept q, the recorded top-k, the fused loop.
        The fused draft loop (kernels/draft_level.py) breaks near-ties in q its own way, so it
        drafts only where the tree cannot change the output (greedy decoding); a trace records the
        tree it drew."""
        spec, samples = self.spec, RULES[self.spec.acceptance].samples_drafts
        return dict(sampled=samples, keep_q=samples or self.record_probs, trace_topk=self.trace_topk,
                    temperature=spec.temperature if samples else 1.0,
                    fused=spec.sampling.greedy and not (samples or self.record_probs))

    @property
    def trace_topk(self) -> int | None:
        return self.spec.trace_topk if self.recording else None

    @property
    def bs(self) -> int:
        return self.kv.seq_lens.shape[0]


def load_draft_lm(path: str, target: CausalLM, tok: Tokenizer, dtype, device) -> CausalLM:
    """A standalone draft LM, which must share the target's vocabulary token for token."""
    draft = load_model(path, dtype, device)
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise SpectraceError(f"draft vocabulary ({dv} tokens) differs from the target's ({tv})")
    if (Path(path) / "tokenizer.json").is_file() and load_tokenizer(path).vocab != tok.vocab:
        raise SpectraceError("draft tokenizer differs from the target's: same size, other tokens")
    return draft


def _head(load: Callable) -> Callable:
    """A head's loader, (path, target), in the table's signature: it loads in the target's dtype
    on the target's device."""
    return lambda path, target, tok, dtype, device: load(path, target)


def _eagle_worker(b: Built):
    from spectrace.fast.drafters.eagle_worker import EagleWorker

    steps, topk = b.spec.max_steps, b.spec.topk
    scratch = max(steps + 1, topk * max(steps - 1, 0))  # the padded extend, or the draft loop's [topk][step]
    head = ALGOS[b.spec.algo].checkpoint != "lm"  # a head reads the target's features; a draft LM its own KV
    return EagleWorker(b.draft, b.target, head, b.bs, b.committed + scratch, topk, **b.sampling)


def _frozen_kv_mtp(b: Built):
    from spectrace.fast.drafters.frozen_kv_mtp import FrozenKVMtp

    return FrozenKVMtp(b.draft, b.target, b.kv, b.spec.topk, **b.sampling)


def _medusa(b: Built):
    from spectrace.fast.drafters.medusa import Medusa

    return Medusa(b.draft, b.medusa_tree, b.bs, b.target.config.hidden_size, b.spec.trace_topk, b.recording)


def _dflash(b: Built):
    from spectrace.fast.drafters.dflash import DFlash

    return DFlash(b.draft, b.target, b.bs, b.kv.req_to_token.shape[1], b.trace_topk)


@dataclass(frozen=True)
class Format:
    load: Callable  # (path, target, tokenizer, dtype, device) -> the drafter's model
    explicit: Callable[[Built], object]
    fast: Callable[[Built], object]
    layouts: tuple[str, ...] = ()  # the publishers' layouts the loader recognises, where more than one


def _eagle_drafter(b: Built):
    return EagleDrafter(b.draft, b.target, b.draft_kv(), **b.shape)


FORMATS = {
    "lm": Format(load_draft_lm, lambda b: StandaloneDrafter(b.draft, b.draft_kv(), **b.shape), _eagle_worker),
    "eagle": Format(_head(load_eagle), _eagle_drafter, _eagle_worker),
    "eagle3": Format(_head(load_eagle3), _eagle_drafter, _eagle_worker, LAYOUTS),
    "mtp": Format(_head(load_mtp), _eagle_drafter, _eagle_worker),
    "frozen_kv_mtp": Format(_head(load_frozen_kv_mtp),  # no draft KV: it reads the target's
                            lambda b: FrozenKVMtpDrafter(b.draft, b.target, b.kv, **b.shape), _frozen_kv_mtp),
    "medusa": Format(_head(load_medusa), lambda b: MedusaDrafter(b.draft, b.medusa_tree, b.spec.trace_topk),
                     _medusa),
    "dflash": Format(_head(load_dflash), lambda b: DFlashDrafter(b.draft, b.target, b.spec.trace_topk),
                     _dflash),
}
