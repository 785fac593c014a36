"""Peer-named entry points (SGLang, vLLM) for side-by-side reading and tests: sglang.py and vllm.py
over spectrace.core, triton.py over the Triton twins of spectrace.kernels (needs Triton)."""
