"`qwen3vl-l50 encode-dataset`: replicas and TP on gloo, killed and resumed jobs, dedup, cache, refusals, two launchers."
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open

from qwen3vl_l50_nbdev.cli import main
from qwen3vl_l50_nbdev.dataset import encode_dataset, load_embeddings, MANIFEST
from qwen3vl_l50_nbdev.encoder import Encoder
from qwen3vl_l50_nbdev.inputs import Processor, sample_photo
from qwen3vl_l50_nbdev.inputs.prompts import read_prompts, process_prompts
from qwen3vl_l50_nbdev.settings import Numerics

ENV = os.environ | {"OMP_NUM_THREADS": "1"}
CLI = [sys.executable, "-m", "qwen3vl_l50_nbdev.cli"]
SEED = random.SystemRandom().randrange(2 ** 31)   # fresh inputs each session; printed when a test fails


@pytest.fixture(scope="module")
def ckpt(vocab_ckpt): return vocab_ckpt   # conftest's: one tiny real-vocabulary checkpoint for the session


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    "A photograph, texts, a line repeated under another id, pre-tokenized lines: random lengths and ids."
    from PIL import Image
    r, d = random.Random(SEED), tmp_path_factory.mktemp("mixed")
    Image.open(sample_photo()).resize((40, 48)).save(d / "photo.png")
    lines = [dict(id="photo", text="A portrait.", images=["photo.png"]), dict(id="dup", text="A portrait.",
             images=["photo.png"])]
    words = lambda: " ".join(r.choice(["sea", "gull", "rock", "boat"]) for _ in range(r.randrange(3, 60)))
    lines += [dict(id=f"t{i}", text=words()) for i in range(6)]
    lines += [dict(id=f"ids{i}", input_ids=[r.randrange(151000) for _ in range(r.randrange(5, 200))]) for i in range(5)]
    (d / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d / "p.jsonl"


@pytest.fixture(scope="module")
def long(tmp_path_factory):
    "Pre-tokenized prompts long enough (2,500-5,000 random ids each) that a 2-rank job runs several seconds."
    r, d = random.Random(SEED + 1), tmp_path_factory.mktemp("long")
    ids = lambda: [r.randrange(151000) for _ in range(r.randrange(2500, 5000))]
    lines = [dict(id=f"q{i}", input_ids=ids()) for i in range(36)]
    (d / "long.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d / "long.jsonl"


STOP_BATCH = 1600   # --batch-tokens of `stoppable`'s jobs: one prompt a batch, a shard


@pytest.fixture(scope="module")
def stoppable(tmp_path_factory):
    ("Pre-tokenized prompts of 801-1,600 random ids, 64 of them, one a batch at `--batch-tokens 1600`: a 2-replica job "
     "writes 32 shards each, so one stopped at its first shard is stopped mid-job (a second or more of work left).")
    r, d = random.Random(SEED + 2), tmp_path_factory.mktemp("stoppable")
    ids = lambda: [r.randrange(151000) for _ in range(r.randrange(801, STOP_BATCH + 1))]
    lines = [dict(id=f"s{i}", input_ids=ids()) for i in range(64)]
    (d / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d / "s.jsonl"


@pytest.fixture(scope="module")
def uninterrupted(ckpt, stoppable, tmp_path_factory):
    "`{mode: {id: embedding}}` of `stoppable` in one process, uninterrupted: computed once a mode, on first use."
    refs = {}
    def ref(mode: str) -> dict:
        if mode not in refs:
            out = tmp_path_factory.mktemp(f"ref-{mode}")
            encode_dataset(ckpt, stoppable, out, layer=3, numerics=Numerics(mode=mode), batch_tokens=STOP_BATCH,
                           progress=False)
            e = load_embeddings(out); refs[mode] = {k: e[k] for k in e}
        return refs[mode]
    return ref


def args(ckpt, prompts, out, *more):
    return ["encode-dataset", "--model", str(ckpt), "--prompts", str(prompts), "--out", str(out), "--layer", "3",
            "--max-pixels", "4096", *map(str, more)]


def run(*a, timeout=300):
    return subprocess.run([*CLI, *a], env=ENV, capture_output=True, text=True, timeout=timeout)


def singles(ckpt, prompts) -> dict:
    "`encode` of each prompt in this process, TP 1, exact: the bits a dataset job in exact mode must give."
    enc = Encoder.from_pretrained(ckpt, 3, progress=False)
    px = dict(max_pixels=4096, min_pixels=1024)   # as --max-pixels 4096 gives
    xs = process_prompts(read_prompts(prompts), Processor.from_pretrained(ckpt, video=px, **px), enc.cfg)
    return {p: enc.encode(**x) for p, x in xs.items()}


def shards_ok(out) -> dict:
    "Every shard whole (readable) and no id in two of them: `{id: shard}`."
    where = {}
    for f in sorted(out.glob("shard-*.safetensors")):
        with safe_open(f, "pt") as s:
            for k in s.keys():
                assert k not in where, f"{k} in {where[k]} and {f.name}"
                where[k] = f.name
    return where


def same(out, ref: dict):
    emb = load_embeddings(out)
    assert sorted(emb) == sorted(ref), (sorted(emb), sorted(ref))
    for k, t in ref.items(): assert torch.equal(emb[k], t), f"{k} differs (seed {SEED})"


def test_replicas_and_tp_on_gloo(ckpt, mixed, tmp_path):
    "2 replicas x TP 1: `encode`'s bits; 1 replica x TP 2: within bf16 noise of them; manifest, provenance, one bar."
    ref = singles(ckpt, mixed)
    r = run(*args(ckpt, mixed, tmp_path / "r2", "--batch-tokens", 200, "--nproc", 2))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stderr.count("encode-dataset:   0%") == 1 and "13/13 prompts" in r.stderr, r.stdout + r.stderr
    same(tmp_path / "r2", ref)
    m = pq.read_table(tmp_path / "r2" / MANIFEST).to_pandas()
    assert list(m.id) == list(ref) and m.id.is_unique and m.set_index("id").tensor["dup"] == "photo"
    assert (m.tokens == [len(ref[i]) for i in m.id]).all() and m.input_hash.str.len().eq(32).all()
    prov = json.loads((tmp_path / "r2" / "provenance.json").read_text())
    assert (prov["replicas"], prov["tp"], prov["world"], prov["mode"], prov["duplicates"]) == (2, 1, 2, "exact", 1)
    assert {"checkpoint_fingerprint", "package", "commit", "torch", "transformers", "devices", "date", "command",
            "dtype", "layer", "reduce", "quant"} <= set(prov)
    tp2 = lambda out: run(*args(ckpt, mixed, tmp_path / out, "--tp", 2, "--batch-tokens", 200, "--nproc", 2, "--cache",
                                tmp_path / "c"))
    r = tp2("t2")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    emb = load_embeddings(tmp_path / "t2")
    for k, t in ref.items():   # TP 2 sums the row-parallel halves in fp32, then rounds to bf16: a few bf16 ulps
        e = emb[k].float() - t.float()
        assert (e.norm() / t.float().norm()) < 2e-2, (k, SEED)
    assert json.loads((tmp_path / "t2" / "provenance.json").read_text())["replicas"] == 1
    # again into another DIR from the cache: both ranks of the TP group agree on every hit, the bits are the first's
    r = tp2("t3")
    assert r.returncode == 0 and "12 cache hits" in r.stdout, r.stdout + r.stderr[-3000:]
    same(tmp_path / "t3", {k: emb[k] for k in emb})


def _kids(pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) == pid: out.append(int(p))
            except OSError: pass
    return out


def _tree(pid: int) -> list[int]:
    kids = _kids(pid)
    return kids + [g for k in kids for g in _tree(k)]


def _alive(pid: int) -> bool:
    try: return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError: return False


@pytest.mark.parametrize("how,mode", [("rank", "fast"), ("launcher", "exact"), ("sigint", "fast")])   # each stop once
def test_killed_then_resumed(how, mode, ckpt, stoppable, uninterrupted, tmp_path):
    ("A 2-replica job stopped at its first shard (SIGKILL of a rank, SIGKILL of the launcher, Ctrl-C), then the same "
     "command: every prompt once, every shard whole, the bits of an uninterrupted one-process run.")
    ref = uninterrupted(mode)   # one process: the replicas must not change the bits either
    out = tmp_path / "out"
    cmd = [*CLI, *args(ckpt, stoppable, out, "--mode", mode, "--batch-tokens", STOP_BATCH), "--nproc", "2"]
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        t0 = time.monotonic()
        while not list(out.glob("shard-*.safetensors")) and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.01)
        procs = _tree(p.pid)
        assert p.poll() is None, "the job ended before it could be stopped: give it more prompts\n" + p.stdout.read()
        torchrun = _kids(p.pid)[0]
        if how == "rank": os.kill(max(_kids(torchrun)), signal.SIGKILL)
        else: os.kill(p.pid, signal.SIGKILL if how == "launcher" else signal.SIGINT)
        try: p.wait(timeout=60)
        except subprocess.TimeoutExpired: pytest.fail("the job did not end within 60 s")
        t1 = time.monotonic()
        while [q for q in procs if _alive(q)] and time.monotonic() - t1 < 60: time.sleep(0.1)
        assert not [q for q in procs if _alive(q)], "a rank or torchrun outlived the job"
    finally:
        try: os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError: pass
    assert not (out / MANIFEST).exists()
    before = shards_ok(out)
    assert 0 < len(before) < len(ref), f"{len(before)} of {len(ref)} done: not stopped mid-job"
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert f"of {len(ref)} " in r.stdout and f"encoded {len(ref)} prompts" not in r.stdout, r.stdout
    after = shards_ok(out)
    assert sorted(after) == sorted(ref) and all(after[k] == v for k, v in before.items())
    assert not list(out.glob(".*tmp")), list(out.iterdir())
    same(out, ref)


def test_dedup_cache_finished_and_refusals(ckpt, mixed, tmp_path, capsys):
    ("In one process: a duplicate encoded once; --cache serves a second job; a finished DIR is left alone; other "
     "settings are refused with the difference named; --overwrite; bad input before any weight.")
    ref = singles(ckpt, mixed)
    a = args(ckpt, mixed, tmp_path / "a", "--cache", tmp_path / "cache")
    assert main(a) == 0
    out = capsys.readouterr().out
    assert "encoded 12 prompts" in out and "1 duplicates, 0 cache hits" in out, out
    same(tmp_path / "a", ref)
    stamp = {f: f.stat().st_mtime_ns for f in (tmp_path / "a").iterdir()}
    assert main(a) == 0 and "nothing to do: all 13 prompts" in capsys.readouterr().out
    assert stamp == {f: f.stat().st_mtime_ns for f in (tmp_path / "a").iterdir()}
    assert main(args(ckpt, mixed, tmp_path / "b", "--cache", tmp_path / "cache")) == 0   # another DIR, the cache
    assert "12 cache hits" in capsys.readouterr().out
    same(tmp_path / "b", ref)
    assert main(args(ckpt, mixed, tmp_path / "a", "--batch-tokens", 100)[:-2] + ["--layer", "2"]) == 2
    err = capsys.readouterr().err
    assert "holds another job's embeddings: layer 3 there, 2 now" in err and "--overwrite" in err, err
    assert main(args(ckpt, mixed, tmp_path / "a", "--mode", "fast")) == 2
    assert "mode 'exact' there, 'fast' now" in capsys.readouterr().err
    assert main(args(ckpt, mixed, tmp_path / "a", "--mode", "fast", "--overwrite")) == 0
    assert json.loads((tmp_path / "a" / "job.json").read_text())["mode"] == "fast"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"input_ids": [1, "two"]}\n')
    assert main(args(ckpt, bad, tmp_path / "c")) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: \"input_ids\" must be a non-empty list" in err and not (tmp_path / "c").exists(), err
    (tmp_path / "d").mkdir(); (tmp_path / "d" / "mine.txt").write_text("x")
    assert main(args(ckpt, mixed, tmp_path / "d")) == 2 and "not an encode-dataset job's" in capsys.readouterr().err
    r = run(*args(ckpt, mixed, tmp_path / "e", "--tp", 3, "--nproc", 2))
    assert r.returncode == 2 and "--tp 3: the 2 ranks are replicas x TP" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_two_launchers_one_job(ckpt, mixed, tmp_path):
    "Two torchrun launchers (--nnodes 2, c10d rendezvous on localhost) run one job of 2 replicas: `encode`'s bits."
    with socket.socket() as s: s.bind(("localhost", 0)); port = s.getsockname()[1]
    tr = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend",
          "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"t{SEED}", "-m", "qwen3vl_l50_nbdev.cli",
          *args(ckpt, mixed, tmp_path / "o", "--batch-tokens", 200)]
    ps = [subprocess.Popen(tr, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try: outs = [p.communicate(timeout=240) for p in ps]
    finally:
        for p in ps: p.kill()
    assert [p.returncode for p in ps] == [0, 0], [o[1][-2000:] for o in outs]
    assert sum("encoded 12 prompts" in o[0] for o in outs) == 1, outs   # rank 0 says it, once
    assert json.loads((tmp_path / "o" / "provenance.json").read_text())["world"] == 2
    same(tmp_path / "o", singles(ckpt, mixed))


def _partial(ckpt, prompts, out, *more):
    "A finished job's DIR without its manifest and provenance: what a run killed near its end leaves."
    assert main(args(ckpt, prompts, out, "--batch-tokens", 200, *more)) == 0
    (out / MANIFEST).unlink(); (out / "provenance.json").unlink()


def test_failing_replica_ends_the_job(ckpt, mixed, tmp_path):
    "Replica 1 cannot write its cache entries: the job ends (no rank waits for it), rc 2, its error said once."
    from qwen3vl_l50_nbdev.dataset import Cache, Item, assign, plan_batches
    assert main(args(ckpt, mixed, tmp_path / "y", "--batch-tokens", 200)) == 0   # the job's settings, input hashes
    c = Cache(tmp_path / "c", json.loads((tmp_path / "y" / "job.json").read_text()), 0)
    rows = pq.read_table(tmp_path / "y" / MANIFEST).to_pylist()
    batches = plan_batches([Item(r["line"], r["id"], r["tokens"], r["input_hash"]) for r in rows], 200)
    two = assign({k: sum(it.tokens for it in b) for k, b in enumerate(batches)}, 2)
    first = {c.path(it.hash).parent for k in two[0] for it in batches[k]}
    blocked = [p for k in two[1] for it in batches[k] if (p := c.path(it.hash).parent) not in first]
    assert blocked, "every cache prefix of replica 1 is replica 0's too: another seed"
    blocked[0].write_text("x")   # a file where replica 1's cache directory goes
    try: r = run(*args(ckpt, mixed, tmp_path / "z", "--batch-tokens", 200, "--cache", c.root, "--nproc", 2),
                 timeout=180)
    except subprocess.TimeoutExpired: pytest.fail("a replica failed and the job did not end")
    assert r.returncode == 2 and f"cannot make {blocked[0]}" in r.stderr, r.stderr[-3000:]
    assert r.stderr.count("cannot make") == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_vanished_shard_ends_the_job(ckpt, long, tmp_path):
    "A shard deleted while the job runs: the job ends with rc 2 naming it; the same command then finishes the job."
    out = tmp_path / "o"
    p = subprocess.Popen([*CLI, *args(ckpt, long, out, "--batch-tokens", 9000)], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        first = out / "shard-00000.safetensors"
        t0 = time.monotonic()
        while not first.exists() and p.poll() is None and time.monotonic() - t0 < 120: time.sleep(0.005)
        first.unlink()
        try: _, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired: pytest.fail("a shard vanished and the job did not end")
    finally: p.kill()
    assert p.returncode == 2 and f"{first}: missing" in err and "run the same command again" in err, err[-2000:]
    r = run(*args(ckpt, long, out, "--batch-tokens", 9000))
    assert r.returncode == 0 and "encoded 36 prompts" not in r.stdout, r.stdout + r.stderr[-2000:]   # the one shard
    assert len(load_embeddings(out)) == 36


def test_second_job_on_the_same_out_is_refused(ckpt, long, tmp_path):
    "A job on a DIR in use, even with --overwrite, is refused naming the first; the first ends whole."
    out, few = tmp_path / "o", tmp_path / "few.jsonl"
    few.write_text("".join(long.read_text().splitlines(keepends=True)[:8]))   # 8 long prompts: shards after job.json
    cmd = [*CLI, *args(ckpt, few, out, "--batch-tokens", 9000)]
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        t0 = time.monotonic()   # job.json is written once the lock is taken: then the first job is stopped
        while not (out / "job.json").exists() and p.poll() is None and time.monotonic() - t0 < 120: time.sleep(0.01)
        assert p.poll() is None, p.communicate()[1][-2000:]
        os.killpg(p.pid, signal.SIGSTOP)   # it holds the lock however long the second job takes
        assert p.poll() is None and f'"pid": {p.pid}' in (out / ".lock").read_text(), "the first job ended first"
        r = run(*args(ckpt, few, out, "--batch-tokens", 9000)[:-2], "--layer", "2", "--overwrite")
        assert r.returncode == 2 and f"is in use by another encode-dataset job (pid {p.pid} on" in r.stderr, r.stderr
        os.killpg(p.pid, signal.SIGCONT)
        try: _, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired: pytest.fail("the first job did not end")
    finally:
        if p.poll() is None: os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, err[-2000:]
    assert len(load_embeddings(out)) == 8 and not (out / ".lock").exists()


def test_resume_rechecks_the_shards(ckpt, mixed, tmp_path, capsys):
    ("A partial DIR whose shards are damaged (bytes changed), truncated or another job's (fast mode): each is found "
     "at the start of the resume, named, encoded again: `encode`'s bits. Other code or weights there: refused.")
    out, fast = tmp_path / "o", tmp_path / "f"
    one = ("--batch-tokens", 1)   # a prompt a batch: the 4 shards below exist whatever the random lengths
    _partial(ckpt, mixed, out, *one)
    _partial(ckpt, mixed, fast, "--mode", "fast", *one)
    s = [out / f"shard-0000{k}.safetensors" for k in range(4)]
    b = bytearray(s[1].read_bytes()); b[-100:-36] = bytes(x ^ 0x5A for x in b[-100:-36]); s[1].write_bytes(b)
    s[2].write_bytes(s[2].read_bytes()[:1000])
    s[3].write_bytes((fast / s[3].name).read_bytes())
    capsys.readouterr()
    assert main(args(ckpt, mixed, out, *one)) == 0
    err = capsys.readouterr().err
    for p, why in zip(s[1:], ("damaged", "cannot be read", "written by another job")):
        assert f"{p}: {why}" in err and "encoded again" in err, err
    same(out, singles(ckpt, mixed))
    (out / MANIFEST).unlink()
    job = json.loads((out / "job.json").read_text())
    (out / "job.json").write_text(json.dumps(job | dict(code="0123abc+dirty-feedbeef")))   # another code's job
    assert main(args(ckpt, mixed, out, *one)) == 2
    assert "code '0123abc+dirty-feedbeef' there" in capsys.readouterr().err


def test_cache_inside_out_and_a_full_disk(ckpt, mixed, tmp_path):
    "`--cache` inside `--out` works, twice; a file size limit (a full disk) gives one line, rc 2, naming the shard."
    import resource
    out = tmp_path / "o"
    for _ in range(2):
        r = run(*args(ckpt, mixed, out, "--cache", out / "cache"))
        assert r.returncode == 0, r.stderr[-2000:]
    def small():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
    r = subprocess.run([*CLI, *args(ckpt, mixed, tmp_path / "full")], env=ENV, capture_output=True, text=True,
                       timeout=300, preexec_fn=small)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{tmp_path / 'full'}/shard-00000.safetensors: cannot be written" in r.stderr, r.stderr
    assert r.stderr.count("encode-dataset: error:") == 1, r.stderr


_HOOK = '''import os, time
if os.environ.get("RANK") == os.environ.get("FAIL_RANK"):   # this rank's shards fail: a stand-in for a lost GPU
    import qwen3vl_l50_nbdev.dataset.shards as d
    def write_shard(*a, **k):
        open(os.environ["FAIL_AT"], "w").write(repr(time.time()))
        raise ValueError(f"rank {os.environ['RANK']} cannot go on: its device is lost")
    d.write_shard = write_shard
'''


@pytest.mark.parametrize("nproc,fail", [(2, 1), (4, 3)])
def test_failure_in_a_tp_group_ends_every_rank(nproc, fail, ckpt, long, tmp_path):
    ("A TP-2 rank that fails (not its group's rank 0: its peer waits for it inside a collective; with 2 replicas the "
     "other replica is busy encoding): every rank ends within 30 s of the failure, rc 2, its error said once.")
    hook = tmp_path / "hook"; hook.mkdir(); (hook / "sitecustomize.py").write_text(_HOOK)
    at = tmp_path / "failed-at"
    env = ENV | dict(PYTHONPATH=os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]), FAIL_RANK=str(fail),
                     FAIL_AT=str(at))
    p = subprocess.Popen([*CLI, *args(ckpt, long, tmp_path / "o", "--batch-tokens", 6000, "--tp", 2, "--nproc",
                                  nproc)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try: _, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired: pytest.fail("a rank of a TP group failed and the job did not end")
    finally: p.kill()
    ended = time.time()
    assert at.exists(), "the injected failure did not happen: " + err[-2000:]
    assert ended - float(at.read_text()) < 30, f"the job ended {ended - float(at.read_text()):.0f} s after the failure"
    assert p.returncode == 2 and f"rank {fail} cannot go on: its device is lost" in err, err[-3000:]
    assert err.count("cannot go on") == 1 and "Traceback" not in err, err[-3000:]


DATASET_FAULTS = {"kill": "rank 1 was killed by SIGKILL (e.g. out of memory", "raise": "rank 1 meets an injected fault",
                  "hang": "did not answer within the 10 s deadline", "stop": "did not answer within the 10 s deadline"}


@pytest.mark.parametrize("layout", ["tp2", "replicas"])
@pytest.mark.parametrize("how", list(DATASET_FAULTS))
def test_a_failed_rank_ends_the_job(how, layout, ckpt, long, faulty, tmp_path):
    ("`--timeout 10`, 2 ranks as one TP-2 replica or two replicas; rank 1 is killed, raises, hangs or is stopped "
     "(SIGSTOP) at its first batch: every process is gone within 45 s, exit code nonzero, no traceback, the cause said "
     "once. Two replicas: rank 0 ends its own batches, then waits for rank 1's shards at most the deadline.")
    more = ["--tp", 2] if layout == "tp2" else []
    rc, err, took = faulty([*args(ckpt, long, tmp_path / "o", "--batch-tokens", 6000, "--timeout", 10, "--nproc", 2,
                                  *more)], how, 1, "qwen3vl_l50_nbdev.dataset.shards:run_batch", 45)
    print(f"encode-dataset {layout}, rank 1 {how}: every process gone {took:.1f} s after the fault\n{err}")
    want = "no new shard for 10 s" if layout == "replicas" and how in ("hang", "stop") else DATASET_FAULTS[how]
    assert rc != 0 and "Traceback" not in err and want in err, err[-3000:]
    assert err.count(want) == 1 and not (tmp_path / "o" / MANIFEST).exists(), err[-3000:]
    said = [line for line in err.splitlines() if want in line]   # (a bar's redraws split at "\r" too)
    assert said[0].startswith(("qwen3vl-l50 encode-dataset: error: ", "[rank 1] ")), said   # not glued to the bar
