"""The measuring commands of `spectrace` (cli.py's other half): their options and what they run.

    spectrace bench                               tokens/s and tau of algorithms on a prompt set
    spectrace bench --batch-sizes 1 2 4 8         the same at each batch size, with speed-ups over none
    spectrace bench kernels --device cuda         each Triton twin against the explicit path
    spectrace tune --algos eagle3 --batch-sizes 1 8 64 -o policy.json
                                                  the batch policy of a target, drafter and device

Torch-free at import, as cli.py is: the parser is built before any model work. Errors are
SpectraceErrors: one line, exit code 2.
"""
from __future__ import annotations

import json
from pathlib import Path

from spectrace.algos import ALGOS
from spectrace.errors import SpectraceError
from spectrace.progress import Progress


def add_measure_commands(sub, add_run_options) -> None:
    bench = sub.add_parser("bench", help="tokens/s and tau of algorithms on the held-out prompts, "
                                         "or (bench kernels) the Triton twins against the explicit path")
    bench.add_argument("what", nargs="?", choices=["algos", "kernels"], default="algos")
    tune = sub.add_parser("tune", help="measure tau and step costs of draft shapes by batch size, and write the "
                                       "batch policy that --batch-policy FILE reads")
    for p in (bench, tune):
        add_run_options(p)
        p.add_argument("--algos", nargs="+", default=["none", "standalone"] if p is bench else ["eagle3"],
                       choices=list(ALGOS), metavar="ALGO", help=f"algorithms: {', '.join(ALGOS)}")
        p.add_argument("--repeat", type=int, default=3, help="timed runs (the best is kept)")
        p.add_argument("--batch-sizes", dest="batch_sizes", type=int, nargs="+", default=None, metavar="B",
                       help="bench: the batch-scaling lab, each algorithm and none at each batch size (prompts "
                            "cycled); tune: the batch sizes the policy has an entry for")
        p.add_argument("--prompt-set", dest="prompt_set", choices=["heldout", "repeating"], default="heldout",
                       help="heldout: the 8 held-out prompts; repeating: code that repeats itself (n-gram's case)")
        p.add_argument("--prompts", dest="prompts_file", metavar="FILE",
                       help="the prompts instead: one a line, or JSON Lines with a \"prompt\" field")
        # speed rows time runs without a trace; --trace-level full or steps adds a column: what recording costs
        p.set_defaults(trace_level="off")
    bench.add_argument("--compare-hf", dest="compare_hf", action="store_true",
                       help="also transformers' generate, its static-cache compiled decode, assisted generation and "
                            "prompt lookup on the same prompts and models")
    bench.add_argument("--target-shape", dest="target_shape", metavar="NAME",
                       help="llama-3.1-8b, llama-3.2-1b, qwen3-8b, qwen3-0.6b, small (the grown pair's CPU size) or "
                            "embedded: with --batch-sizes, "
                            "eagle3's predicted speed-up at that model's shape (costs with random weights, the "
                            "embedded pair's tau), and for llama-3.1-8b and small the speed-up measured end to end on the "
                            "grown pair (the embedded pair at that shape; --algos, default eagle3)")
    bench.add_argument("--random-weights", dest="random_weights", action="store_true",
                       help="with --target-shape: the prediction only, no grown pair")
    bench.add_argument("--profile", action="store_true",
                       help="kernels per step, phase by phase, and the most frequent ones (--backend fast): measured "
                            "with torch.profiler on a GPU, counted as the code runs interpreted on a CPU; with "
                            "--target-shape, each batch size's decode forward, verify and EAGLE-3 draft level by kernel group "
                            "against the roofline")
    bench.add_argument("--json", metavar="FILE", help="with --profile: write its numbers to FILE as JSON")
    tune.add_argument("--shapes", nargs="+", default=None, metavar="S,K,N",
                      help="candidate (num_steps, topk, num_draft_tokens) shapes (default: chains of 1 to 7 steps "
                           "and the trees (4,2,6), (5,4,8), (6,8,16))")
    tune.add_argument("--cost-tokens", dest="cost_tokens", type=int, default=16,
                      help="new tokens a request makes in the runs that measure step costs")
    tune.add_argument("--sweep", action="store_true",
                      help="also run every shape end to end at every batch size, and set the choice beside the best")
    tune.add_argument("-o", "--out", required=True, metavar="POLICY.json")


def kernels_parser():
    """`spectrace bench kernels --help`: the one option the kernel table reads."""
    import argparse

    p = argparse.ArgumentParser(prog="spectrace bench kernels", allow_abbrev=False,
                                description="each Triton twin timed against its explicit function, at the "
                                            "embedded pair's and Llama-3.1-8B's shapes (on a CPU: small shapes, "
                                            "interpreted, to see the table work)")
    p.add_argument("--device", default="cpu", help="cuda to measure; cpu needs TRITON_INTERPRET=1")
    return p


def read_prompts(path: str) -> list[str]:
    """--prompts FILE: a prompt a non-empty line, or JSON Lines whose objects hold a "prompt"
    string (the shape of SGLang's and vLLM's benchmark datasets), for prompts of several lines."""
    try:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise SpectraceError(f"--prompts {path}: {getattr(e, 'strerror', None) or e}") from None
    if not lines:
        raise SpectraceError(f"--prompts {path}: no prompt in it")
    if not all(line.lstrip().startswith("{") for line in lines):
        return lines
    prompts = []
    for i, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpectraceError(f"--prompts {path} line {i}: not JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"]:
            raise SpectraceError(f'--prompts {path} line {i}: no "prompt" string')
        prompts.append(record["prompt"])
    return prompts


def prompt_set(args) -> tuple[str, list[str]]:
    """(its name, the prompts) of --prompts FILE, else of --prompt-set."""
    from spectrace.zoo.prompts import HELD_OUT_PROMPTS, REPEATING_PROMPTS

    if args.prompts_file is not None:
        return args.prompts_file, read_prompts(args.prompts_file)
    return ("repeating-code", REPEATING_PROMPTS) if args.prompt_set == "repeating" else ("held-out", HELD_OUT_PROMPTS)


def check_counts(args) -> None:
    if args.repeat < 1:
        raise SpectraceError(f"--repeat must be at least 1, got {args.repeat}")
    if args.batch_sizes and min(args.batch_sizes) < 1:
        raise SpectraceError(f"--batch-sizes must each be at least 1, not {min(args.batch_sizes)}")


def cmd_bench(args, run_config) -> int:
    """spectrace/measure/bench.py: each prompt of the set alone (batch 1), or every batch size of
    --batch-sizes; best wall time of --repeat runs. `bench kernels`: spectrace/measure/kernels.py."""
    check_counts(args)
    if args.what == "kernels":
        ignored = sorted(f for f in args.given if f != "--device")
        if ignored:
            raise SpectraceError(f"bench kernels reads only --device, not {ignored[0]} (spectrace bench kernels --help)")
        from spectrace.kernels import require
        from spectrace.run import check_gpu
        check_gpu(args.device)
        require(args.device)
        from spectrace.measure.kernels import bench_kernels
        if args.device.startswith("cuda"):
            bench_kernels(args.device)
        else:  # interpreted: small shapes, to see the table work, not to measure
            bench_kernels(args.device, batch_sizes=(1, 8), vocabs=(4096,), prefix=256, layers=4, hidden=256,
                          intermediate=704)
        return 0
    if args.json and not args.profile:
        raise SpectraceError("--json writes --profile's numbers: add --profile")
    if args.profile and args.backend != "fast":
        raise SpectraceError("--profile counts the fast engine's kernels: add --backend fast")
    from spectrace.measure import bench, grown as grown_pairs, hf

    name, prompts = prompt_set(args)
    batches = f"batch sizes {' '.join(map(str, args.batch_sizes))}" if args.batch_sizes else "batch 1"
    recording = f" (recording cost: --trace-level {args.trace_level})" if args.trace_level != "off" else ""
    sampling = (f"temperature {args.temperature}, acceptance {args.acceptance or 'target_only'}, seed {args.seed}"
                if args.temperature else "greedy")
    print(f"{name} prompts: {len(prompts)}, max_new_tokens {args.max_new_tokens}, device {args.device}, backend "
          f"{args.backend}, timed without a trace{recording}, {batches}, {sampling}")

    record_level, args.trace_level = args.trace_level, "off"  # every speed row runs untraced
    policy, args.batch_policy = args.batch_policy, None  # a column of its own beside the fixed shapes
    if policy is not None and not args.batch_sizes:
        raise SpectraceError("--batch-policy adds a column to the batch lab: add --batch-sizes")

    def config(**over):
        return run_config(args, **over)
    if args.target_shape and args.backend == "fast" and not args.device.startswith("cuda"):
        raise SpectraceError("--target-shape times the fast engine's forwards as CUDA graphs: add --device cuda "
                             "(or --backend explicit)")
    if args.profile and not args.target_shape:
        from spectrace.measure.profile import profile_table
        profile_table(config, args.algos, prompts, args.device, args.json, Progress(0).say)
        return 0
    if args.random_weights and not args.target_shape:
        raise SpectraceError("--random-weights chooses --target-shape's weights: add --target-shape")
    if args.target_shape:
        from spectrace.zoo.grow import PLANS

        algos = args.algos if "--algos" in args.given else ["eagle3"]
        grown = None
        if args.target_shape in PLANS and not args.random_weights:
            grown = grown_pairs.grown_pair(args.target_shape, algos, args.device)
        sizes = args.batch_sizes or [1]
        kv_len = grown_pairs.run_context(prompts, args.max_new_tokens) if grown else 1024  # priced where runs decode
        table = bench.shape_table(config, args.target_shape, sizes, args.repeat, kv_len, prompts=prompts,
                                  profile=args.profile, grown=grown)
        if grown:
            grown_pairs.realised_table(config, grown, algos, prompts, sizes, args.repeat, table, Progress(0).say)
        return 0
    if args.batch_sizes:
        bench.batch_table(config, args.algos, prompts, args.batch_sizes, args.repeat, Progress(0).say, policy,
                          record_level)
        return 0
    progress = Progress(0).say  # prompts x algorithms on stderr, when it is a terminal
    hf = hf.hf_table(config, prompts, args.repeat, progress) if args.compare_hf else None
    tables = {}
    if hf and args.backend != "explicit":  # the reference engine beside the kernels, in the same run
        print("spectrace, --backend explicit:")
        tables["explicit"] = bench.algos_table(lambda **o: run_config(args, **{"backend": "explicit", **o}),
                                               args.algos, prompts, args.repeat, progress, record_level)
        print(f"spectrace, --backend {args.backend}:")
    tables[args.backend] = bench.algos_table(config, args.algos, prompts, args.repeat, progress, record_level)
    if hf:
        for backend, ours in tables.items():
            for algo, outs in ours.items():
                same = sum(a == b for a, b in zip(outs, hf["hf generate"]))
                print(f"spectrace {algo} ({backend}): same tokens as hf generate on {same} of {len(prompts)} prompts")
    return 0


def cmd_tune(args, run_config) -> int:
    """spectrace/measure/tune.py: tau per shape, step costs per batch size, the policy, then confirmed."""
    check_counts(args)
    algos = [a for a in args.algos if a != "none"]
    if len(algos) != 1:
        raise SpectraceError("tune writes one algorithm's policy: give one --algos (none is always measured)")
    from spectrace.measure import tune
    from spectrace.batch_policy import APPLIES_TO

    if algos[0] not in APPLIES_TO:
        raise SpectraceError(f"--algos {algos[0]}: its drafter fixes its own shape; tune shapes {', '.join(APPLIES_TO)}")
    if args.cost_tokens < 2:
        raise SpectraceError(f"--cost-tokens must be at least 2, got {args.cost_tokens}")
    name, prompts = prompt_set(args)
    shapes = tune.parse_shapes(args.shapes) if args.shapes else tune.DEFAULT_SHAPES
    args.batch_policy = None
    tune.tune(lambda **o: run_config(args, **o), algos[0], args.batch_sizes or [1], shapes, prompts, args.cost_tokens,
              args.repeat, Path(args.out), Progress(0).say, f"{name} prompts", args.sweep)
    return 0
