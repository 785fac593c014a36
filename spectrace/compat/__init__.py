"""Peer-named entry points (SGLang, vLLM) over spectrace.core, for side-by-side reading and tests."""
