"Process groups and spawn on real gloo ranks: tiling, membership, and failures that must not hang."
import os, time, signal
import pytest, torch
import torch.distributed as dist
from qwen3vl_l50_nbdev.dist import Group, encoder_group, spawn


def _group_sum(tp, tiled):
    g = encoder_group(tp, tiled)
    if not g.is_member:
        with pytest.raises(RuntimeError, match="not a member"):
            g.all_reduce(torch.ones(1))
        return None
    x = torch.tensor([float(dist.get_rank() + 1)], dtype=torch.bfloat16)
    return g.ranks, g.rank, g.size, g.all_reduce(x, torch.float32).item(), g.broadcast(x.clone(), src=g.size - 1).item()


@pytest.mark.parametrize("world,tp,tiled", [(2, 2, False), (4, 4, False), (4, 2, False), (4, 2, True), (4, 1, True)])
def test_groups(world, tp, tiled):
    res = spawn(_group_sum, world, tp, tiled)
    for r, out in enumerate(res):
        start = (r // tp) * tp
        if not tiled and r >= tp:
            assert out is None
            continue
        ranks = tuple(range(start, start + tp))
        assert out == (ranks, r - start, tp, float(sum(k + 1 for k in ranks)), float(ranks[-1] + 1))


def test_tiling_must_divide_world():
    with pytest.raises(ValueError, match="does not divide the world size 4"):
        spawn(encoder_group, 4, 3, True)


def test_tp_larger_than_world():
    with pytest.raises(ValueError, match="the world has 2 ranks"):
        spawn(encoder_group, 2, 4)


def test_local_group_needs_no_process_group():
    g = encoder_group()
    x = torch.randn(5)
    assert (g.size, g.rank) == (1, 0) and torch.equal(g.all_reduce(x), x)


def _raise_on(bad):
    if dist.get_rank() == bad:
        raise KeyError(f"boom on {bad}")
    dist.barrier()   # the others block here until spawn kills them
    return dist.get_rank()


def test_rank_that_raises_is_reraised_with_its_traceback():
    t0 = time.monotonic()
    with pytest.raises(KeyError, match="boom on 2") as info:
        spawn(_raise_on, 4, 2)
    assert "on rank 2" in str(info.value.__cause__) and "_raise_on" in str(info.value.__cause__)
    assert time.monotonic() - t0 < 60


def _die_on(bad, how):
    if dist.get_rank() == bad:
        os.kill(os.getpid(), signal.SIGKILL) if how == "kill" else os._exit(3)
    dist.barrier()


@pytest.mark.parametrize("how,code", [("kill", -9), ("exit", 3)])
def test_rank_that_dies_ends_the_call(how, code):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=f"rank 1 died with exit code {code}"):
        spawn(_die_on, 2, 1, how)
    assert time.monotonic() - t0 < 60


def _hang():
    if dist.get_rank() == 0:
        time.sleep(3600)


def test_whole_call_is_bounded():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no result from ranks \[0\]"):
        spawn(_hang, 2, timeout=5)
    assert time.monotonic() - t0 < 30
