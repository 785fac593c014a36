"""Triton twins of the explicit path's hot operations (`--backend triton`).

Each module mirrors one explicit module, function for function, with the same name and the
same (in-place) signature, and takes all randomness as input tensors:

    sglang.py    build_tree_kernel_efficient, verify_tree_greedy, tree_speculative_sampling_target_only,
                 chain_speculative_sampling          (twins of spectrace.compat.sglang)
    vllm.py      RejectionSampler: greedy, random, expand and recovered-token kernels
                 (twin of spectrace.compat.vllm)
    attention.py extend_attention_fwd, decode_attention_fwd over the paged KV with tree masks,
                 create_kv_indices, pack_custom_mask (twins of core/model.py: attend, per request)
    kv.py        assign_req_to_token_pool, fill_accept_out_cache_loc, move_kv_cache, and
                 TritonKVCache, the explicit KVCache running them (twins of core/kv.py)
    sampling.py  sample_bonus: every walk's bonus drawn from its residual row, the vocabulary split into tiles

They run on CUDA tensors compiled, and on CPU tensors under Triton's interpreter: set
TRITON_INTERPRET=1 before importing a kernel module (tests/conftest.py does so without a GPU).
Triton is a Linux-only dependency; nothing outside this package imports it.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from spectrace.errors import SpectraceError


def require(device: str) -> None:
    """One line saying how to get the twins running where they cannot: Triton missing, or a CPU
    device without Triton's interpreter (which must be switched on before Triton is imported)."""
    if importlib.util.find_spec("triton") is None:
        raise SpectraceError("the Triton backend needs triton (Linux: pip install 'triton>=3.2')")
    if not str(device).startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise SpectraceError(f"Triton kernels on {device} run only interpreted: set TRITON_INTERPRET=1 "
                             "(slow, for parity checks), or use --device cuda")


def check(name: str, t: torch.Tensor, dtype: torch.dtype | tuple | None = None, shape: tuple | None = None,
          device: torch.device | None = None) -> None:
    """One clear line for a tensor a twin cannot take: its dtype, shape (None: any size there),
    device or layout."""
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if dtype is not None and t.dtype not in dtypes:
        raise SpectraceError(f"{name} must be {' or '.join(str(d) for d in dtypes)}, not {t.dtype}")
    if shape is not None and (t.dim() != len(shape) or any(w is not None and s != w for s, w in zip(t.shape, shape))):
        want = "(" + ", ".join("*" if w is None else str(w) for w in shape) + ")"
        raise SpectraceError(f"{name} must have shape {want}, not {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise SpectraceError(f"{name} is on {t.device}; the other tensors are on {device}")
    if not t.is_contiguous():
        raise SpectraceError(f"{name} must be contiguous")
