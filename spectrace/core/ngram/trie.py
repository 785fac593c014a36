"""SGLang's n-gram cache (--algo ngram --ngram-style sglang): a trie of recent token windows,
shared by every request, from which each step builds a draft tree (sgl-kernel's `ngram.cpp`).

    insert (after prefill and after every verify): the last `branch_length` tokens of each
        request's prompt + output; every suffix of that window, capped at branch_length tokens,
        walks down from the root, creating nodes or raising their `freq`, and moves each touched
        child to the front of its parent's LRU list
    match: the context's last w tokens, for w = max_window down to min_window, walked from the
        root; each full walk is an anchor (the trie node after them): longest first
    BFS ("recency"): from each anchor, a breadth-first copy of the trie below it into the tree,
        taking each node's most recently used children; breadth starts at
        (max_window - w) * scale + min_bfs (longer matches go narrow and deep) and shrinks by
        scale = (max_bfs - min_bfs) / (max_window - min_window + 1) per level
    PROB ("frequency"): a max-heap on path probability, each child scored by its share of its
        siblings' freq (the first max_bfs by freq, then token)
    the tree: root = the last context token, then up to n - 1 nodes, equal tokens under one
        parent merged; written out breadth first (children in insertion order: the C++ code
        iterates an unordered_map, whose order is unspecified) and padded with token 0 under
        the root up to n, as SGLang pads; the mask holds each node's root, ancestors and itself
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from spectrace.errors import SpectraceError


@dataclass(frozen=True)
class TrieConfig:
    """SGLang's NGRAM defaults (server args `speculative_ngram_*`)."""

    min_match_window_size: int = 1
    max_match_window_size: int = 12
    min_bfs_breadth: int = 1
    max_bfs_breadth: int = 10
    match_type: str = "BFS"  # or "PROB"
    branch_length: int = 18  # max_trie_depth
    capacity: int = 10_000_000  # trie nodes; the least recently used leaves go first

    def __post_init__(self):
        """ngram.cpp's Param checks, as one clear line."""
        if not (self.branch_length > 1
                and 0 < self.min_match_window_size <= self.max_match_window_size
                < self.branch_length and 0 < self.min_bfs_breadth <= self.max_bfs_breadth
                and self.match_type in ("BFS", "PROB") and self.capacity > 0):
            raise SpectraceError(f"SGLang's n-gram needs max_trie_depth > 1, 0 < min "
                                 f"window <= max window < max_trie_depth, 0 < min bfs "
                                 f"breadth <= max, match type BFS or PROB: got {self}")


@dataclass(eq=False)
class TrieNode:
    token: int
    parent: "TrieNode | None" = None
    freq: int = 0
    children: dict[int, "TrieNode"] = field(default_factory=dict)
    lru: list["TrieNode"] = field(default_factory=list)  # children, most recently used first
    stamp: int = 0  # global recency: larger is more recent

    def sorted_children(self) -> list["TrieNode"]:
        return sorted(self.children.values(), key=lambda c: (-c.freq, c.token))


@dataclass
class Proposal:
    tokens: list[int]  # n tokens, root first, padded with 0
    parents: list[int]  # parent row of each node (the root's is -1)
    real: int  # nodes that came from the trie, root included
    anchors: list[int]  # the match lengths w that found the trie, longest first


class NgramTrie:
    def __init__(self, config: TrieConfig = TrieConfig()):
        self.config = config
        self.root = TrieNode(-1)
        self.size = 0  # nodes below the root
        self._clock = itertools.count(1)

    # ---- building the cache ------------------------------------------------------------------
    def insert(self, tokens: list[int]) -> None:
        c = self.config
        i = 0
        while i + c.min_match_window_size < len(tokens):
            path = tokens[i:i + min(len(tokens) - i, c.branch_length)]
            self._squeeze(len(path))
            cursor, touched = self.root, []
            for tok in path:
                child = cursor.children.get(tok)
                if child is None:
                    child = cursor.children[tok] = TrieNode(tok, cursor, 1)
                    self.size += 1
                else:
                    child.freq += 1
                    cursor.lru.remove(child)
                cursor.lru.insert(0, child)
                touched.append(child)
                cursor = child
            for node in reversed(touched):  # deepest first, so the shallowest ends most recent
                node.stamp = next(self._clock)
            i += 1

    def _squeeze(self, need: int) -> None:
        """Evict least recently used leaves until `need` more nodes fit."""
        while self.size + need > self.config.capacity and self.size:
            leaf = min(self._leaves(), key=lambda n: n.stamp)
            del leaf.parent.children[leaf.token]
            leaf.parent.lru.remove(leaf)
            self.size -= 1

    def _leaves(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self.root:
                yield node
            stack += node.children.values()

    # ---- proposing a tree ----------------------------------------------------------------------
    def match(self, context: list[int]) -> list[tuple[TrieNode, int]]:
        """Anchors (trie node after the context's last w tokens, w), longest w first."""
        c = self.config
        context = context[-c.max_match_window_size:]
        anchors = []
        for w in range(min(len(context), c.max_match_window_size), c.min_match_window_size - 1, -1):
            node = self.root
            for tok in context[len(context) - w:]:
                node = node.children.get(tok)
                if node is None:
                    break
            else:
                anchors.append((node, w))
        return anchors

    def propose(self, context: list[int], num_draft_tokens: int) -> Proposal:
        """The draft tree after `context` (its last token is the root), n nodes in all."""
        c, m = self.config, num_draft_tokens - 1
        anchors = self.match(context)
        tree_tokens, nexts, parents = [context[-1]], [{}], [-1]

        def place(parent: int, token: int) -> int:  # equal tokens under one parent share a node
            if token not in nexts[parent]:
                nexts[parent][token] = len(tree_tokens)
                tree_tokens.append(token)
                nexts.append({})
                parents.append(parent)
            return nexts[parent][token]

        if c.match_type == "BFS":
            scale = (c.max_bfs_breadth - c.min_bfs_breadth) / (c.max_match_window_size
                                                               - c.min_match_window_size + 1)
            for anchor, w in anchors:
                queue = deque([(0, (c.max_match_window_size - w) * scale + c.min_bfs_breadth,
                                anchor)])
                while queue and len(tree_tokens) <= m:
                    parent, breadth, tnode = queue.popleft()
                    for child in tnode.lru[:max(1, int(breadth))]:
                        if len(tree_tokens) > m:
                            break
                        queue.append((place(parent, child.token), breadth - scale, child))
        else:
            heap, order = [], itertools.count()  # ties pop in push order

            def add(parent: int, tnode: TrieNode, prob: float) -> None:
                kids = tnode.sorted_children()[:c.max_bfs_breadth]
                total = sum(k.freq for k in kids)
                for k in kids:
                    heapq.heappush(heap, (-prob * k.freq / total, next(order), parent, k))

            for anchor, _ in anchors:
                add(0, anchor, 1.0)
                while heap and len(tree_tokens) <= m:
                    neg, _, parent, tnode = heapq.heappop(heap)
                    add(place(parent, tnode.token), tnode, -neg)
        # breadth-first order over the merged tree, then padding
        order, rows = [0], {}
        for node in order:
            order += list(nexts[node].values())
        for row, node in enumerate(order):
            rows[node] = row
        tokens = [tree_tokens[node] for node in order]
        prev = [-1] + [rows[parents[node]] for node in order[1:]]
        real = len(tokens)
        tokens += [0] * (num_draft_tokens - real)
        prev += [0] * (num_draft_tokens - real)
        return Proposal(tokens, prev, real, [w for _, w in anchors])
