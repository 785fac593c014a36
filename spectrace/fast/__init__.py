"""The fast engine (`--backend fast`): the explicit engine's speculative step over the whole batch
on the device, replayed from CUDA graphs, laid out as spectrace/core/ is, file for file:

    engine.py      FastEngine: the host loop (requests, prefill, a step launched ahead, RECORD)
    runner.py      StepRunner: the device half, graph-safe: `step` (draft, verify, accept, commit,
                   extend)
    kv.py          StaticKV: a req_to_token row per request; COMMIT reorders it
    batch.py       forward batches with their attention metadata built on the device
    tree.py        DeviceTree: one step's draft trees, each request's QLEN_ONLY mask rows
    graphs.py      buckets, launch groups and their capture, Tier, StepOutputs, Launched, PhaseClock
    sampling.py    sampling on the device; DeviceRandoms, the host's draws uploaded
    drafters/      one file per drafter, each returning a DeviceTree
    acceptance/    FAST_RULES: one entry per rule, a file where the device form differs
    step_record.py core's step records, rebuilt from a step's tensors
docs/architecture.md holds the table of core, fast and kernels side by side.
"""
