"""`spectrace bench --compare-hf`: transformers' own decoding paths on the same prompts and models,
greedy, one prompt at a time, best of --repeat timed calls after a warm-up, beside spectrace's rows:

    hf generate         plain `generate` (its dynamic cache, eager)
    hf static cache     transformers' fastest decode, written as gpt-fast writes it: a StaticCache,
                        the prompt's forward, then a loop of one-token forwards that on a GPU is
                        compiled with CUDA graphs (torch.compile mode="reduce-overhead",
                        fullgraph=True); on a CPU the same loop runs eagerly
    hf assisted         assisted generation with the draft LM, the library's default schedule,
    hf assisted k=4     and a constant 4 draft tokens: where the draft is a language model with the
                        target's vocabulary (the embedded pair, or a --draft-model LM)
    hf prompt lookup    prompt lookup decoding, 5 tokens
Each row says on how many prompts it gave plain generate's tokens; the static cache's also the ms
a token of its loop takes, the prompt's forward not counted (beside spectrace's `none` row's verify
ms: a decode step).
"""
from __future__ import annotations

import copy
import functools
import inspect
import time
from typing import Callable

import torch

from spectrace.core.config import read_config_json
from spectrace.loading.models import find_model
from spectrace.run import encode_prompts, load_tokenizer


class StaticDecoder:
    """Greedy decoding through one StaticCache: its addresses never change, so the one-token
    forward is captured once as a CUDA graph and replayed for every token of every prompt."""

    def __init__(self, model, max_len: int, compiled: bool):
        from transformers import StaticCache

        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        # transformers 5.24 names the forward's argument `cache`; earlier 5.x, `past_key_values`
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.step = torch.compile(self.forward, mode="reduce-overhead", fullgraph=True) if compiled else self.forward
        self.decode_ms: list[float] = []  # each call's ms a token of its one-token loop, the prompt's forward not counted

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """ids (1, L) at cache positions (L,) -> the greedy next token (1, 1)."""
        logits = self.model(ids, cache_position=positions, use_cache=True, **{self.cache_arg: self.cache}).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    @torch.no_grad()  # as generate decodes: else the cache's in-place K/V writes keep every forward's graph
    def generate(self, ids: torch.Tensor, max_new_tokens: int, eos: set[int]) -> list[int]:
        self.cache.reset()
        token = self.forward(ids, torch.arange(ids.shape[1], device=ids.device))  # the prompt, eager
        out, position = [token.item()], torch.tensor([ids.shape[1]], device=ids.device)
        t0 = time.perf_counter()  # .item() waited for the prompt's forward; it waits for each token too
        while len(out) < max_new_tokens and out[-1] not in eos:
            token = self.step(token, position).clone()  # a graph's output is overwritten by its next replay
            position += 1
            out.append(token.item())
        self.decode_ms.append((time.perf_counter() - t0) * 1e3 / max(len(out) - 1, 1))
        return out


def draft_lm_dir(cfg, target_vocab: int) -> str | None:
    """The draft model's directory where it is a language model of the target's vocabulary (what
    assisted generation needs), else None."""
    draft_dir = find_model(cfg.draft_path, "--draft-model")
    draft = read_config_json(draft_dir)
    is_lm = any(a.endswith("ForCausalLM") and "Eagle" not in a for a in draft.get("architectures", []))
    return draft_dir if is_lm and draft.get("vocab_size") == target_vocab else None


def _generate(target, ids: torch.Tensor, max_new_tokens: int, eos: set[int], kw: dict) -> list[int]:
    out = target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=min(eos), **kw)
    return out[0, ids.shape[1]:].tolist()


def _timed(fn: Callable[[], list[int]], repeat: int, cuda: bool) -> tuple[list[int], float]:
    """fn's output and the best wall seconds of `repeat` calls after a warm-up."""
    best = None
    for rep in range(repeat + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        if rep and (best is None or time.perf_counter() - t0 < best):
            best = time.perf_counter() - t0
    return out, best


def hf_table(config, prompts: list[str], repeat: int, progress=lambda m: None) -> dict[str, list[list[int]]]:
    """Prints a row per path with its tokens/s (the static cache's: and its decode ms a token) and
    how many prompts gave plain generate's tokens; returns each path's output ids."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # assisted generation warns about its own internal call
    logging.disable_progress_bar()  # the loading bars: spectrace prints its own status
    cfg = config(algo="standalone", prompts=prompts[:1], batch=None, trace=None)
    cfg.check()
    dtype, cuda = cfg.torch_dtype, cfg.device.startswith("cuda")
    target_dir = find_model(cfg.target_model, "--target-model")
    tok = load_tokenizer(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(cfg.device).eval()
    ids = [torch.tensor(encode_prompts(tok, [p], cfg.raw_prompt), device=cfg.device) for p in prompts]  # as runs do
    eos = target.generation_config.eos_token_id  # where generate stops
    eos = set(eos if isinstance(eos, list) else [eos])
    static = StaticDecoder(target, max(i.shape[1] for i in ids) + cfg.max_new_tokens, compiled=cuda)
    paths = {"hf generate": {}, "hf static cache": {}}
    draft_dir = draft_lm_dir(cfg, target.config.vocab_size)
    if draft_dir is not None:
        draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype).to(cfg.device).eval()
        constant_4 = copy.deepcopy(draft.generation_config)
        constant_4.update(num_assistant_tokens=4, num_assistant_tokens_schedule="constant",
                          assistant_confidence_threshold=0.0)
        paths.update({"hf assisted": {"assistant_model": draft},
                      "hf assisted k=4": {"assistant_model": draft, "assistant_config": constant_4}})
    paths["hf prompt lookup"] = {"prompt_lookup_num_tokens": 5}
    outputs = {}
    print(f"{'transformers path':<20} {'decode ms':>12} {'tokens/s':>9}")
    for name, kw in paths.items():
        kw = dict(kw or {})
        assistant_config = kw.pop("assistant_config", None)
        if assistant_config is not None:
            saved, draft.generation_config = draft.generation_config, assistant_config
        tokens = wall = 0
        outputs[name], decode_ms = [], []  # the static cache's: each prompt's best ms a decoded token
        for i, prompt_ids in enumerate(ids):
            progress(f"bench: {name}, prompt {i + 1} of {len(prompts)}")
            if name == "hf static cache":
                call = functools.partial(static.generate, prompt_ids, cfg.max_new_tokens, eos)
            else:
                call = functools.partial(_generate, target, prompt_ids, cfg.max_new_tokens, eos, kw)
            static.decode_ms.clear()
            out, best = _timed(call, repeat, cuda)
            if static.decode_ms:
                decode_ms.append(min(static.decode_ms[1:]))  # the first call warmed up (and compiled)
            outputs[name].append(out)
            tokens += len(out)
            wall += best
        if assistant_config is not None:
            draft.generation_config = saved
        same = sum(a == b for a, b in zip(outputs[name], outputs["hf generate"]))
        progress(None)
        decode = f"{sum(decode_ms) / len(decode_ms):.2f}" if decode_ms else "-"
        print(f"{name:<20} {decode:>12} {tokens / wall:>9.1f}  same tokens as hf generate: {same} of {len(prompts)}")
    if draft_dir is None:
        print("(no assisted generation: the draft model is not a language model of the target's vocabulary)")
    del static
    torch._dynamo.reset()  # the compiled step holds the model: free it before spectrace's runs load theirs
    return outputs
