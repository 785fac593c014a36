"""Triton twin of core/acceptance/target_only.py: target_only_walk for every request, one program
each (SGLang's tree_speculative_sampling_target_only), the bonus drawn after it (kernels/sampling.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check
from spectrace.kernels.acceptance import check_walk, pick
from spectrace.kernels.sampling import sample_from_prob, store_bonus_draw


@triton.jit
def _target_only_kernel(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                        retrive_next_sibling, uniform_samples, target_probs, draft_probs, bonus_draw, threshold_single,
                        threshold_acc, vocab_size, n: tl.constexpr, num_spec_step: tl.constexpr, N: tl.constexpr):
    b = tl.program_id(0)  # target_only.py: target_only_walk, one request
    idx = tl.arange(0, N)  # the request's tree rows and coins, in registers (see pick)
    in_tree = idx < n
    candidates_row = tl.load(candidates + b * n + idx, mask=in_tree, other=-1)
    index_row = tl.load(retrive_index + b * n + idx, mask=in_tree, other=0)
    next_token_row = tl.load(retrive_next_token + b * n + idx, mask=in_tree, other=-1).to(tl.int32)
    next_sibling_row = tl.load(retrive_next_sibling + b * n + idx, mask=in_tree, other=-1).to(tl.int32)
    coins_row = tl.load(uniform_samples + b * n + idx, mask=in_tree, other=0.0)

    last = pick(index_row, 0, idx)
    tl.store(accept_index + b * num_spec_step, last)
    row = 0  # the node whose p the level reads
    prob_acc = 0.0
    coin = pick(coins_row, 0, idx)
    num_accepted = 0
    walking = 1
    for _ in range(num_spec_step - 1):
        if walking:
            cur = pick(next_token_row, row, idx)
            p_row = target_probs + (b * n + row).to(tl.int64) * vocab_size
            found = 0
            for _ in range(n - 1):
                if (found == 0) & (cur != -1):
                    tok = pick(candidates_row, cur, idx)
                    p = tl.load(p_row + tok)  # the one load a node costs: p of its token after its parent
                    prob_acc += p
                    if (coin <= prob_acc / threshold_acc) | (p >= threshold_single):
                        tl.store(predicts + last, tok)
                        last = pick(index_row, cur, idx)
                        num_accepted += 1
                        tl.store(accept_index + b * num_spec_step + num_accepted, last)
                        row = cur
                        prob_acc = 0.0
                        coin = pick(coins_row, cur, idx)
                        found = 1
                    else:  # its mass leaves the residual
                        tl.store(draft_probs + (b * n + row).to(tl.int64) * vocab_size + tok, p)
                        cur = pick(next_sibling_row, cur, idx)
            walking = found
    tl.store(accept_token_num + b, num_accepted)
    full_depth = num_accepted == num_spec_step - 1  # then the bonus comes from p itself, else relu(p - q)
    offset = (b * n + row).to(tl.int64) * vocab_size
    store_bonus_draw(bonus_draw, b, last, offset, offset, 1 - full_depth.to(tl.int32))


def target_only_walk(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single=1.0, threshold_acc=1.0, deterministic=True) -> None:
    """In place, as compat.sglang's (draft_probs written as the kernel writes it). target_probs,
    draft_probs (bs, n, V) float32; uniform_samples (bs, n) and the final coins (bs,) float32."""
    bs, n = check_walk(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts,
                        accept_index, accept_token_num)
    device = candidates.device
    check("target_probs", target_probs, torch.float32, (bs, n, None), device)
    check("draft_probs", draft_probs, torch.float32, tuple(target_probs.shape), device)
    check("uniform_samples", uniform_samples, torch.float32, (bs, n), device)
    check("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, torch.float32, (bs,), device)
    if bs:
        vocab_size = target_probs.shape[-1]
        bonus_draw = torch.empty(bs, 4, dtype=torch.int64, device=device)
        _target_only_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index,
                                   retrive_next_token, retrive_next_sibling, uniform_samples, target_probs,
                                   draft_probs, bonus_draw, float(threshold_single),
                                   max(float(threshold_acc), 1e-9), vocab_size, n=n,
                                   num_spec_step=accept_index.shape[1], N=triton.next_power_of_2(n))
        sample_from_prob(bonus_draw, target_probs, draft_probs, uniform_samples_for_final_sampling, predicts)
