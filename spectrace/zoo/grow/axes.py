"""Where a tiny model's numbers sit inside a grown one: the axes of a grown weight and how a tiny
matrix is placed on them (the rules are in spectrace/zoo/grow/__init__.py).

An `Axis` describes one dimension of a grown weight against the same dimension of the tiny one.
On an output axis, `exact` marks the outputs that must come out exact (a tiny value, or exactly
0); the others are free (their value is multiplied by an exact 0 later, or never read). On an
input axis, `exact` marks the inputs that are not exactly 0; a weight column whose input is
exactly 0 is free. `linear` fills a grown matrix with random values, zeroes the entries where an
exact output meets a non-zero input, and writes the tiny matrix at the live positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

C_VALUE = 2.0 ** -14  # the constant channel's value in every residual stream
B_PAD = 2.0 ** 24  # a padded vocabulary row is -B_PAD on the constant channel: its logit is -B_PAD * c / rms
FILL_STD = 0.02  # the random free entries (transformers' initializer_range)


@dataclass(frozen=True)
class Axis:
    size: int  # grown positions
    grown: torch.Tensor  # (m,) grown positions that carry a tiny index (copies repeat one)
    tiny: torch.Tensor  # (m,) the tiny index each carries
    tiny_size: int
    exact: torch.Tensor  # (size,) bool: see the module docstring

    def with_exact(self, positions) -> "Axis":
        """The same placement, `positions` (indices, or all of them with None) exact as well."""
        exact = self.exact.clone()
        exact[slice(None) if positions is None else positions] = True
        return Axis(self.size, self.grown, self.tiny, self.tiny_size, exact)


def prefix(size: int, n: int, exact_all: bool = False) -> Axis:
    """Tiny index i at grown position i, for i < n (a residual stream's R, a vocabulary, MLP units)."""
    exact = torch.zeros(size, dtype=torch.bool)
    exact[:size if exact_all else n] = True
    return Axis(size, torch.arange(n), torch.arange(n), n, exact)


def cat(*axes: Axis) -> Axis:
    """Axes side by side, as a concatenated input is (EAGLE-3's [embedding; feature], fc's taps)."""
    grown, tiny, exact, off, toff = [], [], [], 0, 0
    for a in axes:
        grown.append(a.grown + off)
        tiny.append(a.tiny + toff)
        exact.append(a.exact)
        off, toff = off + a.size, toff + a.tiny_size
    return Axis(off, torch.cat(grown), torch.cat(tiny), toff, torch.cat(exact))


def head_dim_position(j: int, tiny_dim: int, grown_dim: int) -> int:
    """RoPE rotates pair (i, i + d/2) of a head by theta^(-2i/d): tiny pair i goes to grown pair
    r*i (r = D/d), whose frequency theta^(-2ri/D) is the same number, bit for bit."""
    r, half = grown_dim // tiny_dim, tiny_dim // 2
    return r * j if j < half else r * (j - half) + grown_dim // 2


def heads(grown_heads: int, grown_dim: int, tiny_of: list[int], tiny_dim: int, tiny_heads: int,
          exact_all: bool) -> Axis:
    """q, k, v or an attention output: grown head Q's dims carry tiny head tiny_of[Q]'s. exact_all:
    the extra dims are exact (exactly 0) too: k and v, whose extra dims q reads or o_proj sums, and
    q under a per-head RMSNorm; else only the live dims (q: k is 0 where q is free)."""
    pos = torch.tensor([head_dim_position(j, tiny_dim, grown_dim) for j in range(tiny_dim)])
    grown = torch.cat([Q * grown_dim + pos for Q in range(grown_heads)])
    tiny = torch.cat([t * tiny_dim + torch.arange(tiny_dim) for t in tiny_of])
    exact = torch.full((grown_heads * grown_dim,), exact_all)
    exact[grown] = True
    return Axis(grown_heads * grown_dim, grown, tiny, tiny_heads * tiny_dim, exact)


def gqa_map(tiny_heads: int, tiny_kv: int, heads_: int, kv: int) -> tuple[list[int], list[int], int]:
    """(tiny q head of each grown q head, tiny KV head of each grown KV head, copies of each tiny q
    head). Grown KV head K is tiny KV head K // (kv / tiny_kv); the q slots of its group hold the
    tiny group's q heads, repeated: every grown head computes something live, and o_proj divides
    each copy's share by the number of copies."""
    if kv % tiny_kv or heads_ % kv or (heads_ // kv) % (tiny_heads // tiny_kv):
        raise ValueError(f"cannot grow {tiny_heads}/{tiny_kv} heads to {heads_}/{kv}: the grown KV heads must be a "
                         "multiple of the tiny ones and the grown group a multiple of the tiny group")
    rk, group, tiny_group = kv // tiny_kv, heads_ // kv, tiny_heads // tiny_kv
    q = [(Q // group // rk) * tiny_group + (Q % group) % tiny_group for Q in range(heads_)]
    return q, [K // rk for K in range(kv)], heads_ // tiny_heads


class Filler:
    """The random values of free entries, float32, on the device the weights are made on."""

    def __init__(self, seed: int, device):
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def __call__(self, *shape: int, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, device=self.device) * FILL_STD + mean


def linear(tiny: torch.Tensor | None, out: Axis, inp: Axis, fill: Filler, scale: float = 1.0) -> torch.Tensor:
    """A grown (out.size, inp.size) weight: random, 0 where an exact output meets a non-zero input,
    scale * the tiny weight at the live positions (tiny None: a layer that must add nothing)."""
    w = fill(out.size, inp.size)
    dev = w.device
    rows, cols = out.exact.nonzero().squeeze(1).to(dev), inp.exact.nonzero().squeeze(1).to(dev)
    w[rows[:, None], cols] = 0.0
    if tiny is not None:
        t = tiny.to(dev, torch.float32)
        w[out.grown.to(dev)[:, None], inp.grown.to(dev)] = scale * t[out.tiny.to(dev)[:, None], inp.tiny.to(dev)]
    return w


def norm_weight(tiny: torch.Tensor | None, axis: Axis, fill: Filler, scale: float, const: float = 0.0) -> torch.Tensor:
    """An RMSNorm weight over a grown residual: scale * the tiny weight on R (random if tiny is
    None: an identity layer's norm, read only by q, k and a v that is 0 on R), `const` on the
    constant channel, random where the stream is exactly 0."""
    w = fill(axis.size, mean=1.0)
    if tiny is not None:
        w[axis.grown.to(w.device)] = scale * tiny.to(w.device, torch.float32)[axis.tiny.to(w.device)]
    if axis.size > axis.tiny_size:
        w[axis.tiny_size] = const
    return w


@dataclass(frozen=True)
class Widths:
    """The widths of one model, tiny and grown, and the scales they imply."""

    d: int  # tiny hidden size
    D: int  # grown hidden size
    eps: float  # tiny rms_norm_eps

    @property
    def eps_grown(self) -> float:
        """mean_D(X^2) + eps_D = (d/D) (mean_d(x^2) + eps) when X = [x; c; 0]: the larger mean is
        d/D of the tiny one plus c^2/D, so eps_D = (d eps - c^2) / D."""
        return (self.d * self.eps - C_VALUE ** 2) / self.D

    @property
    def norm_scale(self) -> float:
        """X / rms_D(X) = sqrt(D/d) x / rms_d(x) on R: a norm weight is sqrt(d/D) times the tiny one."""
        return math.sqrt(self.d / self.D)

    def reader(self) -> Axis:
        """A normed residual read by q/k/v, gate/up or fc: non-zero on R only (its norm is 0 on C)."""
        return prefix(self.D, self.d)

    def stream(self) -> Axis:
        """A residual (or a final-normed one): non-zero on R and on the constant channel C = d."""
        return prefix(self.D, self.d).with_exact([self.d])

    def writer(self) -> Axis:
        """What o_proj, down_proj and fc write: R live, C and the rest exactly 0."""
        return prefix(self.D, self.d, exact_all=True)
