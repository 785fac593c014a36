"""Triton twin of core/acceptance/greedy.py: greedy_walk for every request, one program each
(SGLang's verify_tree_greedy): a draft is correct when it is the target's argmax after its parent."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check
from spectrace.kernels.acceptance import check_walk, pick


@triton.jit
def _greedy_walk_kernel(predicts, accept_index, accept_token_num, candidates, retrive_index,
                               retrive_next_token, retrive_next_sibling, target_predict,
                               n: tl.constexpr, num_spec_step: tl.constexpr, N: tl.constexpr):
    b = tl.program_id(0)  # greedy.py: greedy_walk, one request
    idx = tl.arange(0, N)  # the request's tree rows, in registers (node ids: int32 throughout)
    in_tree = idx < n
    candidates_row = tl.load(candidates + b * n + idx, mask=in_tree, other=-1)
    index_row = tl.load(retrive_index + b * n + idx, mask=in_tree, other=0)
    next_token_row = tl.load(retrive_next_token + b * n + idx, mask=in_tree, other=-1).to(tl.int32)
    next_sibling_row = tl.load(retrive_next_sibling + b * n + idx, mask=in_tree, other=-1).to(tl.int32)
    predict_row = tl.load(target_predict + index_row, mask=in_tree, other=-1)  # the target's argmax after each node

    last = pick(index_row, 0, idx)  # flat row of path[-1], the last accepted node
    parent = 0  # its node
    tl.store(accept_index + b * num_spec_step, last)
    num_accepted = 0
    walking = 1
    for _ in range(num_spec_step - 1):  # `for _ in range(max_depth)`
        if walking:
            target = pick(predict_row, parent, idx)  # the target's argmax after the parent
            cur = pick(next_token_row, parent, idx)
            found = 0
            for _ in range(n - 1):  # its children in sibling order
                if (found == 0) & (cur != -1):
                    if pick(candidates_row, cur, idx) == target:  # draft == argmax(p)
                        tl.store(predicts + last, target)
                        last = pick(index_row, cur, idx)
                        num_accepted += 1
                        tl.store(accept_index + b * num_spec_step + num_accepted, last)
                        parent = cur
                        found = 1
                    else:
                        cur = pick(next_sibling_row, cur, idx)
            walking = found
    tl.store(accept_token_num + b, num_accepted)
    tl.store(predicts + last, pick(predict_row, parent, idx))  # the bonus



def greedy_walk(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """In place, as compat.sglang.verify_tree_greedy. target_predict (bs, n) or (bs*n,)."""
    bs, n = check_walk(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts,
                        accept_index, accept_token_num)
    check("target_predict", target_predict.view(-1), torch.int64, (bs * n,), candidates.device)
    if bs:
        _greedy_walk_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, target_predict,
                                          n=n, num_spec_step=accept_index.shape[1], N=triton.next_power_of_2(n))
