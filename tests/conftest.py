import pytest
import torch

torch.set_num_threads(1)  # 2-core CI machines: several ranks per test share them


@pytest.fixture(scope="session")
def vocab_ckpt(tmp_path_factory):
    "A tiny checkpoint with Qwen's vocabulary (real prompts tokenize), 4 decoder layers: made once, read by every file."
    from qwen3vl_l50_nbdev.cli import main
    d = tmp_path_factory.mktemp("model") / "m"
    assert main(["make-tiny", str(d), "--real-vocab"]) == 0
    return d
