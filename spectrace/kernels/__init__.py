"""Triton twins of the explicit path's hot operations, file for file and named as the core function
each mirrors (the twin of core/X.py:f is kernels/X.py:f), with every random number an input tensor:

    tree.py                      build_tree                         core/tree.py
    acceptance/greedy.py         greedy_walk                        core/acceptance/greedy.py
    acceptance/target_only.py    target_only_walk                   core/acceptance/target_only.py
    acceptance/rejection.py      rejection_walk                     core/acceptance/rejection.py
    acceptance/vllm.py           vllm_walk, vllm_greedy_walk,       core/acceptance/vllm.py
                                 recovered_tokens, expand_batch_to_tokens
    acceptance/tree_rejection.py tree_rejection_walk                core/acceptance/tree_rejection.py
    sampling.py                  sample_from_prob (a walk's bonus)  core/sampling.py
    kv.py                        assign_req_to_token_pool,          core/kv.py: KVCache.assign,
                                 fill_accept_out_cache_loc,           accepted_slots, TokenToKVPool.move
                                 move_kv_cache, TritonKVCache
    attention.py                 extend_attention_fwd,              core/model.py: attend over the paged KV
                                 decode_attention_fwd
    batch.py                     create_kv_indices,                 core/batch.py: ForwardBatch.build's
                                 pack_custom_mask                     slots and masks, on the device
    fused.py                     rms_norm, split_rope, silu_mul     core/model.py: RMSNorm, Attention, MLP
    matmul.py                    invariant_linear                   nn.Linear, batch-invariant (--deterministic)
    gemv.py                      linear, rows_linear                nn.Linear over 1-16 rows (a decode, a verify)
    top_k.py                     top_k_softmax, chunk_top_k         torch.topk(softmax(x)): the recording's top
                                                                      tokens, the draft loop's children
    pdl.py                       launch_options, wait_first         programmatic dependent launch: a forward's
                                                                      kernels overlap at their seams
    commit.py                    accept_tokens, commit_rows,        core/engine.py: COMMIT, the fast engine's
                                 commit_draft_state                   host row and draft state
    draft_level.py               select_level, DraftBuffers         core/drafters/eagle_worker.py: a level of
                                                                      the greedy draft loop (its top K)
    backend.py                   install(): the twins under --backend triton
    interpreter.py               Triton's interpreter patched once a launch (TRITON_INTERPRET=1)

A twin batches what its explicit function does for one request (one program per request), with
SGLang's in-place layouts; SGLang's and vLLM's names for them are spectrace/compat/triton.py's.
They run on CUDA tensors compiled, and on CPU tensors under Triton's interpreter: set
TRITON_INTERPRET=1 before importing a kernel module (tests/conftest.py does so without a GPU).
Triton is a Linux-only dependency; nothing outside this package, spectrace/fast/,
spectrace/compat/triton.py and `spectrace bench kernels` (measure/kernels.py) imports it.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from spectrace.errors import SpectraceError

if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None:
    from spectrace.kernels.interpreter import patch_once_a_launch

    patch_once_a_launch()


def require(device: str) -> None:
    """One line saying how to get the twins running where they cannot: Triton missing, or a CPU
    device without Triton's interpreter (which must be switched on before Triton is imported)."""
    if importlib.util.find_spec("triton") is None:
        raise SpectraceError("the Triton backend needs triton (Linux: pip install 'triton>=3.2')")
    if not str(device).startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise SpectraceError(f"Triton kernels on {device} run only interpreted: set TRITON_INTERPRET=1 "
                             "(slow, for parity checks), or use --device cuda")


def check(name: str, t: torch.Tensor, dtype: torch.dtype | tuple | None = None, shape: tuple | None = None,
          device: torch.device | None = None, strided: bool = False) -> None:
    """One clear line for a tensor a twin cannot take: its dtype, shape (None: any size there),
    device or layout (strided: the twin takes the tensor's strides)."""
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if dtype is not None and t.dtype not in dtypes:
        raise SpectraceError(f"{name} must be {' or '.join(str(d) for d in dtypes)}, not {t.dtype}")
    if shape is not None and (t.dim() != len(shape) or any(w is not None and s != w for s, w in zip(t.shape, shape))):
        want = "(" + ", ".join("*" if w is None else str(w) for w in shape) + ")"
        raise SpectraceError(f"{name} must have shape {want}, not {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise SpectraceError(f"{name} is on {t.device}; the other tensors are on {device}")
    if not strided and not t.is_contiguous():
        raise SpectraceError(f"{name} must be contiguous")
