"""vLLM's rejection sampler on the device (core/acceptance/vllm.py: vllm_accept; the Triton
kernels of kernels/acceptance/vllm.py), over each request's chain of sampled drafts.

The kernels' vllm_accept draws the bonus (the Sampler's race on p after the last draft), the
recovered tokens and the walk; the output row is turned into SGLang's path. A model drafter's chains
all
hold k = n - 1 drafts; n-gram's vary per request (its one-hot drafts: q None), so the drafts are
packed as vLLM packs them, request after request, into a buffer of bs * k rows
(cu_num_draft_tokens says where each request's end).
"""
from __future__ import annotations

import torch

from spectrace.fast.acceptance import Verdict, target_probs
from spectrace.kernels.acceptance.vllm import vllm_accept as accept_packed


def vllm_accept(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict:
    bs, n = tree.draft_tokens.shape
    device, k = logits.device, n - 1
    counts = tree.num_drafts if tree.num_drafts is not None else torch.full((bs,), k, device=device)
    cu = counts.cumsum(0)
    j = torch.arange(k, device=device)
    # bs * k: dropped
    packed = torch.where(j < counts[:, None], (cu - counts)[:, None] + j, bs * k).flatten()

    # (bs, k, ...) -> (bs * k, ...), request after request
    def pack(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros((bs * k + 1,) + x.shape[2:])
        return out.index_copy_(0, packed, x.flatten(0, 1))[:-1]

    p = target_probs(logits, tree, spec)
    drafts, target, uniforms = (pack(tree.draft_tokens[:, 1:]), pack(p[:, :k]),
                                pack(randoms.uniforms))
    q = pack(tree.draft_probs) if tree.draft_probs is not None else None
    out = torch.full((bs, n), -1, dtype=torch.int32, device=device)
    accept_packed(out, cu, drafts, q, target, p[torch.arange(bs, device=device), counts],
                  randoms.bonus_noise, randoms.inv_q, uniforms, k)
    accept_num = (out != -1).sum(dim=1) - 1
    rows = torch.arange(bs, device=device)[:, None] * n + torch.arange(n, device=device)
    accept_index = torch.where(torch.arange(n, device=device) <= accept_num[:, None], rows, -1)
    return Verdict(accept_index, accept_num, out.gather(1, accept_num[:, None]).flatten().long())
