"""Sampling on the device, and the random numbers the fast engine reads (core/sampling.py).

Every random number is drawn on the host from its request's generator, in the explicit engine's
order (the draft loop's race noise level by level, then the acceptance rule's draws, or a plain
sample's one coin), and copied into device buffers before the step is launched: a CUDA graph
reads them there, and a seeded fast run draws exactly what an explicit run draws.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from spectrace.core.acceptance import Randoms, Rule
from spectrace.core.request import Request
from spectrace.core.sampling import SamplingParams, probs_from_logits


def sample_rows(probs: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """core/sampling.py's sample_from_prob for every row at once, in torch: probs (R, V), one
    float64 coin per row -> (R,) the smallest i with p_i > 0 and cumsum_i > coin * sum, else the
    last i with p_i > 0 (float64, as the explicit draw; kernels/sampling.py's tiles sum in
    float32)."""
    w = probs.double()
    cdf = w.cumsum(-1)
    hit = (w > 0) & (cdf > coins[:, None] * cdf[:, -1:])
    last_positive = (w > 0).int().cumsum(-1).argmax(-1)  # the first index at the final count
    return torch.where(hit.any(-1), hit.int().argmax(-1), last_positive)


def next_tokens(logits: torch.Tensor, sampling: SamplingParams,
                coins: torch.Tensor) -> torch.Tensor:
    """Plain decoding's next token after each row of logits (bs, V): the argmax, or a sample of p
    with each request's coin (core/engine.py: Engine.next_token)."""
    if sampling.greedy:
        return torch.argmax(logits, dim=-1)
    return sample_rows(probs_from_logits(logits, sampling), coins)


class DeviceRandoms:
    """One step's random numbers on the device, one row per request of the bucket:

        coins (bs, n), coin_final (bs,)   SGLang's verify coins (target_only, rejection,
                                          tree_rejection,
                                          typical's final coin)
        uniforms (bs, n-1) float64,       vLLM's rejection sampler: a uniform per draft, the bonus's
          bonus_noise, inv_q (bs, V)      race noise, the recovered tokens' noise
        noise[i] (bs * paths, V)          the draft loop's Exp(1) race noise at level i (sampled
                                          drafts)
        coin64 (bs,) float64              a plain sample's coin (prefill, --algo none, a request
                                          that
                                          drafted nothing)
        worth (bs, K)                     tree_rejection: what each sibling rank was worth
                                          (SiblingStats)
    The shape-dependent buffers (coins, uniforms, noise) are a tier's own (`for_shape`)."""

    def __init__(self, rule: Rule, bs: int, topk: int, vocab: int, samples_drafts: bool,
                 device: torch.device):
        self.rule, self.bs, self.topk, self.vocab = rule, bs, topk, vocab
        self.samples_drafts = samples_drafts
        self.cuda = device.type == "cuda"
        zeros = torch.zeros(bs, device=device)
        self.coin_final, self.coin64 = zeros, zeros.double().clone()
        self.worth = torch.ones(bs, topk, device=device)
        self.bonus_noise, self.inv_q = (torch.ones(2, bs, vocab, device=device)
                                        if rule.name == "vllm" else (None, None))
        self.num_steps, self.n, self.coins, self.uniforms, self.noise = 0, 1, None, None, []

    def for_shape(self, num_steps: int, n: int) -> "DeviceRandoms":
        """These buffers for steps of num_steps draft levels and n nodes (an adaptive tier's own
        coins, uniforms and noise; the rest shared)."""
        out = copy.copy(self)
        device = self.worth.device
        out.num_steps, out.n = num_steps, n
        out.coins = torch.zeros(self.bs, n, device=device)
        out.uniforms = None
        if self.bonus_noise is not None:
            out.uniforms = torch.zeros(self.bs, n - 1, dtype=torch.float64, device=device)
        out.noise = [torch.ones(self.bs * (1 if i == 0 else self.topk), self.vocab, device=device)
                     for i in range(num_steps)] if self.samples_drafts else []
        return out

    def stage_first(self, reqs: list[Request]) -> None:
        """The prefill's draws: each request's first token is a plain sample (its one coin)."""
        self.upload(self.coin64,
                    [float(torch.rand((), generator=r.gen, dtype=torch.float64)) for r in reqs])

    def stage(self, reqs: list[Request], sizes: list[int], greedy: bool,
              worth: torch.Tensor | None = None):
        """A step's host inputs into the buffers before it is launched: tree_rejection's sibling
        worth (bs, K) when given, and each request's draws (`draw`) unless greedy. Returns the
        draws (None when greedy)."""
        if worth is not None:
            self.upload(self.worth, worth)
        return None if greedy else self.draw(reqs, sizes)

    def draw(self, reqs: list[Request], sizes: list[int]) -> list:
        """Each unfinished request's draws for one step of trees of sizes[b] nodes (1: a plain
        sample), from its own generator; into the buffers. Returns them (the trace's record)."""
        V, draws = self.vocab, []
        noise = [[] for _ in self.noise]
        for r, m in zip(reqs, sizes):
            if r.finish_reason:
                draws.append(None)
                for i, level in enumerate(noise):  # a frozen row keeps its place in the buffers
                    level.append(torch.ones(1 if i == 0 else self.topk, V))
            elif m == 1:
                draws.append(float(torch.rand((), generator=r.gen, dtype=torch.float64)))
            else:  # the draft loop's races first, level by level, as propose_children draws them
                for i, level in enumerate(noise):
                    rows = 1 if i == 0 else self.topk
                    level.append(torch.empty(rows, V).exponential_(generator=r.gen))
                draws.append(self.rule.draw(m, V, r.gen))
        for buffer, level in zip(self.noise, noise):
            rows = torch.cat(level) if level else torch.ones(0, V)
            self.upload(buffer, F.pad(rows, (0, 0, 0, buffer.shape[0] - rows.shape[0]), value=1.0))
        self.upload_rule(draws)
        self.upload(self.coin64, [d if isinstance(d, float) else 0.0 for d in draws])
        return draws

    def upload_rule(self, draws: list) -> None:
        """The rule's draws into its buffers (missing rows: a frozen request, or a plain sample)."""
        trees = [d if isinstance(d, Randoms) else None for d in draws]
        n, V = self.n, self.vocab
        if self.bonus_noise is not None:
            for name in ("bonus_noise", "inv_q"):
                self.upload(getattr(self, name),
                            torch.stack([getattr(d, name) if d else torch.ones(V) for d in trees]))
            self.upload(self.uniforms,
                        torch.stack([F.pad(d.uniforms, (0, n - 1 - len(d.uniforms))) if d else
                                                    torch.zeros(n - 1, dtype=torch.float64)
                                                    for d in trees]))
            return
        self.upload(self.coins,
                    [F.pad(d.coins, (0, n - len(d.coins))).tolist() if d is not None
                     and d.coins is not None
                                 # typical draws the final coin only
                                 else [0.0] * n for d in trees])
        self.upload(self.coin_final, [float(d.coin_final) if d else 0.0 for d in trees])

    def upload(self, buffer: torch.Tensor, rows) -> None:
        """Host values (a list or a tensor of rows) into a device buffer (missing rows zero),
        without waiting for the GPU."""
        host = torch.zeros(buffer.shape, dtype=buffer.dtype)
        host[:len(rows)] = torch.as_tensor(rows, dtype=buffer.dtype)
        buffer.copy_(host.pin_memory() if self.cuda else host, non_blocking=True)
