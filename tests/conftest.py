import os
import signal

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


_FAULT = '''import os, signal, time
# this rank (or one process, "single") meets the fault at its first FAULT_IN call
if os.environ.get("RANK", "single") == os.environ.get("FAULT_RANK"):
    import importlib
    mod, _, name = os.environ["FAULT_IN"].partition(":")
    owner = importlib.import_module(mod)
    *path, attr = name.split(".")
    for p in path: owner = getattr(owner, p)
    real = getattr(owner, attr)
    def faulty(*a, **k):
        open(os.environ["FAULT_AT"], "w").write(repr(time.time()))
        how = os.environ["FAULT"]
        if how == "raise": raise RuntimeError(f"rank {os.environ['RANK']} meets an injected fault")
        if how == "hang": time.sleep(3600)   # a rank stuck in a forward
        if how == "stuck":   # stuck in one C call (a long GEMM, a gloo wait): a mutex locked twice; no handler runs
            import ctypes
            m, libc = ctypes.create_string_buffer(64), ctypes.CDLL(None)   # zeros: an unlocked pthread mutex
            libc.pthread_mutex_lock(m); libc.pthread_mutex_lock(m)
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)   # the OOM killer; a frozen host
        return real(*a, **k)
    setattr(owner, attr, faulty)
'''


def _descendants(pid: int) -> set:
    "Every process below `pid` (from /proc)."
    kids, out = {}, set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try: kids.setdefault(int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
            except (OSError, IndexError): pass
    todo = [pid]
    while todo:
        for k in kids.get(todo.pop(), []): out.add(k); todo.append(k)
    return out


def _alive(pid: int) -> bool:
    try: return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError: return False


@pytest.fixture
def faulty(tmp_path):
    ("`faulty(argv, how, rank, where, limit, then)`: run the CLI `argv` whose rank `rank` meets `how` (hang, raise, "
     "kill, stop, stuck) at its first call of `where` (`module:attr`), then `then(launcher's Popen, its processes)` "
     "if given; every process of it must be gone within `limit` s of the fault. Returns (exit code, stderr, seconds "
     "from the fault to the last process gone).")
    import subprocess
    import sys
    import time
    def run(argv, how, rank, where, limit, then=None):
        d = tmp_path / "fault"; d.mkdir(exist_ok=True); (d / "sitecustomize.py").write_text(_FAULT)
        at = d / "at"; at.unlink(missing_ok=True)
        env = os.environ | dict(OMP_NUM_THREADS="1", FAULT=how, FAULT_RANK=str(rank), FAULT_IN=where, FAULT_AT=str(at),
                                PYTHONPATH=os.pathsep.join([str(d), os.environ.get("PYTHONPATH", "")]))
        p = subprocess.Popen([sys.executable, "-m", "qwen3vl_l50_nbdev.cli", *map(str, argv)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        seen, err = set(), []
        import threading
        threading.Thread(target=lambda: err.extend(iter(p.stderr.readline, "")), daemon=True).start()
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 300 and not at.exists():   # the ranks load, then meet the fault
                seen |= _descendants(p.pid); time.sleep(0.1)
            assert at.exists(), "the fault was not met: " + "".join(err)[-3000:]
            if then: time.sleep(1); then(p, seen | _descendants(p.pid))
            while (p.poll() is None or [q for q in seen if _alive(q)]) and time.time() - float(at.read_text()) < limit:
                seen |= _descendants(p.pid) if p.poll() is None else set(); time.sleep(0.1)
            took = time.time() - float(at.read_text())
            assert p.poll() is not None and not [q for q in seen if _alive(q)], (
                f"a process outlived the fault by {limit} s: " + "".join(err)[-3000:])
        finally:
            try: os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError: pass
            for q in seen:
                try: os.kill(q, signal.SIGKILL)
                except ProcessLookupError: pass
        time.sleep(0.2)
        return p.returncode, "".join(err), took
    return run
