"""`spectrace bench --target-shape llama-3.1-8b` (or small), measured: the embedded pair grown to that
shape (spectrace/zoo/grow) and run end to end beside bench.shape_table's prediction.

    grown_pair      runs/grown/<shape>: the target and the drafters the run needs, grown once
    realised_table  the batch lab on the grown pair, then eagle3's realised speed-up beside the
                    step model's at the run's own τ
"""
from __future__ import annotations

from pathlib import Path

from spectrace.algos import ALGOS
from spectrace.measure.bench import Config, Progress, _silent, batch_table, release

GROWN_DIR = Path("runs/grown")


def grown_pair(shape: str, algos: list[str], device: str) -> Path:
    """runs/grown/<shape>: the embedded pair grown to `shape` (spectrace/zoo/grow): the target and
    the drafters of `algos`, each grown (on `device`, in bfloat16) where it is not there yet."""
    from spectrace.zoo import grow

    out = GROWN_DIR / shape
    heads = sorted({grow.head_dir(ALGOS[a].checkpoint) for a in algos if ALGOS[a].checkpoint})
    missing = [h for h in ["target", *heads] if not (out / h / "README.md").is_file()]
    if missing:
        print(f"growing the embedded {', '.join(missing)} to the {shape} shape into {out} (once)", flush=True)
        counts = grow.make(shape, out, [h for h in missing if h != "target"], device=device, target="target" in missing)
        print("; ".join(f"{name} {c['params']:,} parameters, {c['zeros'] / c['params']:.2%} exactly 0"
                        for name, c in counts.items()))
    return out


def run_context(prompts: list[str], max_new_tokens: int) -> int:
    """The mean context of a decode step over the prompts' runs: a prompt and half the new tokens,
    the context at which --target-shape prices the steps it sets beside measured runs."""
    from spectrace.loading.tokenizer import load_tokenizer
    from spectrace.zoo import TARGET_DIR

    tok = load_tokenizer(TARGET_DIR)
    return round(sum(len(tok.encode(p)) for p in prompts) / len(prompts) + max_new_tokens / 2)


def grown_config(config: Config, out: Path) -> Config:
    """config, running the grown target and each algorithm's grown drafter."""
    from spectrace.zoo.grow import head_dir

    def with_grown(**over):
        fmt = ALGOS[over["algo"]].checkpoint
        return config(**{"target_model": str(out / "target"),
                         **({"draft_model": str(out / head_dir(fmt))} if fmt else {}), **over})
    return with_grown


def realised_table(config: Config, out: Path, algos: list[str], prompts: list[str], batch_sizes: list[int],
                   repeat: int, predicted: dict[int, dict[str, float]], progress: Progress = _silent) -> dict:
    """The batch lab (batch_table) on the grown pair in `out`, then EAGLE-3's realised speed-up
    beside the step model's prediction from shape_table's costs at the run's own τ (the grown
    pair's, which in bfloat16 is not bit for bit the embedded pair's). The step model prices
    decode steps: its match is the speed-up of the decode steps alone (each run's prefill and the
    first token it makes left out); end to end, the prefill weighs more in a run that takes fewer
    steps. The drafters load one at a time (an 8B pair's seven would crowd the device)."""
    release(config(algo="none", prompts=[], batch=None, trace=None).device)
    print(f"measured end to end: the grown pair in {out} (the embedded pair at this shape), the prompts above")
    measured = batch_table(grown_config(config, out), algos, prompts, batch_sizes, repeat, progress, one_drafter=True)
    if "eagle3" in algos:
        print(f"{'batch':>5} {'eagle3 tau':>10} {'predicted':>9} {'decoding':>8} {'of predicted':>12} "
              f"{'end to end':>10}")
        for bs in batch_sizes:
            c, (tps, tau, decoding) = predicted[bs], measured[bs]["eagle3"]
            model = tau * c["c_ar"] / (c["c_draft"] + c["c_verify"] + c["c_extend"])
            realised = decoding / measured[bs]["none"][2]
            print(f"{bs:>5} {tau:>10.3f} {model:>8.2f}x {realised:>7.2f}x {realised / model:>11.1%} "
                  f"{tps / measured[bs]['none'][0]:>9.2f}x")
    return measured
