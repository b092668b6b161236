import pytest
import torch

torch.set_num_threads(1)  # 2-core CI machines: several ranks per test share them
LONGEST = ("test_stored", "test_dataset", "test_readme")   # minutes each on 2 cores


def pytest_collection_modifyitems(items):
    "The longest modules first: pytest-xdist's two workers then end together instead of one waiting on a long test."
    rank = {m: i for i, m in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(LONGEST)))   # stable: a module's tests stay together


@pytest.fixture(scope="session")
def vocab_ckpt(tmp_path_factory):
    "A tiny checkpoint with Qwen's vocabulary (real prompts tokenize), 4 decoder layers: made once, read by every file."
    from qwen3vl_l50_nbdev.cli import main
    d = tmp_path_factory.mktemp("model") / "m"
    assert main(["make-tiny", str(d), "--real-vocab"]) == 0
    return d
