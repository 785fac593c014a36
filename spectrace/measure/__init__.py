"""The measuring commands (`spectrace bench`, `bench kernels`, `tune`), the application layer's
instruments beside the run:

    cli.py       their command-line options and entry points
    bench.py     the batch lab: every algorithm's tokens/s, τ and speed-up, and --target-shape's
                 costs beside the step model's prediction
    grown.py     --target-shape measured end to end on a grown pair (spectrace/zoo/grow)
    hf.py        transformers' generate beside spectrace (--compare-hf)
    kernels.py   each Triton twin timed against its explicit function
    profile.py   --profile: the kernels a step launches, counted and timed by phase
    roofline.py  a forward's bytes against the device's bandwidth
    tune.py      the batch policy: the best shape per batch size, measured
"""
