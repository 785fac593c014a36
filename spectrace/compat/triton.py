"""SGLang's and vLLM's kernel entry points with their names, argument order and in-place outputs,
over spectrace's Triton twins (spectrace/kernels/), as spectrace.compat.sglang and .vllm are over
the explicit functions: put a peer's test or call site beside ours and it runs on the kernels.

    SGLang (sgl-kernel)                      twin
    build_tree_kernel_efficient              kernels/tree.py: build_tree, the root prepended
    verify_tree_greedy                       kernels/acceptance/greedy.py: greedy_walk
    tree_speculative_sampling_target_only    kernels/acceptance/target_only.py: target_only_walk
    chain_speculative_sampling               kernels/acceptance/rejection.py: rejection_walk
    extend_attention_fwd, decode_attention_fwd   kernels/attention.py (SGLang's own names)
    vLLM (v1/sample/rejection_sampler.py)
    RejectionSampler                         the module below, over kernels/acceptance/vllm.py
    rejection_greedy_sample, rejection_random_sample, sample_recovered_tokens, expand_batch_to_tokens
Needs Triton (Linux); on a CPU set TRITON_INTERPRET=1 before importing.
"""
from __future__ import annotations

import torch

from spectrace.compat.vllm import GREEDY_TEMPERATURE, SamplingMetadata, SpecDecodeMetadata
from spectrace.core.acceptance.vllm import MAX_SPEC_LEN, PLACEHOLDER_TOKEN_ID, sampler_randoms
from spectrace.core.sampling import SamplingParams, probs_from_logits
from spectrace.core.tree import TreeMaskMode
from spectrace.kernels import check
from spectrace.kernels.acceptance.greedy import greedy_walk as verify_tree_greedy
from spectrace.kernels.acceptance.rejection import rejection_walk as chain_speculative_sampling
from spectrace.kernels.acceptance.target_only import target_only_walk as tree_speculative_sampling_target_only
from spectrace.kernels.acceptance.vllm import expand_batch_to_tokens, recovered_tokens, vllm_greedy_walk, vllm_walk
from spectrace.kernels.attention import decode_attention_fwd, extend_attention_fwd
from spectrace.kernels.tree import build_tree

rejection_greedy_sample, rejection_random_sample, sample_recovered_tokens = vllm_greedy_walk, vllm_walk, recovered_tokens

__all__ = ["TreeMaskMode", "build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
           "chain_speculative_sampling", "extend_attention_fwd", "decode_attention_fwd", "RejectionSampler",
           "rejection_greedy_sample", "rejection_random_sample", "sample_recovered_tokens", "expand_batch_to_tokens"]


def build_tree_kernel_efficient(verified_id, parent_list, top_scores_index, draft_tokens, seq_lens,
                                seq_lens_sum, topk, spec_steps, num_verify_tokens,
                                tree_mask_mode=TreeMaskMode.FULL_MASK):
    """-> (tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling,
    draft_tokens), the root (verified_id) prepended to each request's draft tokens."""
    built = build_tree(parent_list, top_scores_index, seq_lens, topk, num_verify_tokens, tree_mask_mode, seq_lens_sum)
    return *built, torch.cat((verified_id.unsqueeze(1), draft_tokens), dim=1).flatten()


class RejectionSampler(torch.nn.Module):
    def forward(self, metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                bonus_token_ids: torch.Tensor, sampling_metadata: SamplingMetadata) -> torch.Tensor:
        """draft_probs [N, V] or None; target_logits [N, V]; bonus_token_ids [B, 1] -> [B, max_spec_len + 1]."""
        device, B, N = target_logits.device, len(metadata.num_draft_tokens), sum(metadata.num_draft_tokens)
        check("target_logits", target_logits, (torch.float32, torch.bfloat16, torch.float16), (N, None))
        if draft_probs is not None:
            check("draft_probs", draft_probs, torch.float32, tuple(target_logits.shape), device)
        check("bonus_token_ids", bonus_token_ids, shape=(B, 1), device=device)
        assert metadata.max_spec_len <= MAX_SPEC_LEN
        out = torch.full((B, metadata.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device)
        sm, cu = sampling_metadata, metadata.cu_num_draft_tokens.to(device)
        draft_ids = metadata.draft_token_ids.to(device)
        is_greedy = None if sm.all_greedy else (sm.temperature == GREEDY_TEMPERATURE).to(device)
        if sm.all_greedy or bool(is_greedy.any()):
            vllm_greedy_walk(out, cu, draft_ids, target_logits.argmax(-1), bonus_token_ids, is_greedy,
                                    metadata.max_spec_len)
            if sm.all_greedy:
                return out
        uniforms, inv_q = self.randoms(metadata, sm, target_logits.shape[-1], device)
        target_probs = self.target_probs(target_logits, metadata, sm)
        recovered = recovered_tokens(metadata.max_spec_len, metadata.num_draft_tokens, cu, draft_ids,
                                            draft_probs, target_probs, inv_q)
        vllm_walk(out, cu, draft_ids, draft_probs, target_probs, bonus_token_ids, recovered, uniforms,
                                is_greedy, metadata.max_spec_len)
        return out

    @staticmethod
    def randoms(metadata, sm, vocab: int, device):
        """Each random request's uniforms and inv_q, drawn as the explicit sampler draws them
        (greedy requests and requests without drafts draw nothing)."""
        gens = sm.generators or {}
        uniforms = torch.zeros(sum(metadata.num_draft_tokens), dtype=torch.float64)
        inv_q = torch.zeros(len(metadata.num_draft_tokens), vocab)
        start = 0
        for r, n in enumerate(metadata.num_draft_tokens):
            if n and not (sm.all_greedy or float(sm.temperature[r]) == GREEDY_TEMPERATURE):
                uniforms[start:start + n], inv_q[r] = sampler_randoms(n, vocab, gens.get(r))
            start += n
        return uniforms.to(device), inv_q.to(device)

    @staticmethod
    def target_probs(target_logits, metadata, sm) -> torch.Tensor:
        """p of every draft row after its request's temperature, top-k and top-p: expanded to the
        tokens, then torch's `probs_from_logits` once per distinct setting (vLLM's compute_probs)."""
        cu, N = metadata.cu_num_draft_tokens.to(target_logits.device), target_logits.shape[0]
        B = len(metadata.num_draft_tokens)
        temperature = expand_batch_to_tokens(sm.temperature.float().to(target_logits.device), cu, N,
                                             float(GREEDY_TEMPERATURE), 1.0)
        top_k = expand_batch_to_tokens((sm.top_k if sm.top_k is not None else torch.zeros(B)).long()
                                       .to(target_logits.device), cu, N)
        top_p = expand_batch_to_tokens((sm.top_p if sm.top_p is not None else torch.ones(B)).float()
                                       .to(target_logits.device), cu, N)
        settings = torch.stack([temperature, top_k.float(), top_p], 1)
        probs = torch.empty(target_logits.shape, dtype=torch.float32, device=target_logits.device)
        for t, k, p in torch.unique(settings, dim=0).tolist():
            rows = (settings == torch.tensor([t, k, p], device=settings.device)).all(1)
            probs[rows] = probs_from_logits(target_logits[rows], SamplingParams(t, int(k), p))
        return probs
