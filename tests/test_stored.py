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
# the quick check (report.stored_runs(quick=True)) unless QWEN3VL_L50_STORED=whole (`make stored`): every stored row
WHOLE = os.environ.get("QWEN3VL_L50_STORED", "quick") == "whole"


@pytest.mark.parametrize("path", list(PATHS))
def test_stored_runs_pass_on_another_cpu_path(path):
    env = {k: v for k, v in os.environ.items() if k != "QWEN3VL_L50_WRITE_DATA"}   # check, never rewrite
    env |= {"OMP_NUM_THREADS": "1"} | PATHS[path]
    args = ["--stored"] + ([] if WHOLE else ["--quick"])
    r = subprocess.run([sys.executable, "-m", "qwen3vl_l50_nbdev.analysis", *args], env=env, capture_output=True,
                       text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("the live run reproduces") == 4, r.stdout
    assert "TP 2: the bf16 and fp32 reductions are the same bits" in r.stdout, r.stdout
    assert WHOLE or r.stdout.count(" of its ") == 4, r.stdout   # the quick check's part of each CSV


# What the stored checks must catch on another machine, each as a patch run before the quick check, and what it says.
# The tensor-parallel code and the sweep are patched where they look the names up; spawn's ranks are forked and
# inherit the patch.
BROKEN = {
    # the bf16 reduction summed in fp32 as if `reduce` were ignored: TP 8's pooled rel L2 moves 11 %
    "ignored bf16 reduce": ("from qwen3vl_l50_nbdev.model import tp; tp.REDUCES['bf16'] = tp.REDUCES['fp32']",
                            "of tp=8 reduce=bf16"),
    # the bf16 model's text rotary at another base, the fp32 reference's right (as 01_tp_size shows it)
    "wrong rope_theta": ("import dataclasses, torch, qwen3vl_l50_nbdev.analysis.sweep as sw\n"
                         "b = sw.build\n"
                         "def build(cfg, group=None, dtype=torch.bfloat16, *a, **k):\n"
                         "    if dtype == torch.bfloat16:\n"
                         "        cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, rope_theta=5e6))\n"
                         "    return b(cfg, group, dtype, *a, **k)\n"
                         "sw.build = build",
                         "of tp=1 reduce=none quant=none"),
    # scale = amax / 896: the largest values overflow e4m3 (as 03_fp8 shows it)
    "FP8 scales one binade off": ("from qwen3vl_l50_nbdev.quant import fp8; fp8.FP8_MAX = 2 * fp8.FP8_MAX",
                                  "quant=fp8-channel-token"),
    # the fp32 reduction from fp32 partials: at TP 2 no longer the bf16 one's bits
    "TP 2 same bits broken": ("import torch; from qwen3vl_l50_nbdev.model import tp\n"
                              "tp.REDUCES['fp32'] = tp.Reduce(torch.float32, torch.float32)",
                              "TP 2: the bf16 reduction is not the fp32 one's bits"),
}


def _fails_on(variant):
    patch, says = BROKEN[variant]
    env = {k: v for k, v in os.environ.items() if k != "QWEN3VL_L50_WRITE_DATA"}
    env |= {"OMP_NUM_THREADS": "1"} | PATHS["avx2 kernels"]   # another machine's kernels: the tolerances, not bits
    code = f"{patch}\nfrom qwen3vl_l50_nbdev.analysis.__main__ import sweep_main\nsweep_main(['--stored', '--quick'])"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode != 0 and says in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    # the rest fail on what another machine may change, not on bits
    assert says.startswith("TP 2") or "another machine: within" in r.stderr, r.stderr[-3000:]


if WHOLE:   # `make stored` only (CI runs it after `make test`): four quick checks more, ~30 s each on 2 cores
    @pytest.mark.parametrize("variant", list(BROKEN))
    def test_quick_check_fails_on_a_broken_variant(variant):
        _fails_on(variant)
