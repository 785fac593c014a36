"""Triton's interpreter (TRITON_INTERPRET=1, the kernels on a CPU), patched once a launch.

The interpreter makes triton.language run on numpy by patching the language's modules (tl and
tl.core, where a function's globals name them) for the time of a launch. It patches them again on
every call of a @triton.jit helper inside the kernel (a walk over three modules' members, about
1 ms), though the launch's patch is still in place: our kernels call a helper per tile, so
interpreted runs spent about half their time there. Here a helper's call inside a launch patches
only a module the launch has not patched yet (tl.core, for triton's own reductions), and the launch
restores every patch it made. Applied by spectrace/kernels/__init__.py under TRITON_INTERPRET=1,
for Triton versions whose interpreter has patch scopes (3.4 and later); older ones run as they are.

It also turns off the interpreter's integer overflow checks unless Triton's debug mode is on:
each check recomputes an int32 add, sub or mul in int64 and compares it with the bounds (five
more interpreted ops), then hands the result to a device_assert that only debug mode keeps, as
a GPU build drops it. With them off, an interpreted forward of the fast engine takes about a
quarter less time.

And it sums a float32 tl.dot's products in a fixed order per output: numpy's matmul hands float32
tiles to OpenBLAS, whose micro-kernels order a row's sum by where the row sits in the tile, so a
row came out one ulp apart alone and inside a batch, which a GPU's tl.dot never does (and
kernels/matmul.py's batch-invariant linear promises). einsum without optimisation runs over k in
order for every output element.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect

import numpy as np


class _Reused:
    """A helper call's patch scope inside a launch: restored with the launch's."""

    def restore(self) -> None:
        """Nothing of its own to restore."""


def patch_once_a_launch() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    if not hasattr(interpreter, "_LangPatchScope") or getattr(interpreter, "_spectrace_once", False):
        return
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    launches: list[tuple[set, list]] = []  # per launch in progress: the modules patched, the scopes

    @functools.lru_cache(maxsize=None)
    def languages(fn) -> frozenset:
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def once(fn):
        if not launches:  # a helper called outside a launch: as the interpreter does it
            return patch_lang(fn)
        patched, scopes = launches[-1]
        if not languages(fn) <= patched:
            scopes.append(patch_lang(fn))
            patched |= languages(fn)  # the launch's own set (below), grown
        return _Reused()

    @functools.wraps(launch)
    def call(self, *args, **kwargs):
        launches.append((set(languages(self.fn)), [patch_lang(self.fn)]))
        try:
            return launch(self, *args, **kwargs)  # its own _patch_lang call is then reused
        finally:
            for scope in reversed(launches.pop()[1]):
                scope.restore()

    interpreter.GridExecutor.__call__, interpreter._patch_lang = call, once
    interpreter._spectrace_once = True
    builder = interpreter.interpreter_builder
    if getattr(builder.options, "sanitize_overflow", False) and not builder.options.debug:  # (module docstring)
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    dot = type(builder).create_dot

    def create_dot(self, a, b, d, *args):
        acc = d.data.dtype  # float32 (or float16) accumulation: numpy would call BLAS for float32
        if acc.kind != "f" or a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
            return dot(self, a, b, d, *args)
        out = np.einsum("...ik,...kj->...ij", a.data.astype(acc), b.data.astype(acc), optimize=False)
        return interpreter.TensorHandle(out + d.data, d.dtype.scalar)
    type(builder).create_dot = create_dot
