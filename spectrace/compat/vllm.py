"""vLLM's rejection sampler and n-gram proposer with their v0.8.5 names and calls, on CPU
(`vllm/v1/sample/rejection_sampler.py`, `vllm/v1/spec_decode/ngram_proposer.py`); thin adapters over
`spectrace.core.acceptance.vllm` and `spectrace.core.ngram.lookup`.

    sampler = RejectionSampler()
    out = sampler(metadata, draft_probs, target_logits, bonus_token_ids, sampling_metadata)
    # out: int32 [B, max_spec_len + 1], PLACEHOLDER_TOKEN_ID (-1) after a rejection

v0.8.5 semantics: greedy requests carry temperature GREEDY_TEMPERATURE (-1), and `temperature` is
None when all requests are greedy; probabilities are softmax(top-k/top-p(logits / T));
draft_probs None means the drafts were argmax (one-hot q). As in current vLLM, uniforms are
float64 (float32 `torch.rand` can return 0.0) and recovered tokens are argmax(prob * (1 / e)).
Each seeded request draws, on its generator, its n uniforms and then its V exponentials.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from spectrace.core.acceptance.vllm import MAX_SPEC_LEN, PLACEHOLDER_TOKEN_ID, sampler_randoms, vllm_walk
from spectrace.core.ngram.lookup import find_subarray_kmp, kmp_lps_array, propose_first_match
from spectrace.core.sampling import SamplingParams, probs_from_logits

GREEDY_TEMPERATURE = -1

__all__ = ["RejectionSampler", "SpecDecodeMetadata", "calc_spec_decode_metadata", "SamplingMetadata",
           "PLACEHOLDER_TOKEN_ID", "GREEDY_TEMPERATURE", "MAX_SPEC_LEN", "NgramProposer", "_kmp_lps_array",
           "_find_subarray_kmp"]


@dataclass
class SpecDecodeMetadata:
    draft_token_ids: torch.Tensor  # int32 [N], every request's drafts, flattened
    num_draft_tokens: list[int]  # [B]
    cu_num_draft_tokens: torch.Tensor  # int32 [B], inclusive cumsum
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: torch.Tensor

    def __post_init__(self):
        self.max_spec_len = max(self.num_draft_tokens) if self.num_draft_tokens else 0

    @classmethod
    def make_dummy(cls, draft_token_ids: list[list[int]], device) -> "SpecDecodeMetadata":
        """Real cumsums; the logits indices are zeros, as in vLLM's helper for tests."""
        num = [len(d) for d in draft_token_ids]
        flat = [t for d in draft_token_ids for t in d]
        n = len(flat)
        return cls(draft_token_ids=torch.tensor(flat, dtype=torch.int32, device=device),
                   num_draft_tokens=num,
                   cu_num_draft_tokens=torch.tensor(num, dtype=torch.int32, device=device).cumsum(0).to(torch.int32),
                   target_logits_indices=torch.zeros(n, dtype=torch.int32, device=device),
                   bonus_logits_indices=torch.zeros(len(num), dtype=torch.int32, device=device),
                   logits_indices=torch.zeros(n + len(num), dtype=torch.int32, device=device))


def calc_spec_decode_metadata(num_draft_tokens: np.ndarray, cu_num_scheduled_tokens: np.ndarray,
                              input_ids: torch.Tensor) -> SpecDecodeMetadata:
    """The model runner's `_calc_spec_decode_metadata`: which rows of the flattened batch the
    target computes logits for, and where each draft's judge and each bonus sit among them.
    Request i was scheduled num_draft_tokens[i] + 1 tokens at the end of its slice of input_ids;
    the logits for draft j are those of the token before it.

        num_draft_tokens [3,0,2,0,1], cu_num_scheduled_tokens [4,104,107,207,209]
        -> logits_indices [0,1,2,3,103,104,105,106,206,207,208], bonus [3,4,7,8,10],
           target [0,1,2,5,6,9], draft_token_ids input_ids[[1,2,3,105,106,208]]"""
    num_draft_tokens = np.asarray(num_draft_tokens, dtype=np.int32)
    cu_num_scheduled_tokens = np.asarray(cu_num_scheduled_tokens, dtype=np.int32)
    num_sampled_tokens = num_draft_tokens + 1  # the drafts' judges and the bonus
    cu_num_sampled_tokens = np.cumsum(num_sampled_tokens, dtype=np.int32)
    # a position's offset within its request's sampled rows: arange(n) for each request
    arange = np.arange(cu_num_sampled_tokens[-1], dtype=np.int32) - np.repeat(
        cu_num_sampled_tokens - num_sampled_tokens, num_sampled_tokens)
    logits_indices = np.repeat(cu_num_scheduled_tokens - num_sampled_tokens, num_sampled_tokens) + arange
    bonus_logits_indices = cu_num_sampled_tokens - 1
    cu_num_draft_tokens = np.cumsum(num_draft_tokens, dtype=np.int32)
    draft_arange = np.arange(cu_num_draft_tokens[-1], dtype=np.int32) - np.repeat(
        cu_num_draft_tokens - num_draft_tokens, num_draft_tokens)
    target_logits_indices = np.repeat(cu_num_sampled_tokens - num_sampled_tokens, num_draft_tokens) + draft_arange
    device = input_ids.device

    def tensor(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)
    logits_indices_t = tensor(logits_indices)
    # the drafts are the scheduled tokens after each judge: input_ids[logits_indices][target + 1]
    draft_token_ids = input_ids[logits_indices_t.long()][tensor(target_logits_indices).long() + 1]
    return SpecDecodeMetadata(draft_token_ids=draft_token_ids.to(torch.int32),
                              num_draft_tokens=num_draft_tokens.tolist(),
                              cu_num_draft_tokens=tensor(cu_num_draft_tokens),
                              target_logits_indices=tensor(target_logits_indices),
                              bonus_logits_indices=tensor(bonus_logits_indices), logits_indices=logits_indices_t)


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor | None  # [B]; GREEDY_TEMPERATURE (-1) marks greedy requests; None: all greedy
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None = None  # [B]
    top_p: torch.Tensor | None = None  # [B]
    generators: dict[int, torch.Generator] | None = None  # request index -> its generator


class RejectionSampler(torch.nn.Module):
    def forward(self, metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                bonus_token_ids: torch.Tensor, sampling_metadata: SamplingMetadata) -> torch.Tensor:
        """draft_probs [N, V] or None; target_logits [N, V]; bonus_token_ids [B, 1]."""
        assert metadata.max_spec_len <= MAX_SPEC_LEN
        B = len(metadata.num_draft_tokens)
        out = torch.full((B, metadata.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
        gens = sampling_metadata.generators or {}
        start = 0
        for r, n in enumerate(metadata.num_draft_tokens):
            rows = slice(start, start + n)
            start += n
            temp = GREEDY_TEMPERATURE if sampling_metadata.all_greedy else float(sampling_metadata.temperature[r])
            drafts = metadata.draft_token_ids[rows].tolist()
            if temp == GREEDY_TEMPERATURE:
                probs, u, inv_q = target_logits[rows].float(), None, None  # argmax of logits = argmax of p
            else:
                top_k, top_p = sampling_metadata.top_k, sampling_metadata.top_p
                params = SamplingParams(temp, int(top_k[r]) if top_k is not None else 0,
                                        float(top_p[r]) if top_p is not None else 1.0)
                probs = probs_from_logits(target_logits[rows], params)
                # unseeded requests draw from the global generator; requests without drafts draw nothing
                u, inv_q = sampler_randoms(n, target_logits.shape[-1], gens.get(r)) if n else (None, None)
            dp = None if draft_probs is None else draft_probs[rows].float()
            row, _ = vllm_walk(drafts, probs, dp, int(bonus_token_ids[r, 0]), u, inv_q, temp == GREEDY_TEMPERATURE)
            out[r, :len(row)] = torch.tensor(row, dtype=torch.int32)
        return out


class NgramProposer:
    """v0.8.5 `NgramProposer`, its config unpacked: propose(context) -> the draft or None."""

    def __init__(self, min_n: int, max_n: int, k: int, max_model_len: int):
        self.min_n, self.max_n, self.k, self.max_model_len = min_n, max_n, k, max_model_len

    def propose(self, context_token_ids: np.ndarray) -> np.ndarray | None:
        m = propose_first_match(context_token_ids.tolist(), self.min_n, self.max_n, self.k, self.max_model_len)
        return None if m is None else np.asarray(m.tokens, dtype=context_token_ids.dtype)


def _kmp_lps_array(pattern: np.ndarray) -> np.ndarray:
    return np.asarray(kmp_lps_array(pattern.tolist()), dtype=np.int32)


def _find_subarray_kmp(context_token_ids: np.ndarray, n: int, k: int) -> np.ndarray | None:
    start = find_subarray_kmp(context_token_ids.tolist(), n)
    return None if start is None else context_token_ids[start:start + k]
