"""kernels/fused.py: each fused piece equals the explicit ops it replaces (core/model.py), and a
fused model's forward equals the explicit one. On a CPU the kernels run interpreted, in float32
only (the interpreter truncates to bfloat16 where a GPU rounds to nearest even); on a GPU in
float32 and bfloat16, and end to end through the fast engine in tests/test_gpu.py."""
import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from spectrace.core.batch import ForwardBatch  # noqa: E402
from spectrace.core.model import RMSNorm, RotaryEmbedding, apply_rope  # noqa: E402
from spectrace.kernels import fused, gemv  # noqa: E402
from spectrace.kernels.rounding import rounded  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter has no bfloat16 products


def assert_equal_or_ulp(got, want):
    """float32: equal to rounding of exp/rsqrt; bfloat16: equal, or one bf16 ulp in a few elements."""
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=1e-5)
        assert (got != want).sum() <= 0.02 * want.numel()


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(0, 5), hidden=st.sampled_from([8, 48, 256]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_rms_norm_equals_the_explicit_norm(rows, hidden, dtype, seed):
    torch.manual_seed(seed)
    norm = RMSNorm(hidden, 1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = (torch.randn(rows, hidden) * 3).to(DEVICE, dtype)
    assert_equal_or_ulp(fused.rms_norm(x, norm.weight, norm.eps), norm(x))


@settings(max_examples=10, deadline=None)
@given(tokens=st.integers(1, 5), heads=st.sampled_from([(4, 2), (2, 2), (4, 1)]), head_dim=st.sampled_from([8, 32]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16), qk_norm=st.booleans(), llama3=st.booleans())
def test_split_rope_equals_the_explicit_projections_and_rope(tokens, heads, head_dim, dtype, seed, qk_norm, llama3):
    """With qk_norm, Qwen3's per-head RMSNorms of q and k first; llama3: Llama 3.1's RoPE frequencies."""
    torch.manual_seed(seed)
    h, kvh = heads
    qkv = (torch.randn(tokens, (h + 2 * kvh) * head_dim) * 3).to(DEVICE, dtype)
    scaling = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
    rope = RotaryEmbedding(head_dim, 10000.0, scaling if llama3 else None)
    cos, sin = rope(torch.randint(0, 500, (tokens,), device=DEVICE), dtype)
    k_cache, v_cache = torch.zeros(2, 2 * tokens, kvh, head_dim, dtype=dtype, device=DEVICE)
    slots = torch.randperm(2 * tokens, device=DEVICE)[:tokens]
    norms = None
    if qk_norm:
        norms = (RMSNorm(head_dim, 1e-6).to(DEVICE, dtype), RMSNorm(head_dim, 1e-6).to(DEVICE, dtype))
        with torch.no_grad():
            for norm in norms:
                norm.weight.uniform_(0.5, 1.5)
    q, k, v = fused.split_rope(qkv, cos, sin, h, kvh, head_dim, k_cache, v_cache, slots, norms)
    want_q, want_k, want_v = qkv.split([h * head_dim, kvh * head_dim, kvh * head_dim], dim=1)
    want_q, want_k = want_q.reshape(tokens, h, head_dim), want_k.reshape(tokens, kvh, head_dim)
    if qk_norm:
        want_q, want_k = norms[0](want_q), norms[1](want_k)
    assert_equal_or_ulp(q, apply_rope(want_q, cos, sin))
    assert_equal_or_ulp(k, apply_rope(want_k, cos, sin))
    assert torch.equal(v, want_v.reshape(tokens, kvh, head_dim))
    assert torch.equal(k_cache[slots], k) and torch.equal(v_cache[slots], v)  # TokenToKVPool.write's rows
    unwritten = torch.ones(2 * tokens, dtype=torch.bool, device=DEVICE)
    unwritten[slots] = False
    assert not k_cache[unwritten].any() and not v_cache[unwritten].any()


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(0, 5), hidden=st.sampled_from([8, 48, 256]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_add_rms_norm_is_the_residual_add_then_the_norm(rows, hidden, dtype, seed):
    torch.manual_seed(seed)
    norm = RMSNorm(hidden, 1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, delta = (torch.randn(2, rows, hidden) * 3).to(DEVICE, dtype)
    total, normed = fused.add_rms_norm(x, delta, norm)
    assert torch.equal(total, x + delta)
    assert_equal_or_ulp(normed, norm(x + delta))


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(0, 5), hidden=st.sampled_from([8, 48, 256]), dtype=st.sampled_from([torch.float32, HALF]),
       norm_before_residual=st.booleans(), seed=st.integers(0, 2**16))
def test_eagle3_input_is_the_heads_layer_input(rows, hidden, dtype, norm_before_residual, seed):
    """fused.eagle3_input: Eagle3Head.layer_input after fc (the residual h itself, or its norm)."""
    from spectrace.core.config import ModelConfig
    from spectrace.core.drafters.eagle3 import Eagle3Head

    torch.manual_seed(seed)
    cfg = ModelConfig.from_json(dict(model_type="llama", vocab_size=50, hidden_size=hidden, intermediate_size=16,
                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                     rms_norm_eps=1e-5))
    head = Eagle3Head(cfg, 20, hidden, (0, 1, 2), norm_before_residual).to(DEVICE, dtype)
    with torch.no_grad():
        for norm in (head.midlayer.input_layernorm, head.midlayer.hidden_norm):
            norm.weight.uniform_(0.5, 1.5)
    ids = torch.randint(0, 50, (rows,), device=DEVICE)
    h = (torch.randn(rows, hidden) * 3).to(DEVICE, dtype)
    attn_in, residual = fused.eagle3_input(ids, head.embed_tokens.weight, h, head.midlayer.input_layernorm,
                                           head.midlayer.hidden_norm, norm_before_residual)
    want_in, want_residual = head.layer_input(ids, h)
    assert_equal_or_ulp(attn_in, want_in)
    assert_equal_or_ulp(residual, want_residual)
    assert norm_before_residual or residual is h


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(0, 4), inner=st.sampled_from([3, 64, 1500]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16), lead=st.sampled_from([(), (3,)]))
def test_silu_mul_equals_swiglu(rows, inner, dtype, seed, lead):
    """(N, 2I) rows, and (bs, block, 2I) as DFLASH's block runs."""
    torch.manual_seed(seed)
    gate_up = (torch.randn(*lead, rows, 2 * inner) * 4).to(DEVICE, dtype)
    gate, up = gate_up.split(inner, dim=-1)
    assert_equal_or_ulp(fused.silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("name", ["target", "eagle3"])
@pytest.mark.skipif(DEVICE == "cuda", reason="the fast engine's GPU tests run fused models end to end")
def test_a_fused_model_computes_the_explicit_forward(target, drafters, name):
    """The embedded target (and the EAGLE-3 head, whose q/k/v read 2H) fused: the same logits, and
    its old q/k/v and gate/up weights are views of the fused ones (no copy)."""
    from spectrace.kernels import backend

    backend.install()  # the fused attention routes through the twins

    model = copy.deepcopy(target if name == "target" else drafters["eagle3"])
    ids = list(range(5, 17))
    features = torch.randn(len(ids), len(getattr(model, "capture_layers", ())) * target.config.hidden_size)
    outs = []
    for fuse in (False, True):
        if fuse:
            fused.fuse(model)
        kv = model.new_kv_cache("t", "sglang", 32, 1, 32)
        batch = ForwardBatch.build(kv, [(0, 0, ids)])
        if name == "target":
            outs.append(model(batch, kv).logits)
        else:
            outs.append(model.compute_logits(model(batch, kv, features)))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    attn = next(m for m in model.modules() if hasattr(m, "qkv_weight"))
    assert attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()
    # a linear called as a module (the head's fc and lm_head) streams as the layers' do
    assert all(fused.is_fused(m) for m in model.modules() if isinstance(m, torch.nn.Linear))


@settings(max_examples=10, deadline=None)
@given(lead=st.sampled_from([(1,), (1, 1), (3,), (2, 5), (4, 4), (17,)]), k=st.sampled_from([16, 70, 600, 1500]),
       n=st.sampled_from([8, 100, 300]),
       bias=st.booleans(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_the_streaming_linear_is_f_linear(lead, k, n, bias, dtype, seed):
    """kernels/gemv.py: at one row the weight-streaming GEMV, at 2-16 the tensor-core stream
    (rows_linear), at more F.linear; F.linear either way (to the rounding of the order of the
    float32 sums)."""
    from spectrace.kernels.gemv import linear

    torch.manual_seed(seed)
    x = (torch.randn(*lead, k) * 3).to(DEVICE, dtype)
    w = (torch.randn(n, k) / k ** 0.5).to(DEVICE, dtype)
    b = torch.randn(n).to(DEVICE, dtype) if bias else None
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(linear(x, w, b).float(), want, **tol)
    if DEVICE == "cpu":  # the kernels themselves, interpreted in float16 (float32 keeps F.linear)
        x16, w16, b16 = (None if t is None else t.half() for t in (x, w, b))
        torch.testing.assert_close(linear(x16, w16, b16).float(), want, rtol=2e-2, atol=2e-2)


TMA_OK = DEVICE == "cpu" or torch.cuda.get_device_capability()[0] >= 9  # the interpreter, or Hopper and later


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(2, gemv.MAX_ROWS), k=st.sampled_from([16, 72, 1496]), n=st.sampled_from([8, 100]),
       bias=st.booleans(), tma=st.sampled_from([False, True] if TMA_OK else [False]), seed=st.integers(0, 2**16))
def test_rows_linear_either_way_is_f_linear(rows, k, n, bias, tma, seed):
    """rows_linear with W's tiles read through a TMA descriptor (Hopper's way) or by pointer loads
    (SPECTRACE_TMA=0, and GPUs before Hopper, which draw only these), forced either way: interpreted
    on the CPU in float16, compiled on a GPU in bfloat16. The copy's zeros past W's last row and
    column stand in for the masks. 1,496 columns: a second, partial tile (TMA wants rows of a
    multiple of 16 bytes)."""
    torch.manual_seed(seed)
    x = (torch.randn(rows, k) * 3).to(DEVICE, HALF)
    w = (torch.randn(n, k) / k ** 0.5).to(DEVICE, HALF)
    b = torch.randn(n).to(DEVICE, HALF) if bias else None
    tma_device, gemv._tma_device = gemv._tma_device, lambda device: tma
    try:
        assert gemv.by_tma(x, w) == tma
        y = gemv.rows_linear(x, w, b)
    finally:
        gemv._tma_device = tma_device
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)


@settings(max_examples=12, deadline=None)
@given(k=st.sampled_from([16, 70, 600, 1500]), n=st.sampled_from([8, 100]), residual=st.booleans(),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_a_gemv_with_its_prologue_is_the_op_then_the_gemv(k, n, residual, bias, seed):
    """kernels/gemv.py's prologues, one row of a 16-bit float: norm_linear is add_rms_norm (rms_norm
    without a residual) then the GEMV, the residual stream bit for bit; silu_linear is silu_mul then
    the GEMV. The products are the same GEMV's, so the outputs differ only where the norm's sum of
    squares, added in another order, moves an input by an ulp. 1,500 columns: two tiles."""
    torch.manual_seed(seed)
    norm = RMSNorm(k, 1e-5).to(DEVICE, HALF)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, delta = ((torch.randn(2, 1, k) * 3).to(DEVICE, HALF)).unbind(0)
    w = (torch.randn(n, k) / k ** 0.5).to(DEVICE, HALF)
    b = torch.randn(n).to(DEVICE, HALF) if bias else None
    total, y = gemv.norm_linear(x, delta if residual else None, norm.weight, norm.eps, w, b)
    want_total, normed = fused.add_rms_norm(x, delta if residual else None, norm)
    assert torch.equal(total, want_total)
    want = gemv.linear(normed, w, b)
    torch.testing.assert_close(y.float(), want.float(), rtol=8e-3, atol=1e-3)
    assert (y != want).sum() <= max(1, 0.05 * n)
    gate_up = (torch.randn(1, 2 * k) * 3).to(DEVICE, HALF)
    assert torch.equal(gemv.silu_linear(gate_up, w, b), gemv.linear(fused.silu_mul(gate_up), w, b))


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 40), k=st.sampled_from([16, 70, 256]), n=st.sampled_from([8, 64, 100]),
       bias=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float16 if DEVICE == "cpu" else torch.bfloat16]),
       seed=st.integers(0, 2**16))
def test_invariant_linear_is_f_linear_and_each_row_as_alone(rows, k, n, bias, dtype, seed):
    """kernels/matmul.py: F.linear to float32 rounding (the half type to its own), and every row
    bit for bit what it is computed alone or in any slice of the batch (a 16-bit float on a GPU
    is the case that matters: cuBLAS is not batch-invariant there; the interpreter cannot do
    bfloat16 products, so the CPU takes float16)."""
    from spectrace.kernels.matmul import invariant_linear

    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g) / k ** 0.5
    b = torch.randn(n, generator=g) if bias else None
    x, w, b = (t.to(DEVICE, dtype) if t is not None else None for t in (x, w, b))
    y = invariant_linear(x, w, b)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float(), want, rtol=tol, atol=tol)
    alone = torch.cat([invariant_linear(x[i:i + 1], w, b) for i in range(rows)])
    assert torch.equal(alone, y)
    lo = rows // 3
    assert torch.equal(invariant_linear(x[lo:], w, b), y[lo:])


def test_rounded_is_torchs_round_to_nearest_even():
    """The kernels' bfloat16 rounding by hand equals torch's cast, ties to even included."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, out, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(out + i, rounded(tl.load(x + i), tl.bfloat16))

    torch.manual_seed(0)
    x = torch.randn(4096, device=DEVICE) * 10
    x[:4] = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -1.0 - 2**-8, 0.0])  # halfway: down, up, down, zero
    out = torch.empty_like(x)
    kernel[(1,)](x, out, N=4096)
    assert torch.equal(out, x.to(torch.bfloat16).float())
