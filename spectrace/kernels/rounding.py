"""`rounded`: a float32 value rounded to a 16-bit dtype and kept in float32, inside a Triton kernel."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """float32 x rounded to `dtype` and kept in float32, as a torch op's result is rounded before
    the next op reads it. bfloat16 by hand (round to nearest even on the bit pattern): the compiler
    folds a cast there and back, and then contracts a product and a sum into one FMA."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return x.to(dtype).to(tl.float32)
