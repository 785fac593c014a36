"""Compile every Triton twin for an H100/H200 (sm90) without a GPU: run as a script, not
interpreted. A stand-in driver names the target; each launch only compiles (warmup) and records
the kernel. The interpreter forgives what the compiler does not (a loop variable that changes
type, say), so this is CI's check that the kernels it tests interpreted also build for the GPU.
Prints the compiled kernels' names, one per line."""
import os
import sys
from concurrent.futures import ThreadPoolExecutor

assert "TRITON_INTERPRET" not in os.environ, "run without TRITON_INTERPRET"

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class CompileOnlyCUDA:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


compiled = set()
launch = JITFunction.run
# compilations run beside each other (Triton's compiler lets go of the GIL): 17 s for all on the
# 2-core CI machine with an empty cache, against 36 s one at a time
compiler, compiling = ThreadPoolExecutor(os.cpu_count()), []


def compile_only(self, *args, grid, warmup, **kwargs):
    compiled.add(self.fn.__name__)
    compiling.append(compiler.submit(launch, self, *args, grid=grid, warmup=True, **kwargs))


driver.set_active(CompileOnlyCUDA())
JITFunction.run = compile_only

from spectrace.compat.vllm import SamplingMetadata, SpecDecodeMetadata  # noqa: E402
from spectrace.core.tree import TreeMaskMode  # noqa: E402
from spectrace.measure.kernels import attention_inputs, chain_inputs, draft_tree_inputs, walk_outputs  # noqa: E402
from spectrace.compat import triton as sglang  # noqa: E402  (the twins under SGLang's and vLLM's names)
from spectrace.core.model import RMSNorm  # noqa: E402
from spectrace.kernels import attention, batch, commit, draft_level, fused, gemv, kv, matmul, pdl, top_k  # noqa: E402
from spectrace.kernels.tree import organize_draft_results  # noqa: E402
from spectrace.kernels.acceptance.tree_rejection import tree_rejection_walk  # noqa: E402

pdl._supported = lambda device: True  # the kernels as an H100 launches them: programmatic dependent launch on
gemv._tma_device = lambda device: True  # and rows_linear reading W through TMA descriptors, and
attention.kv_heads_per_program = lambda device, heads: 1  # a KV head a program
gen = torch.Generator().manual_seed(0)
bs, n, V = 2, 8, 64
parent_list, sel, draft_tokens = draft_tree_inputs(bs, 4, 3, n, V, gen)
for mode in TreeMaskMode:
    sglang.build_tree_kernel_efficient(torch.arange(bs), parent_list, sel, draft_tokens, torch.tensor([3, 5]), 8,
                                       4, 3, n, mode)
t = chain_inputs(bs, V, "cpu", gen)
tree = [t[k] for k in ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")]
sglang.verify_tree_greedy(*walk_outputs(bs, n, "cpu").values(), *tree, torch.zeros(bs, n, dtype=torch.int64))
sglang.tree_speculative_sampling_target_only(*walk_outputs(bs, n, "cpu").values(), *tree, t["uniform_samples"],
                                             t["uniform_samples_for_final_sampling"], t["target_probs"],
                                             t["draft_probs"])
tree_rejection_walk(t["target_probs"], t["draft_probs"], *tree[:1], *tree[2:], t["uniform_samples"],
                      t["uniform_samples_for_final_sampling"], lambda p, coins: p.argmax(-1), 5, 4)
sglang.chain_speculative_sampling(*walk_outputs(bs, n, "cpu").values(), t["candidates"], t["retrive_index"],
                                  t["uniform_samples"], t["uniform_samples_for_final_sampling"], t["target_probs"],
                                  t["draft_probs"][:, :-1].contiguous())

meta = SpecDecodeMetadata.make_dummy([[1, 2, 3], [4]], "cpu")
logits, bonus = torch.randn(4, V), torch.zeros(2, 1, dtype=torch.int64)
sglang.RejectionSampler()(meta, None, logits, bonus, SamplingMetadata(None, all_greedy=True, all_random=False))
mixed = SamplingMetadata(torch.tensor([-1.0, 1.0]), all_greedy=False, all_random=False)
for draft_probs in (None, torch.softmax(torch.randn(4, V), -1)):
    sglang.RejectionSampler()(meta, draft_probs, logits, bonus, mixed)

for dtype in (torch.float32, torch.bfloat16):  # float32 changes only the products' precision: its options once
    a = attention_inputs(bs, 16, 4, 2, 80, dtype, "cpu", gen)
    attention.extend_attention_fwd(**a)
    attention.decode_attention_fwd(a["q_extend"][:bs], a["k_buffer"], a["v_buffer"], a["o_extend"][:bs],
                                   a["kv_indptr"], a["kv_indices"], num_kv_splits=4)
a = attention_inputs(bs, 16, 4, 2, 80, torch.bfloat16, "cpu", gen)
attention.extend_attention_fwd(**a, skip_prefix_custom_mask=False, logit_cap=2.0)
attention.extend_attention_fwd(**{**a, "custom_mask": None, "mask_indptr": None})
attention.extend_attention_fwd(**a, num_kv_splits=4)
attention.decode_attention_fwd(a["q_extend"][:bs], a["k_buffer"], a["v_buffer"], a["o_extend"][:bs],
                               a["kv_indptr"], a["kv_indices"], num_kv_splits=1)
req_to_token = torch.zeros(4, 64, dtype=torch.int64)
lens = torch.tensor([3, 5])
batch.create_kv_indices(req_to_token, torch.tensor([0, 2]), lens, torch.tensor([0, 3, 8]), None,
                            torch.empty(8, dtype=torch.int64))
batch.create_kv_indices(req_to_token, torch.tensor([0, 2]), lens, torch.tensor([0, 3, 8]), torch.tensor([1, 2]),
                            torch.empty(8, dtype=torch.int64))
kv.assign_req_to_token_pool(torch.tensor([0, 2]), req_to_token, torch.tensor([0, 4]), torch.tensor([3, 9]),
                            torch.arange(8))
kv.fill_accept_out_cache_loc(torch.tensor([[0, 2, -1], [3, -1, -1]]), torch.arange(6),
                             torch.empty(6, dtype=torch.int64))
for dtype in (torch.float32, torch.bfloat16):
    pool = torch.zeros(2, 16, 2, 80, dtype=dtype)
    kv.move_kv_cache(pool, pool.clone(), torch.tensor([1, 2]), torch.tensor([3, 5]))

for dtype in (torch.float32, torch.bfloat16):  # the fast engine's fused layer pieces
    fused.rms_norm(torch.randn(3, 256, dtype=dtype), torch.ones(256, dtype=dtype), 1e-5)
    cos, sin = torch.ones(2, 3, 1, 32, dtype=dtype)
    fused.split_rope(torch.randn(3, (4 + 2 * 2) * 32, dtype=dtype), cos, sin, 4, 2, 32)
    cache = torch.zeros(8, 2, 32, dtype=dtype)
    fused.split_rope(torch.randn(3, (4 + 2 * 2) * 32, dtype=dtype), cos, sin, 4, 2, 32, cache, cache.clone(),
                     torch.tensor([1, 4, 6]))
    fused.split_rope(torch.randn(3, (4 + 2 * 2) * 32, dtype=dtype), cos, sin, 4, 2, 32,  # Qwen3's head norms
                     head_norms=(RMSNorm(32, 1e-6).to(dtype), RMSNorm(32, 1e-6).to(dtype)))
    fused.silu_mul(torch.randn(3, 2 * 704, dtype=dtype))
    fused.add_rms_norm(torch.randn(3, 256, dtype=dtype), torch.randn(3, 256, dtype=dtype),
                       RMSNorm(256, 1e-5).to(dtype))
    for norm_before_residual in (False, True):
        fused.eagle3_input(torch.tensor([1, 5, 2]), torch.randn(8, 256, dtype=dtype), torch.randn(3, 256, dtype=dtype),
                           RMSNorm(256, 1e-5).to(dtype), RMSNorm(256, 1e-5).to(dtype), norm_before_residual)
    a = attention_inputs(bs, 16, 4, 2, 80, dtype, "cpu", gen)  # the fast engine's forms: req_to_token rows, QLEN_ONLY
    width = a["q_extend"].shape[0] // bs
    rows = dict(a, kv_indptr=None, kv_indices=None, req_to_token=torch.arange(bs * 40).view(bs, 40) % 32,
                prefix_lens=torch.tensor([7, 30]), qo_indptr=torch.arange(bs + 1) * width, max_len_extend=width)
    attention.extend_attention_fwd(**dict(rows, custom_mask=torch.ones(bs * width * width, dtype=torch.bool),
                                          mask_indptr=torch.arange(bs + 1) * width * width, qlen_mask=True))
    paths = torch.zeros(bs, 3, 2, dtype=torch.int64)  # decode rows over req_to_token: three paths per request
    for p in (paths, None) if dtype == torch.bfloat16 else ():  # float32's precision: built above
        attention.decode_attention_fwd(a["q_extend"][:3 * bs], a["k_buffer"], a["v_buffer"], a["o_extend"][:3 * bs],
                                       req_to_token=rows["req_to_token"], prefix_lens=rows["prefix_lens"], paths=p)
    attention.decode_attention_fwd(a["q_extend"][:3 * bs], a["k_buffer"], a["v_buffer"], a["o_extend"][:3 * bs],
                                   req_to_token=rows["req_to_token"], prefix_lens=rows["prefix_lens"], paths=paths,
                                   path_lens=torch.ones(bs, 3, dtype=torch.int64), num_kv_splits=4)  # --deterministic
    for bias in (None, torch.zeros(704, dtype=dtype)):
        matmul.invariant_linear(torch.randn(3, 256, dtype=dtype), torch.randn(704, 256, dtype=dtype), bias)
        gemv.linear(torch.randn(1, 256, dtype=dtype), torch.randn(704, 256, dtype=dtype), bias)  # one row
        gemv.linear(torch.randn(3, 256, dtype=dtype), torch.randn(704, 256, dtype=dtype), bias)  # 2-16 rows
        if dtype != torch.float32 and bias is None:  # one 16-bit row: the norm before QKV / gate-up, silu_mul
            for delta in (None, torch.randn(1, 256, dtype=dtype)):
                gemv.norm_linear(torch.randn(1, 256, dtype=dtype), delta, torch.ones(256, dtype=dtype), 1e-5,
                                 torch.randn(704, 256, dtype=dtype), bias)
            gemv.silu_linear(torch.randn(1, 1408, dtype=dtype), torch.randn(256, 704, dtype=dtype), bias)  # before down

top_k.top_k_softmax(torch.randn(6, 300), 5, torch.zeros(2, 3, dtype=torch.int64))  # the recording's top of p, p at drafts
buffers = draft_level.DraftBuffers.empty(bs, 4, 5, "cpu")  # the fused draft loop, K = 4, 5 steps
for dtype in (torch.float32, torch.bfloat16):
    draft_level.select_level(torch.rand(bs, 300), None, None, torch.randn(bs, 64, dtype=dtype), 0, 5, buffers, True)
    for level in (1, 3):
        draft_level.select_level(torch.randn(bs * 4, 300, dtype=dtype), torch.rand(bs, 4),
                                 torch.zeros(bs, 4, level, dtype=torch.int64), torch.randn(bs * 4, 64, dtype=dtype),
                                 level, 5, buffers)
    draft_level.select_level(torch.randn(bs * 4, 300), torch.rand(bs, 4), torch.zeros(bs, 4, 2, dtype=torch.int64),
                             None, 2, 5, buffers)  # a draft LM: no hidden rows
    draft_level.select_level(torch.randn(bs * 4, 200, dtype=dtype), torch.rand(bs, 4),
                             torch.zeros(bs, 4, 2, dtype=torch.int64), torch.randn(bs * 4, 64, dtype=dtype), 2, 5,
                             buffers, token_map=torch.arange(200) + 100)  # EAGLE-3: its own vocabulary, mapped
    commit.commit_draft_state(torch.rand(bs, 300), torch.randn(bs, 64, dtype=dtype), torch.tensor([3, 5]),
                              torch.rand(bs, 300), torch.randn(bs, 64, dtype=dtype), torch.tensor([1, 0]),
                              torch.tensor([True, False]))
organize_draft_results(buffers.scores.uniform_(), buffers.tokens.random_(0, 300), torch.tensor([1, 2]), 8)
commit.accept_tokens(torch.zeros(bs, 5, dtype=torch.int64), torch.tensor([[0, 2, -1], [8, -1, -1]]),
                     torch.tensor([1, 0]), torch.tensor([5, 6]), torch.arange(bs * n).view(bs, n))
commit.commit_rows(torch.arange(bs * 20).view(bs, 20), torch.tensor([3, 5]), torch.tensor([[0, 2, -1], [8, -1, -1]]),
                   torch.tensor([1, 0]), torch.tensor([True, True]), n)

for job in compiling:  # a kernel that does not build raises here
    job.result()
print("\n".join(sorted(compiled)))
sys.exit(0)
