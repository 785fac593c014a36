"""Triton twin of core/acceptance/rejection.py: rejection_walk over every request's chain, one
program each (SGLang's chain_speculative_sampling), the bonus drawn after it (kernels/sampling.py).
A chain's decisions are all known up front, so the first rejection is found with a min, not a loop."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check
from spectrace.kernels.sampling import sample_from_prob, store_bonus_draw


@triton.jit
def _chain_kernel(predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
                  target_probs, draft_probs, bonus_draw, vocab_size, n: tl.constexpr, N: tl.constexpr):
    b = tl.program_id(0)  # rejection.py: rejection_walk, one request's chain
    # A chain's node `step` follows node step - 1, so every decision's inputs are known before the
    # walk: all of them are loaded at once, and the walk's loop (stop at the first rejection) is a min.
    step = tl.arange(0, N) + 1  # the draft positions 1 .. n-1
    drafted = step < n
    row = (step - 1).to(tl.int64)  # the parent whose p and q judge the draft
    tok = tl.load(candidates + b * n + step, mask=drafted, other=0)
    p = tl.load(target_probs + (b * n + row) * vocab_size + tok, mask=drafted, other=0.0)
    q = tl.load(draft_probs + (b * (n - 1) + row) * vocab_size + tok, mask=drafted, other=0.0)
    coin = tl.load(uniform_samples + b * n + step - 1, mask=drafted, other=0.0)
    rejected = drafted & ~(coin * q < p)  # `if coin * q < p: accept, else stop` (a NaN q rejects)
    num_accepted = tl.min(tl.where(rejected, step - 1, n - 1), axis=0)

    path = tl.load(retrive_index + b * n + step - 1, mask=step - 1 <= num_accepted, other=0)  # rows 0 .. accepted
    tl.store(accept_index + b * n + step - 1, path, mask=step - 1 <= num_accepted)
    tl.store(predicts + path, tok, mask=step - 1 < num_accepted)  # each accepted draft at its parent's row
    tl.store(accept_token_num + b, num_accepted)
    last = tl.load(retrive_index + b * n + num_accepted)
    all_accepted = num_accepted == n - 1  # then the bonus comes from p after the last draft
    # all accepted: row n-1 of draft_probs does not exist, and subtract 0 masks every read of it
    store_bonus_draw(bonus_draw, b, last, (b * n + num_accepted).to(tl.int64) * vocab_size,
                     (b * (n - 1) + num_accepted).to(tl.int64) * vocab_size, 1 - all_accepted.to(tl.int32))


def rejection_walk(predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
                               uniform_samples_for_final_sampling, target_probs, draft_probs) -> None:
    """In place, as compat.sglang.chain_speculative_sampling. Chains of n nodes: target_probs
    (bs, n, V), draft_probs (bs, n-1, V) (row n-1 is never read), uniform_samples (bs, n)."""
    bs, n = candidates.shape
    device = candidates.device
    check("candidates", candidates, torch.int64, (bs, n), device)
    check("retrive_index", retrive_index, torch.int64, (bs, n), device)
    check("predicts", predicts, (torch.int32, torch.int64), (bs * n,), device)
    check("accept_index", accept_index, (torch.int32, torch.int64), (bs, n), device)
    check("accept_token_num", accept_token_num, (torch.int32, torch.int64), (bs,), device)
    check("target_probs", target_probs, torch.float32, (bs, n, None), device)
    check("draft_probs", draft_probs, torch.float32, (bs, n - 1, target_probs.shape[-1]), device)
    check("uniform_samples", uniform_samples, torch.float32, (bs, n), device)
    check("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, torch.float32, (bs,), device)
    if bs:
        vocab_size = target_probs.shape[-1]
        bonus_draw = torch.empty(bs, 4, dtype=torch.int64, device=device)
        _chain_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
                             target_probs, draft_probs, bonus_draw, vocab_size, n=n, N=triton.next_power_of_2(n))
        sample_from_prob(bonus_draw, target_probs, draft_probs, uniform_samples_for_final_sampling, predicts)
