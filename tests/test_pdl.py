"""kernels/pdl.py's rule, checked from the kernels' syntax: a kernel launched with programmatic
dependent launch waits for the kernel before it (wait_first, or wait_for_inputs after reading
weights), and writes nothing before it waits; and PDL stays off where it cannot run."""
import ast
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
from spectrace.kernels import pdl  # noqa: E402

KERNELS = Path(__file__).resolve().parents[1] / "spectrace" / "kernels"
WAITS = {"wait_first", "wait_for_inputs"}


def pdl_kernels():
    """(file, kernel) of every @triton.jit function with a PDL parameter."""
    for path in sorted(KERNELS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list) \
                    and "PDL" in [a.arg for a in node.args.args] and node.name.endswith("_kernel"):
                yield path.name, node


def calls(node) -> set[str]:
    return {ast.unparse(c.func).split(".")[-1] for c in ast.walk(node) if isinstance(c, ast.Call)}


def test_every_pdl_kernel_waits_before_it_writes():
    kernels = list(pdl_kernels())
    assert len(kernels) >= 8, [k.name for _, k in kernels]  # the forward's: norms, RoPE, GEMV, attention, top-k
    for file, kernel in kernels:
        first = kernel.body[0]
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        body = kernel.body[1:] if docstring else kernel.body
        waits = [i for i, stmt in enumerate(body) if calls(stmt) & WAITS]
        assert waits, f"{file}: {kernel.name} is launched with PDL and never waits"
        before = body[:waits[0]]
        assert not any(calls(stmt) & {"store", "atomic_add", "atomic_xchg", "atomic_cas", "atomic_max"}
                       for stmt in before), f"{file}: {kernel.name} writes before it waits"


def test_pdl_is_off_where_it_cannot_run(monkeypatch):
    assert pdl.launch_options(torch.zeros(1)) == {"PDL": False}  # a CPU tensor: the interpreter has no PDL
    monkeypatch.setenv("SPECTRACE_PDL", "0")
    pdl._supported.cache_clear()
    try:  # switched off, a CUDA device is not even asked what it is
        assert not pdl._supported(torch.device("cuda", 0))
    finally:
        pdl._supported.cache_clear()
