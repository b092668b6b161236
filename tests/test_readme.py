"Every shell line of the README runs as written (its Python cells run in CI as nbs/index.ipynb, through nbdev_test)."
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from qwen3vl_l50_nbdev.config import EncoderConfig
from qwen3vl_l50_nbdev.tiny import synthetic_inputs

ROOT = Path(__file__).resolve().parents[1]
SELF = {"make test": "this test is part of it", "make docs": "make test runs it"}   # not run from here
BIN = Path(sys.executable).parent   # the venv's qwen3vl-l50 and torchrun
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}


def readme_commands() -> list[str]:
    "The commands of the README's ```sh blocks, one per line, comments dropped, in order."
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for b in blocks for line in b.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_has_commands():
    cmds = readme_commands()
    assert any(c.startswith("qwen3vl-l50 ") for c in cmds) and any(c.startswith("torchrun ") for c in cmds), cmds
    assert "make demo" in cmds and "make test" in cmds


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory):
    "The README's file names, made real in a temp dir: its tiny checkpoint, inputs files, an output."
    d = tmp_path_factory.mktemp("readme")
    made = [shlex.split(c)[-1] for c in readme_commands() if c.startswith("qwen3vl-l50 make-tiny")]
    assert made, "the README makes no tiny checkpoint"
    names = {m: str(d / Path(m).name) for m in made} | {"OUT.safetensors": str(d / "out.safetensors")}
    names |= {f"{n}.safetensors": str(d / f"{n}.safetensors") for n in ("IN", "A", "B")}
    return d, names


def _inputs(ckpt: Path, names: dict):
    "The inputs files, for the first checkpoint the README makes (written once it exists)."
    cfg = EncoderConfig.from_hf(ckpt, 1)
    for i, n in enumerate(("IN", "A", "B")):
        x = synthetic_inputs(cfg, text_len=3 + i)
        save_file({k: v for k, v in x.items() if v is not None}, names[f"{n}.safetensors"])


# ~75 s alone on 2 cores: every README line as written, each a fresh process (make demo ~28 s, make-tiny ~11 s, the
# torchrun lines two ranks each); nothing here to share between them without running them otherwise than written
def test_readme_shell_lines_run(placeholders):
    d, names = placeholders
    done = []
    for cmd in readme_commands():
        if cmd in SELF: continue
        words = [names.get(w, w) for w in shlex.split(cmd)]
        if words[0] == "make": words = ["make", "-C", str(ROOT), *words[1:]]
        r = subprocess.run(words, env=ENV, cwd=d, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"README line failed: {cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        if words[:2] == ["qwen3vl-l50", "make-tiny"] and not Path(names["IN.safetensors"]).exists():
            _inputs(Path(words[-1]), names)
        done.append(cmd)
    assert len(done) >= 5, done
    assert Path(names["OUT.safetensors"]).exists()
