"""vLLM's n-gram proposer ("prompt lookup"): find an earlier occurrence of the context's last n
tokens and propose the k tokens that followed it. No model, no KV.

    v0.8.5 (`NgramProposer.propose`, our default):
        for n = max_n down to min_n:  KMP-search the context for its own last n tokens
                                      (matches must end before the suffix starts);
                                      the FIRST occurrence wins: propose the k tokens after it
        nothing matched -> None (the step is a plain decode)
    current vLLM (`_find_longest_matched_ngram_and_propose_tokens`, --ngram-match longest):
        one KMP pass over the reversed context finds the longest suffix n-gram, n <= max_n, that
        occurs earlier; of its occurrences the EARLIEST wins; fewer than min_n -> no proposal

Example (the v0.8.5 docstring): context [1, 2, 3, 4, 2, 3], min 2, max 3, k 4: [4, 2, 3] never
occurred before, [2, 3] did at index 1, so the proposal is what followed it: [4, 2, 3] (only 3
tokens: the context ends there). vLLM compiles these loops with Numba; they are linear time in
plain Python too.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NgramMatch:
    """Where a proposal came from: the last `n` tokens of the context also occur at
    [start - n, start); the proposal is context[start:start + len(tokens)]."""

    n: int
    start: int
    tokens: list[int]


def kmp_lps_array(pattern) -> list[int]:
    """lps[i]: the length of the longest proper prefix of pattern[:i+1] that is also its suffix."""
    lps = [0] * len(pattern)
    prev_lps, i = 0, 1
    while i < len(pattern):
        if pattern[i] == pattern[prev_lps]:
            prev_lps += 1
            lps[i] = prev_lps
            i += 1
        elif prev_lps != 0:
            prev_lps = lps[prev_lps - 1]  # KMP: fall back to the next shorter border, i stays
        else:
            lps[i] = 0
            i += 1
    return lps


def find_subarray_kmp(context, n: int) -> int | None:
    """v0.8.5 `_find_subarray_kmp` without the slicing: the index right after the first
    occurrence of the last n tokens in context[:len - n], or None."""
    pattern = list(context[-n:])
    lps = kmp_lps_array(pattern)
    i = j = 0
    while i < len(context) - n:
        if context[i] == pattern[j]:
            i += 1
            j += 1
            if j == n:
                return i
        elif j != 0:
            j = lps[j - 1]
        else:
            i += 1
    return None


def propose_first_match(context, min_n: int, max_n: int, k: int,
                        max_model_len: int) -> NgramMatch | None:
    """v0.8.5 `NgramProposer.propose`: longest n first, first occurrence."""
    k = min(k, max_model_len - len(context))
    if k <= 0:
        return None
    for n in range(max_n, min_n - 1, -1):
        start = find_subarray_kmp(context, n)
        if start is not None:
            return NgramMatch(n, start, [int(t) for t in context[start:start + k]])
    return None


def propose_longest_match(tokens, min_n: int, max_n: int, k: int,
                          max_model_len: int) -> NgramMatch | None:
    """Current vLLM: the longest suffix n-gram (<= max_n) with an earlier occurrence, earliest
    occurrence. Reversed, the context's suffixes become prefixes, so one KMP self-match finds
    every earlier occurrence of them at once."""
    L = len(tokens)
    if L < min_n:
        return None
    k = min(k, max_model_len - L)
    if k <= 0:
        return None
    t = list(tokens)[::-1]
    lps = [0] * max_n
    longest = position = prev = 0
    i = 1
    while i < L:
        if t[prev] == t[i]:
            prev += 1
            if prev >= longest:  # '>=': a later i in t is an earlier occurrence in tokens
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:  # n-grams longer than max_n do not count
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return None
    start = L - 1 - position + longest  # the first token after the matched occurrence
    return NgramMatch(longest, start, [int(x) for x in tokens[start:start + min(k, L - start)]])
