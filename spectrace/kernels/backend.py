"""`--backend triton`: the engine's hot operations through the Triton twins.

`install()` registers the twins under the name "triton" in the explicit path's tables, which the
engines consult by their KV caches' `backend` (a TritonKVCache and the fast engine's StaticKV say
"triton"); spectrace/engines.py calls it when a run asks for either:

    core/model.py  ATTENTION          paged self-attention  -> attention.extend_attention_fwd (prefill,
                                                               decode, verify, draft extend) or, for the
                                                               draft tree's scratch levels, the per-branch
                                                               decode form
    core/tree.py   BUILD_TREE         build_tree            -> kernels/tree.py: build_tree
    drafters/frozen_kv_mtp.py         the assistant's queries -> decode_attention_fwd, a sequence per
                   FROZEN_ATTENTION   over the target's KV      query row over its request's prefix
    core/acceptance TWIN_WALKS        greedy, target_only,  -> kernels/acceptance/: the same walk of each
                                      rejection, vllm          rule over a batch of one (adapters below)
    kernels/kv.py  TritonKVCache      req_to_token writes, accepted slots, KV moves

The explicit walk still runs beside the kernel walk: its per-node decisions are what the trace
records, and the engine stops with one line if the kernel's path or bonus differs, so a triton
trace is the same file as an explicit one. On this backend tree_rejection and typical walk on the
host (their device forms run on the fast engine: kernels/acceptance/tree_rejection.py and
fast/acceptance/typical.py), and DFLASH's attention (its own module, not the paged
self-attention) stays explicit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from spectrace.core import acceptance, model, tree
from spectrace.core.drafters import frozen_kv_mtp
from spectrace.core.batch import ForwardBatch
from spectrace.core.kv import KVCache
from spectrace.kernels import attention
from spectrace.kernels import batch as kbatch
from spectrace.kernels.acceptance import greedy, rejection, target_only, vllm
from spectrace.kernels.tree import build_tree

# ---- attention ---------------------------------------------------------------------------------


def _indptr(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(lengths.cumsum(0), (1, 0))


def extend_metadata(batch: ForwardBatch, kv: KVCache) -> dict | None:
    """extend_attention_fwd's arguments for a batch whose new tokens are the last extend_len
    positions of each request (prefill, decode, verify, draft extend): the prefix slots through
    create_kv_indices, the masks packed. None when the batch is laid out otherwise."""
    device = kv.req_to_token.device
    reqs = torch.tensor(batch.req_pool_indices, device=device)
    seq_lens = torch.tensor(batch.seq_lens, device=device)
    extend_lens = torch.tensor(batch.extend_lens, device=device)
    prefix_lens = seq_lens - extend_lens
    layout = list(zip(batch.req_pool_indices, batch.seq_lens, batch.extend_lens, batch.custom_masks))
    new_slots = torch.cat([kv.req_to_token[r, s - n:s] for r, s, n, _ in layout])
    prefix_visible = all(bool(m[:, :s - n].all()) for _, s, n, m in layout if m is not None)
    if not (prefix_visible and torch.equal(new_slots, batch.out_cache_loc)):
        return None
    kv_indptr = _indptr(prefix_lens)
    kv_indices = torch.empty(sum(batch.seq_lens) - sum(batch.extend_lens), dtype=kv.req_to_token.dtype,
                             device=device)
    kbatch.create_kv_indices(kv.req_to_token, reqs, prefix_lens, kv_indptr, None, kv_indices)
    custom_mask = mask_indptr = None
    if any(m is not None for *_, m in layout):  # a causal request among masked ones writes its causal mask out
        custom_mask, mask_indptr = kbatch.pack_custom_mask(
            [m if m is not None else torch.ones(n, s, dtype=torch.bool, device=device).tril(s - n)
             for _, s, n, m in layout])
    return dict(qo_indptr=_indptr(extend_lens), kv_indptr=kv_indptr, kv_indices=kv_indices, custom_mask=custom_mask,
                mask_indptr=mask_indptr, max_len_extend=max(batch.extend_lens))


def branch_metadata(batch: ForwardBatch, kv: KVCache) -> dict:
    """decode_attention_fwd's arguments with every query row its own sequence: the slots of the
    columns its mask shows (SGLang's generate_draft_decode_kv_indices: each branch of a draft
    tree reads the prefix and its own ancestors). For the scratch levels of EAGLE's draft loop,
    whose new tokens sit at scratch columns, not at the end."""
    indices, counts = [], []
    for req, seq_len, mask in zip(batch.req_pool_indices, batch.seq_lens, batch.custom_masks):
        slots = kv.req_to_token[req, :seq_len]
        indices.append(slots.expand(mask.shape[0], -1)[mask])  # row-major: row 0's slots, then row 1's, ...
        counts.append(mask.sum(1))
    return dict(kv_indptr=_indptr(torch.cat(counts)), kv_indices=torch.cat(indices))


def paged_attention(q, k, v, batch: ForwardBatch, kv: KVCache, layer_id: int) -> torch.Tensor:
    """core/model.py: paged_attention through the kernels; the metadata is built at the first layer."""
    if batch.attn_metadata is None:
        meta = extend_metadata(batch, kv)
        batch.attn_metadata = {"extend": meta} if meta is not None else {"branch": branch_metadata(batch, kv)}
    out = torch.empty_like(q)
    k_buffer, v_buffer = kv.pool.k[layer_id], kv.pool.v[layer_id]
    if "extend" in batch.attn_metadata:
        attention.extend_attention_fwd(q, k, v, out, k_buffer, v_buffer, **batch.attn_metadata["extend"])
    else:
        attention.decode_attention_fwd(q, k_buffer, v_buffer, out, **batch.attn_metadata["branch"])
    return out


def frozen_kv_attention(q, kv: KVCache, kv_layer: int, rows) -> torch.Tensor:
    """drafters/frozen_kv_mtp.py: frozen_attention through decode_attention_fwd, every query row a
    sequence over its request's prefix. rows: the explicit engine's (request, seq_len, n) list,
    or the fast engine's (req_to_token, prefix_lens): decode_attention_fwd's rows form."""
    if not isinstance(rows, dict):
        counts = torch.tensor([L for _, L, n in rows for _ in range(n)], device=q.device)
        rows = dict(kv_indptr=_indptr(counts), kv_indices=torch.cat(
            [kv.req_to_token[req, :L] for req, L, n in rows for _ in range(n)]))
    out = torch.empty_like(q)
    attention.decode_attention_fwd(q, kv.pool.k[kv_layer], kv.pool.v[kv_layer], out, **rows)
    return out


# ---- walks -------------------------------------------------------------------------------------

def _tree_tensors(device, candidates, next_token, next_sibling):
    """One request as a batch of one: candidates, retrive_index, retrive_next_token, retrive_next_sibling (1, n)."""
    n = len(candidates)
    return [torch.tensor([x], dtype=torch.int64, device=device)
            for x in (candidates, list(range(n)), next_token, next_sibling)]


def _path(predicts, accept_index, accept_token_num) -> tuple[list[int], int]:
    """The kernels' outputs for request 0 -> (accept_nodes, bonus_token)."""
    nodes = accept_index[0, :int(accept_token_num[0]) + 1].tolist()
    return nodes, int(predicts[nodes[-1]])


def _outputs(n: int, width: int, device):
    return (torch.full((n,), -1, dtype=torch.int64, device=device),
            torch.full((1, width), -1, dtype=torch.int64, device=device),
            torch.zeros(1, dtype=torch.int64, device=device))


def greedy_walk(device, candidates, next_token, next_sibling, target_predict, target_probs, draft_probs, randoms,
                max_depth, params):
    outs = _outputs(len(candidates), max_depth + 1, device)
    greedy.greedy_walk(*outs, *_tree_tensors(device, candidates, next_token, next_sibling),
                              torch.tensor([target_predict], dtype=torch.int64, device=device))
    return _path(*outs)


def target_only_walk(device, candidates, next_token, next_sibling, target_predict, target_probs, draft_probs,
                     randoms, max_depth, params):
    n = len(candidates)
    outs = _outputs(n, max_depth + 1, device)
    p = target_probs.to(device, torch.float32)
    q = torch.zeros_like(p) if draft_probs is None else draft_probs.to(device, torch.float32, copy=True)
    target_only.target_only_walk(
        *outs, *_tree_tensors(device, candidates, next_token, next_sibling), randoms.coins.view(1, n).to(device),
        randoms.coin_final.view(1).to(device), p.unsqueeze(0), q.unsqueeze(0), params.threshold_single,
        params.threshold_acc)
    return _path(*outs)


def rejection_walk(device, candidates, next_token, next_sibling, target_predict, target_probs, draft_probs, randoms,
                   max_depth, params):
    n = len(candidates)
    outs = _outputs(n, n, device)
    chain, index = _tree_tensors(device, candidates, next_token, next_sibling)[:2]
    rejection.rejection_walk(*outs, chain, index, randoms.coins.view(1, n).to(device),
                                      randoms.coin_final.view(1).to(device),
                                      target_probs.to(device, torch.float32).unsqueeze(0),
                                      draft_probs[:n - 1].to(device, torch.float32).unsqueeze(0))
    return _path(*outs)


def vllm_walk(device, candidates, next_token, next_sibling, target_predict, target_probs, draft_probs, randoms,
              max_depth, params):
    """core/acceptance/vllm.py: vllm_accept, a batch of one."""
    k = len(candidates) - 1
    p = target_probs.to(device, torch.float32)
    q = draft_probs[:k].to(device, torch.float32) if draft_probs is not None else None
    drafts = torch.tensor(candidates[1:], dtype=torch.int64, device=device)
    out = torch.full((1, k + 1), -1, dtype=torch.int32, device=device)
    vllm.vllm_accept(out, torch.tensor([k], device=device), drafts, q, p[:k].contiguous(), p[k:],
                     randoms.bonus_noise.view(1, -1).to(device), randoms.inv_q.view(1, -1).to(device),
                     randoms.uniforms.to(device), k)
    emitted = [t for t in out[0].tolist() if t != -1]
    return list(range(len(emitted))), emitted[-1]


def install() -> None:
    """Register the twins under "triton" in the explicit path's tables (idempotent)."""
    model.ATTENTION["triton"] = paged_attention
    tree.BUILD_TREE["triton"] = build_tree
    frozen_kv_mtp.FROZEN_ATTENTION["triton"] = frozen_kv_attention
    acceptance.TWIN_WALKS["triton"] = {"greedy": greedy_walk, "target_only": target_only_walk,
                                       "rejection": rejection_walk, "vllm": vllm_walk}
