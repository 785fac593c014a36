"""The `spectrace` command.

    spectrace run --algo eagle --topk 4           a speculative run on the embedded models, then
                                                  its walkthrough (the summary with --no-tui)
    spectrace replay TRACE                        the walkthrough of any trace (no model needed)
    spectrace render TRACE --step N -o tree.svg   a step's draft tree as a Graphviz figure
    spectrace export TRACE -o run.json            the run's phases for Perfetto (or --format csv, jsonl)
    spectrace report TRACE -o run.html            one self-contained page of the run, for a browser
    spectrace rejudge TRACE --acceptance RULE -o NEW.jsonl
                                                  a --record-probs trace's steps judged again
    spectrace bench, spectrace tune               measuring: measure/cli.py (the viewers: cli_view.py)

Every user error (and running out of device memory) is one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from spectrace.algos import ALGOS, DEFAULT_ALGO
from spectrace.measure.cli import add_measure_commands, cmd_bench, cmd_tune, kernels_parser
from spectrace.cli_view import (cmd_export, cmd_rejudge, cmd_render, cmd_replay, cmd_report, refuse_overwriting,
                                report_of)
from spectrace.core.ranges import RANGES, check_ranges
from spectrace.errors import Interrupted, SpectraceError, device_memory_errors
from spectrace.progress import WRITTEN, Progress, on_a_terminal, start_run


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        # no prefix matching: `--speculative-alg` would pass the one-spelling check as another option
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message):  # one line, exit 2, as for every other user error
        self.exit(2, f"{self.prog}: error: {message}\n")


class UsageError(Exception):
    pass


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algo", "--speculative-algorithm", dest="algo", default=None,
                   type=str.lower, choices=list(ALGOS), metavar="ALGO",
                   help=", ".join(f"{a.name} ({a.about})" for a in ALGOS.values()) + "; default standalone")
    p.add_argument("--num-steps", "--speculative-num-steps", dest="num_steps", type=int, default=None,
                   help="tree depth; unset with --topk and --num-draft-tokens: SGLang's automatic choice, "
                        "(5, 4, 8) on a Llama target except for standalone, (3, 1, 4) otherwise")
    p.add_argument("--topk", "--speculative-eagle-topk", dest="topk", type=int, default=None,
                   help="branching of the draft tree; 1 is a chain")
    p.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", dest="num_draft_tokens", type=int,
                   metavar="N", help="tree size, the root included (SGLang's num_draft_tokens)")
    p.add_argument("--speculative-config", dest="speculative_config", default=None, metavar="JSON",
                   help='vLLM\'s form: \'{"method": "eagle", "num_speculative_tokens": 3, "model": DIR}\' (methods '
                        "eagle, eagle3, mtp, ngram, draft_model, dflash, medusa; prompt_lookup_min/max for ngram): "
                        "a chain of k drafts, instead of --algo and the shape options")
    p.add_argument("--acceptance", default=None, type=str.lower,
                   help="greedy, target_only, rejection, vllm, tree_rejection, typical; default greedy at "
                        "temperature 0, else target_only (SGLang's choice)")
    p.add_argument("--speculative-use-rejection-sampling", dest="use_rejection", action="store_true",
                   help="SGLang's spelling of --acceptance rejection")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", dest="top_k", type=int, default=0, help="0: off")
    p.add_argument("--top-p", dest="top_p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="each request draws from its own generator, seeded from this")
    p.add_argument("--speculative-accept-threshold-single", dest="threshold_single", type=float, default=1.0,
                   help="target_only: accept a draft whose target probability reaches this")
    p.add_argument("--speculative-accept-threshold-acc", dest="threshold_acc", type=float, default=1.0,
                   help="target_only: raise the acceptance probability from p to min(1, p / this)")
    p.add_argument("--prompt-lookup-min", dest="prompt_lookup_min", type=int, default=None,
                   help="ngram: shortest suffix n-gram to look up (vLLM; default: --prompt-lookup-max, or 5)")
    p.add_argument("--prompt-lookup-max", dest="prompt_lookup_max", type=int, default=None,
                   help="ngram: longest suffix n-gram, tried first (vLLM; default: --prompt-lookup-min, or 5)")
    p.add_argument("--ngram-match", dest="ngram_match", choices=["first", "longest"], default="first",
                   help="ngram: first = vLLM v0.8.5's proposer (longest n first, first occurrence); longest = "
                        "current vLLM's one-pass longest match")
    p.add_argument("--ngram-style", dest="ngram_style", choices=["vllm", "sglang"], default="vllm",
                   help="ngram: vllm = prompt lookup (a chain); sglang = the trie cache of recent windows (a tree)")
    p.add_argument("--speculative-ngram-match-type", dest="ngram_match_type", choices=["BFS", "PROB"], default="BFS",
                   type=str.upper, help="ngram-style sglang: how the tree is read off the trie")
    p.add_argument("--speculative-ngram-min-bfs-breadth", dest="ngram_min_bfs", type=int, default=1)
    p.add_argument("--speculative-ngram-max-bfs-breadth", dest="ngram_max_bfs", type=int, default=10)
    p.add_argument("--speculative-ngram-max-trie-depth", dest="ngram_trie_depth", type=int, default=18)
    p.add_argument("--speculative-adaptive", "--adaptive", dest="adaptive", action="store_true",
                   help="SGLang's adaptive steps: an EMA of accepted drafts switches the chain length among "
                        "1, 3 and 7 steps (EAGLE family, topk 1)")
    p.add_argument("--batch-policy", dest="batch_policy", default=None, metavar="POLICY",
                   help='the shape by the number of requests, drafting off where it cannot pay: auto (the embedded '
                        'pair\'s, measured), or JSON such as {"1": [5, 4, 8], "16": [2, 1, 3], "64": "off"}')
    p.add_argument("--medusa-choices", dest="medusa_choices", default=None, metavar="FILE",
                   help="medusa: the static tree as a JSON list of rank paths, e.g. [[0], [0, 0], [1]] "
                        "(default: the first 24 paths of Medusa's mc_sim_7b_63)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--commit-style", choices=["sglang", "vllm"], default="sglang",
                   help="how rejected KV is released: sglang remap+free, vllm num_computed_tokens rollback")
    for flag in ("--target-model", "--draft-model"):
        p.add_argument(flag, default=None, metavar="DIR|ORG/NAME", help="a HF checkpoint directory, or a hub name "
                       "read from the local HF cache (never downloaded); docs/models.md lists what loads")
    p.add_argument("--raw-prompt", dest="raw_prompt", action="store_true", help="no chat template: the text as is")
    p.add_argument("--mem-fraction-static", dest="mem_fraction_static", type=float, default=0.9,
                   help="SGLang's: the share of the device's memory the weights and KV caches may fill")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16 (GPU default), float16")
    p.add_argument("--backend", choices=["explicit", "triton", "fast"], default="explicit",
                   help="triton: the hot operations through the Triton twins; fast: the whole batch's step on "
                        "the twins, CUDA graphs on a GPU (every algorithm, adaptive steps included; "
                        "every --acceptance). On a CPU both need TRITON_INTERPRET=1 and float32 or float16")
    p.add_argument("--deterministic", action="store_true",
                   help="batch-invariant verify: every node computed as a one-token decode computes it, so "
                        "greedy output is bit-identical to plain decoding's in any dtype (slower; backends "
                        "explicit and fast)")
    p.add_argument("--trace-level", dest="trace_level", choices=["full", "steps", "off"], default="full",
                   help="full: every step with the top-k of p and q at each node; steps: without the top-k; "
                        "off: no trace")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spectrace")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="spectrace", description="Step-through speculative decoding.")
    ap.add_argument("--version", action="version", version=f"spectrace {_version()}")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="generate with a speculative algorithm and write a trace")
    _add_run_options(run)
    run.add_argument("--prompt", action="append", default=[], help="may be repeated")
    run.add_argument("--batch", type=int, default=None,
                     help="number of requests; built-in held-out prompts fill up what --prompt leaves")
    run.add_argument("--trace", default=None, metavar="PATH", help="default: runs/<time>-<algo>.jsonl")
    run.add_argument("--no-tui", action="store_true", help="print the text and metrics, no walkthrough")
    run.add_argument("--record-probs", dest="record_probs", action="store_true",
                     help="keep every step's target and draft distributions and random numbers in a sidecar "
                          "beside the trace (TRACE.probs.safetensors), for spectrace rejudge")
    run.add_argument("--report", metavar="FILE.html", help="also write the run's report page (spectrace report)")
    replay = sub.add_parser("replay", help="open the walkthrough of a trace")
    replay.add_argument("trace", metavar="TRACE")
    render = sub.add_parser("render", help="draw a step's draft tree with Graphviz")
    render.add_argument("trace", metavar="TRACE")
    render.add_argument("--step", type=int, default=None, help="decode step number (the trace's `step`)")
    render.add_argument("--request", type=int, default=None, help="request of that step (default: the first)")
    render.add_argument("--all", action="store_true", help="every step: OUT's name gets -step<N>-req<R>")
    render.add_argument("-o", "--out", required=True, metavar="FILE", help="FILE.svg, FILE.png or FILE.dot")
    report = sub.add_parser("report", help="one self-contained HTML page of a trace, to open in a browser")
    report.add_argument("trace", metavar="TRACE")
    report.add_argument("-o", "--out", required=True, metavar="FILE.html")
    export = sub.add_parser("export", help="a trace's phases as a Perfetto / chrome://tracing timeline, or CSV; "
                                           "or the whole trace in one JSON Lines file")
    export.add_argument("trace", metavar="TRACE")
    export.add_argument("--format", choices=["perfetto", "csv", "jsonl"], default="perfetto", help="perfetto: "
                        "Chrome trace-event JSON (open in ui.perfetto.dev); csv: a row per step and request; "
                        "jsonl: every step record a line, no frames file beside it")
    export.add_argument("-o", "--out", required=True, metavar="FILE")
    rejudge = sub.add_parser("rejudge", help="every recorded step judged again under another acceptance rule, "
                                             "thresholds, temperature or random numbers (needs --record-probs)")
    rejudge.add_argument("trace", metavar="TRACE")
    rejudge.add_argument("--acceptance", required=True, type=str.lower,
                         help="greedy, target_only, rejection, vllm, tree_rejection, typical")
    for which in ("single", "acc"):
        rejudge.add_argument(f"--speculative-accept-threshold-{which}", dest=f"threshold_{which}", type=float,
                             help="target_only (default: the recorded value under target_only, else 1.0)")
    rejudge.add_argument("--temperature", type=float, default=None, help="default: the recorded temperature")
    rejudge.add_argument("--seed", type=int, default=None,
                         help="default: the recorded random numbers where the rule draws the same kind, else "
                              "fresh ones from the recorded seed; another seed: fresh ones")
    rejudge.add_argument("-o", "--out", required=True, metavar="NEW.jsonl")
    add_measure_commands(sub, _add_run_options)
    return ap


SPECULATIVE_CONFIG_REPLACES = {"algo": "--algo", "num_steps": "--num-steps", "topk": "--topk",
                               "num_draft_tokens": "--num-draft-tokens", "draft_model": "--draft-model",
                               "prompt_lookup_min": "--prompt-lookup-min", "prompt_lookup_max": "--prompt-lookup-max",
                               "medusa_choices": "--medusa-choices"}


def _apply_speculative_config(args) -> None:
    """vLLM's --speculative-config (spectrace/speculative_config.py) sets the algorithm and shape;
    given beside the options it replaces, it is refused rather than merged."""
    from spectrace.speculative_config import parse

    options = parse(args.speculative_config)
    given = [flag for dest, flag in SPECULATIVE_CONFIG_REPLACES.items() if getattr(args, dest, None) is not None]
    if given:
        raise UsageError(f"--speculative-config sets the algorithm and its shape: drop {given[0]}")
    for dest, value in options.items():
        setattr(args, dest, value)
    if args.command == "bench":  # the configured drafter against plain decoding
        args.algos = ["none", options["algo"]]


# options that only some algorithms read: (the flags, which algorithms, what they do, what the others do not)
ALGORITHM_OPTIONS = [
    ({"--medusa-choices"}, lambda a: a == "medusa", "shapes Medusa's tree", "does not draft one"),
    ({"--prompt-lookup-min", "--prompt-lookup-max", "--ngram-match", "--ngram-style",
      "--speculative-ngram-match-type", "--speculative-ngram-min-bfs-breadth",
      "--speculative-ngram-max-bfs-breadth", "--speculative-ngram-max-trie-depth"},
     lambda a: a == "ngram", "shapes the n-gram drafter", "does not look up n-grams"),
    ({"--draft-model"}, lambda a: a not in ("none", "ngram"), "names the draft model", "drafts without one"),
    ({"--num-steps", "--speculative-num-steps", "--topk", "--speculative-eagle-topk", "--num-draft-tokens",
      "--speculative-num-draft-tokens", "--speculative-adaptive", "--adaptive", "--acceptance",
      "--speculative-use-rejection-sampling", "--speculative-accept-threshold-single",
      "--speculative-accept-threshold-acc"}, lambda a: a != "none", "shapes or judges the drafts", "drafts nothing"),
]


# the n-gram options each --ngram-style reads: vLLM's prompt lookup, SGLang's trie
NGRAM_STYLE_OPTIONS = {"vllm": {"--prompt-lookup-min", "--prompt-lookup-max", "--ngram-match"},
                       "sglang": {"--speculative-ngram-match-type", "--speculative-ngram-min-bfs-breadth",
                                  "--speculative-ngram-max-bfs-breadth", "--speculative-ngram-max-trie-depth"}}


def _check_supported(args) -> None:
    """Options whose machinery arrives in later work are refused, not ignored."""
    if args.command in ("replay", "render", "export", "rejudge", "report"):
        return
    if args.topk == 1 and args.num_draft_tokens is not None and args.num_steps is not None \
            and args.num_draft_tokens != args.num_steps + 1:
        # SGLang: topk 1 forces num_draft_tokens = num_steps + 1, with a warning
        print(f"spectrace: warning: topk 1 forces --num-draft-tokens to num_steps + 1 = {args.num_steps + 1}",
              file=sys.stderr)
    algos = args.algos if args.command in ("bench", "tune") else [args.algo or DEFAULT_ALGO]
    for flags, algo, what, others in ALGORITHM_OPTIONS:  # refused where no algorithm reads them, as SGLang refuses
        named = sorted(flag for flag in args.given if flag in flags)  # mismatched flags
        if named and not any(algo(a) for a in algos):
            raise UsageError(f"{named[0]} {what}; --algo {' '.join(algos)} {others}")
    sampling = sorted(flag for flag in ("--top-k", "--top-p") if flag in args.given)
    if sampling and args.temperature == 0:
        raise UsageError(f"{sampling[0]} shapes sampling; at --temperature 0 decoding is greedy and reads none: "
                         "give --temperature > 0")
    style = getattr(args, "ngram_style", "vllm")
    other = sorted(f for st, flags in NGRAM_STYLE_OPTIONS.items() if st != style for f in flags if f in args.given)
    if other and "ngram" in algos:
        raise UsageError(f"{other[0]} shapes the other n-gram drafter; --ngram-style {style} does not read it")
    if args.use_rejection:
        if args.acceptance not in (None, "rejection"):
            raise UsageError(f"--speculative-use-rejection-sampling contradicts --acceptance {args.acceptance}")
        args.acceptance = "rejection"


def _check_ranges(args) -> None:
    """The numbers a run takes, before torch loads (SpecConfig and RunConfig check them again when
    made); the tree's, where an algorithm drafts."""
    if args.command not in ("run", "bench", "tune"):
        return
    algos = args.algos if args.command in ("bench", "tune") else [args.algo or DEFAULT_ALGO]
    tree = ("num_steps", "topk") if any(a != "none" for a in algos) else ()
    check_ranges(**{name: getattr(args, name) for name in RANGES if hasattr(args, name)
                    and (name in tree or name not in ("num_steps", "topk"))})


def _run_config(args, **over):
    from spectrace.core.ngram.trie import TrieConfig
    from spectrace.run import RunConfig

    kw = dict(record_probs=getattr(args, "record_probs", False), algo=args.algo or DEFAULT_ALGO,
              num_steps=args.num_steps, topk=args.topk,
              num_draft_tokens=args.num_draft_tokens,
              max_new_tokens=args.max_new_tokens, acceptance=args.acceptance, temperature=args.temperature,
              top_k=args.top_k, top_p=args.top_p, seed=args.seed, threshold_single=args.threshold_single,
              threshold_acc=args.threshold_acc, prompt_lookup_min=args.prompt_lookup_min,
              prompt_lookup_max=args.prompt_lookup_max, ngram_match=args.ngram_match, adaptive=args.adaptive,
              batch_policy=args.batch_policy,
              medusa_choices=args.medusa_choices, ngram_style=args.ngram_style,
              ngram_trie=TrieConfig(min_bfs_breadth=args.ngram_min_bfs, max_bfs_breadth=args.ngram_max_bfs,
                                    match_type=args.ngram_match_type, branch_length=args.ngram_trie_depth),
              commit_style=args.commit_style,
              device=args.device, dtype=args.dtype, backend=args.backend, trace_level=args.trace_level,
              deterministic=args.deterministic, raw_prompt=args.raw_prompt,
              mem_fraction_static=args.mem_fraction_static)
    if args.target_model:
        kw["target_model"] = args.target_model
    if args.draft_model:
        kw["draft_model"] = args.draft_model
    kw.update(over)
    return RunConfig(**kw)


def cmd_run(args) -> int:
    if args.report and args.trace_level == "off":
        raise UsageError("--report draws the run's trace: drop --trace-level off")
    if args.report and args.trace:
        refuse_overwriting(args.report, args.trace, "--report")
    progress = Progress(args.max_new_tokens * max(len(args.prompt), args.batch or 1))
    if not (args.no_tui or args.trace_level == "off" or progress.lines) and on_a_terminal():
        progress.say("opening the walkthrough")  # the app first; the run loads in a child behind it
        from spectrace.core.trace import default_trace_path

        trace = args.trace or str(default_trace_path(args.algo or DEFAULT_ALGO))
        child = start_run(args.argv, trace)
        from spectrace.viz.tui.live import walk_a_live_run

        try:
            code = walk_a_live_run(child, trace, "run " + " ".join(args.argv))
        finally:
            progress.done()
        return report_of(trace, args.report) if args.report and code == 0 else code
    progress.say("loading torch")
    from spectrace.run import run
    from spectrace.viz.text import run_summary

    try:
        # counting tokens needs each step's record; the fast engine would then copy every step's
        # tensors to the host, so it shows its status line without the count
        on_step = progress.step if progress.live and args.backend != "fast" else None
        result = run(_run_config(args, prompts=args.prompt, batch=args.batch, trace=args.trace), on_step,
                     progress.say)
        progress.say(WRITTEN)
    finally:
        progress.done()
    print(run_summary(result, result.spec.algo, args.backend))
    return report_of(result.trace_path, args.report) if args.report else 0


def _check_one_spelling(parser: argparse.ArgumentParser, args) -> None:
    """An option spelled two ways (spectrace's name and SGLang's, e.g. --algo and
    --speculative-algorithm) is one setting: given under both names, the run is refused rather than
    the last one silently winning."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    command = subparsers[0].choices.get(getattr(args, "command", None)) if subparsers else None
    for action in (command or parser)._actions:
        both = [o for o in action.option_strings if o in args.given]
        if len(both) > 1:
            raise UsageError(f"{' and '.join(both)} are one option (SGLang's name and spectrace's): give it once")


def _terminated(signum, frame):
    """SIGTERM (kill, a job scheduler) stops a run as Ctrl-C does: the steps so far and their
    --record-probs sidecar are kept."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    from spectrace.core.trace import TraceError

    given = list(sys.argv[1:] if argv is None else argv)
    if given[:2] == ["bench", "kernels"] and {"-h", "--help"} & set(given):
        kernels_parser().print_help()
        return 0
    parser = build_parser()
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.given = {a.split("=")[0] for a in args.argv if a.startswith("--")}
    try:
        _check_one_spelling(parser, args)
        if getattr(args, "speculative_config", None) is not None:
            _apply_speculative_config(args)
        _check_supported(args)
        _check_ranges(args)
        if args.command in ("bench", "tune"):
            return (cmd_bench if args.command == "bench" else cmd_tune)(args, _run_config)
        return {"run": cmd_run, "replay": cmd_replay, "render": cmd_render, "export": cmd_export,
                "rejudge": cmd_rejudge, "report": cmd_report}[args.command](args)
    except (UsageError, SpectraceError, TraceError, *device_memory_errors()) as e:
        print(f"spectrace: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        where = f"; {e.trace_path} holds every step finished so far" if isinstance(e, Interrupted) else ""
        print(f"spectrace: interrupted{where}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop as a Unix filter does, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit cannot fail again
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
