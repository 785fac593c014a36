"""Drafters propose a draft tree (a chain is a tree of topk 1) for the target to verify.

Each lives in its own module and offers `draft_extend_for_prefill`, `draft` (-> tree.DraftTree),
`draft_extend` and `release`.
"""
