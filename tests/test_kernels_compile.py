"""Every Triton kernel the twins launch compiles for the GPU (sm90), checked on a machine without
one: tests/compile_for_gpu.py runs each wrapper with launches turned into compilations."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
KERNELS = Path(__file__).parents[1] / "spectrace" / "kernels"


def test_every_launched_kernel_compiles_for_sm90():
    launched = {name for path in KERNELS.rglob("*.py") for name in re.findall(r"(_\w+_kernel)\[", path.read_text())}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("compile_for_gpu.py"))], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(done.stdout.split()) == launched
