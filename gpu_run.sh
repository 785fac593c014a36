#!/bin/bash
# device script (untracked): the fast engine's GPU tests, then DFLASH's benchmark
python3 -m pytest tests/test_gpu.py tests/test_fused.py -q -k "fast or deterministic or silu" -p no:cacheprovider 2>&1 | tail -15 > $OUT/tests.txt
B="python3 -m spectrace bench --device cuda --backend fast --trace-level off --repeat 1"
$B --algos none eagle dflash > $OUT/bench_dflash.txt 2>&1
for f in $OUT/*.txt; do echo "== $f"; tail -n 6 $f; done
