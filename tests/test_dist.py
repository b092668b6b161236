("`spawn` when a rank dies or hangs: the call ends, with the rank named, instead of hanging "
 "(a notebook cell cannot kill ranks safely).")
import os
import time
import signal
import pytest
import torch
import torch.distributed as dist
from qwen3vl_l50_nbdev.deadline import TIMEOUT, rank_error
from qwen3vl_l50_nbdev.dist import encoder_group, spawn


def _die_on(bad, how):
    if dist.get_rank() == bad:
        os.kill(os.getpid(), signal.SIGKILL) if how == "kill" else os._exit(3)
    dist.barrier()   # the others block here until spawn kills them


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
    # the call's deadline, or rank 1's wait for rank 0 (a collective's deadline is the call's): whichever first
    with pytest.raises((TimeoutError, RuntimeError), match=r"no result from ranks \[0\]|Timed out"):
        spawn(_hang, 2, timeout=5)
    assert time.monotonic() - t0 < 30


def _peer_hangs():
    g = encoder_group(2)
    if g.rank == 1: time.sleep(3600)   # a rank stuck in a forward: its peer waits in the group's sum
    try: g.all_reduce(torch.ones(4))
    except RuntimeError as e: raise RuntimeError(rank_error(e)) from None


def test_encoder_group_takes_the_worlds_deadline(monkeypatch):
    "A peer that never joins the encoder group's sum: the sum raises at the world's deadline (4 s), saying so."
    monkeypatch.setenv(TIMEOUT, "4")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"RuntimeError: Timed out .* within the 4 s deadline"):
        spawn(_peer_hangs, 2, timeout=50)
    assert time.monotonic() - t0 < 20   # 4 s and the ranks' start (a new group once waited 30 min)
