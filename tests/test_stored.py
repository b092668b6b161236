"The stored CPU runs (01_tp_size, 02_reduce_precision, 03_fp8) on the CPU paths the notebooks' own run does not take."
import os
import subprocess
import sys

import pytest

# `make test` runs the notebooks with one thread a process and the native kernels; here the other kernel paths and two
# threads (a Jupyter session's default on a 2-core machine): on the CSVs' own machine that one is the same bits.
# oneDNN is capped with ATen, as on a CPU that lacks the newer instructions: ATen capped alone on a CPU with AMX packs
# bf16 attention for AMX and stops ("pack_vnni2 is only supported when avx512 is supported")
PATHS = {"avx2 kernels": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
         "default kernels": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
         "two threads": {"OMP_NUM_THREADS": "2"}}


@pytest.mark.parametrize("path", list(PATHS))
def test_stored_runs_pass_on_another_cpu_path(path):
    env = {k: v for k, v in os.environ.items() if k != "QWEN3VL_L50_WRITE_DATA"}   # check, never rewrite
    env |= {"OMP_NUM_THREADS": "1"} | PATHS[path]
    r = subprocess.run([sys.executable, "-m", "qwen3vl_l50_nbdev.analysis", "--stored"], env=env, capture_output=True,
                       text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("the live run reproduces") == 4, r.stdout
