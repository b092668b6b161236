("Silent wrong or mixed embeddings refused, damaged outputs repaired: ranks that read different prompts, a "
 "checkpoint with rows rewritten, damaged shards, a lost job.json.")
import json
import random
import shutil
import struct

import pytest
import torch

from qwen3vl_l50_nbdev.cli import main
from qwen3vl_l50_nbdev.dataset import encode_dataset, load_embeddings, MANIFEST
from qwen3vl_l50_nbdev.dist import spawn
from qwen3vl_l50_nbdev.weights.index import checkpoint_fingerprint

SEED = random.SystemRandom().randrange(2 ** 31)   # fresh prompts each session; printed when a test fails


@pytest.fixture(autouse=True)
def digests(tmp_path, monkeypatch):
    "Each test's own digest cache: what one test remembers, another does not see."
    monkeypatch.setenv("QWEN3VL_L50_DIGESTS", str(tmp_path / "digests"))


def prompts(path, seed: int, n: int = 12):
    "`n` pre-tokenized prompts of random ids, 20-60 long (the same lengths for any `seed` of one session)."
    r, lengths = random.Random(seed), random.Random(SEED).choices(range(20, 61), k=n)
    path.write_text("".join(json.dumps(dict(id=f"p{i}", input_ids=[r.randrange(151000) for _ in range(k)])) + "\n"
                            for i, k in enumerate(lengths)))
    return path


def args(ckpt, p, out, *more):
    return ["encode-dataset", "--model", str(ckpt), "--prompts", str(p), "--out", str(out), "--layer", "3",
            "--batch-tokens", "100", *map(str, more)]


def _job_on_own_file(ckpt, files, out, tp):
    "One rank of a job whose rank r reads `files[r]`: its error, or None when it encoded."
    import torch.distributed as dist
    try: encode_dataset(ckpt, files[dist.get_rank()], out, layer=3, tp=tp, batch_tokens=100, progress=False)
    except ValueError as e: return str(e)


@pytest.mark.parametrize("tp", [2, 1])   # one replica at TP 2; two replicas
def test_ranks_that_read_different_prompts_are_refused(tp, vocab_ckpt, tmp_path):
    "The same ids and lengths, other tokens on rank 1: refused on every rank before encoding, nothing written."
    files = [prompts(tmp_path / "a.jsonl", SEED), prompts(tmp_path / "b.jsonl", SEED + 1)]
    said = spawn(_job_on_own_file, 2, vocab_ckpt, files, tmp_path / "out", tp, timeout=120)
    assert said[0] == said[1] and said[0] is not None, (said, SEED)
    assert said[0].startswith("the ranks disagree on what they encode: rank 1 has prompts '12 prompts, "), said
    assert "give every rank the same prompts file" in said[0], said
    assert not list((tmp_path / "out").glob("shard-*")), "a shard was written"
    assert spawn(_job_on_own_file, 2, vocab_ckpt, files[:1] * 2, tmp_path / "ok", tp, timeout=120) == [None, None]
    assert len(load_embeddings(tmp_path / "ok")) == 12


def _encode_own_inputs(ckpt, files, out):
    "One rank of `encode` at TP 2 whose rank r reads `files[r]`: its error, or None when it wrote."
    import torch.distributed as dist
    from qwen3vl_l50_nbdev.cli import parser
    from qwen3vl_l50_nbdev.cli.encode import cmd_encode
    r = dist.get_rank()
    try: cmd_encode(parser().parse_args(["encode", "--model", str(ckpt), "--layer", "3", "--inputs", str(files[r]),
                                         "--out", f"{out}{r}"]))
    except ValueError as e: return str(e)


def test_encode_ranks_that_read_different_inputs_are_refused(vocab_ckpt, tmp_path):
    "`encode` at TP 2, rank 1's inputs file another copy with other tokens: refused on every rank, nothing written."
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(SEED)
    files = [tmp_path / f"in{r}.safetensors" for r in range(2)]
    for f in files: save_file({"input_ids": torch.randint(0, 151000, (40,), generator=g)}, f)
    said = spawn(_encode_own_inputs, 2, vocab_ckpt, files, tmp_path / "out", timeout=120)
    assert said[0] == said[1] and said[0] is not None, said
    assert said[0].startswith("the ranks disagree on what they encode: rank 1 has inputs '40 tokens"), said
    assert not list(tmp_path.glob("out*")), "an output was written"
    assert spawn(_encode_own_inputs, 2, vocab_ckpt, files[:1] * 2, tmp_path / "ok", timeout=120) == [None, None]
    assert (tmp_path / "ok0").exists()


def _rewrite_rows(ckpt, rows: int = 100):
    "`rows` rows in the middle of embed_tokens rewritten in place, random: the file's size and header unchanged."
    f = ckpt / "model.safetensors"
    with open(f, "r+b") as w:
        n = struct.unpack("<Q", w.read(8))[0]
        e = json.loads(w.read(n))["model.language_model.embed_tokens.weight"]
        assert e["dtype"] == "BF16", e
        row = e["shape"][1] * 2
        w.seek(8 + n + e["data_offsets"][0] + e["shape"][0] // 2 * row)
        w.write(torch.randn(rows, e["shape"][1], generator=torch.Generator().manual_seed(SEED))
                .to(torch.bfloat16).view(torch.uint8).numpy().tobytes())


def test_rewritten_rows_are_another_checkpoint(vocab_ckpt, tmp_path, capsys):
    ("100 rows of embed_tokens rewritten: another fingerprint, so a finished job is not 'done', a resumed one does "
     "not mix two checkpoints' shards, and --cache serves none of the old weights' embeddings.")
    ck = shutil.copytree(vocab_ckpt, tmp_path / "m")
    p = prompts(tmp_path / "p.jsonl", SEED)
    # a prompt made of the rewritten rows' tokens: its embedding changes with them
    mid = json.loads((ck / "config.json").read_text())["text_config"]["vocab_size"] // 2
    with open(p, "a") as f: f.write(json.dumps(dict(id="mid", input_ids=list(range(mid, mid + 50)))) + "\n")
    assert main(args(ck, p, tmp_path / "done", "--cache", tmp_path / "c")) == 0
    assert main(args(ck, p, tmp_path / "half")) == 0
    (tmp_path / "half" / MANIFEST).unlink(); (tmp_path / "half" / "shard-00000.safetensors").unlink()
    old, before = checkpoint_fingerprint(ck), load_embeddings(tmp_path / "done")["mid"].clone()
    capsys.readouterr()
    _rewrite_rows(ck)
    assert checkpoint_fingerprint(ck) != old
    for out in ("done", "half"):   # finished, resumed: refused, the checkpoint named
        assert main(args(ck, p, tmp_path / out)) == 2, out
        err = capsys.readouterr().err
        assert f"holds another job's embeddings: checkpoint '{old}' there" in err and "--overwrite" in err, err
    assert main(args(ck, p, tmp_path / "new", "--cache", tmp_path / "c")) == 0
    assert "0 cache hits" in capsys.readouterr().out
    assert not torch.equal(load_embeddings(tmp_path / "new")["mid"], before), SEED


def test_damaged_shards_are_repaired_by_the_same_command(vocab_ckpt, tmp_path, capsys):
    "A truncated, a bit-flipped and two swapped shards: the same command names each, encodes those batches again."
    p, out = prompts(tmp_path / "p.jsonl", SEED), tmp_path / "out"
    assert main(args(vocab_ckpt, p, out)) == 0
    ref = {k: t.clone() for k, t in load_embeddings(out).items()}
    s = sorted(out.glob("shard-*.safetensors"))
    assert len(s) >= 4, (len(s), SEED)
    s[0].write_bytes(s[0].read_bytes()[:-100])                                # truncated
    b = bytearray(s[1].read_bytes()); b[-7] ^= 0x20; s[1].write_bytes(b)     # one bit
    b2, b3 = s[2].read_bytes(), s[3].read_bytes(); s[2].write_bytes(b3); s[3].write_bytes(b2)   # swapped
    with pytest.raises(ValueError, match="cannot be read"): load_embeddings(out)   # as the reader finds it
    capsys.readouterr()
    assert main(args(vocab_ckpt, p, out)) == 0
    got = capsys.readouterr()
    assert "nothing to do" not in got.out and "encoded " in got.out, got.out
    assert f"{s[0]}: truncated or grown" in got.err and f"{s[1]}: damaged" in got.err, got.err
    assert f"{s[2]}: holds the bytes of {s[3].name}" in got.err and f"{s[3]}: holds the bytes of {s[2].name}" in got.err
    emb = load_embeddings(out)
    assert sorted(emb) == sorted(ref)
    for k, t in ref.items(): assert torch.equal(emb[k], t), (k, SEED)   # exact mode: the same bits again
    assert main(args(vocab_ckpt, p, out)) == 0 and "nothing to do" in capsys.readouterr().out


def test_lost_job_json_is_rebuilt(vocab_ckpt, tmp_path, capsys):
    "job.json deleted from a finished and from a half-done output: rebuilt by the same command; another is told why."
    p = prompts(tmp_path / "p.jsonl", SEED)
    for out in (tmp_path / "done", tmp_path / "half"):
        assert main(args(vocab_ckpt, p, out)) == 0
        job = (out / "job.json").read_text()
        (out / "job.json").unlink()
    (tmp_path / "half" / MANIFEST).unlink(); (tmp_path / "half" / "shard-00001.safetensors").unlink()
    capsys.readouterr()
    assert main(args(vocab_ckpt, p, tmp_path / "done", "--mode", "fast")) == 2   # another job: refused, told why
    err = capsys.readouterr().err
    assert "has lost its job.json, and its shards and manifest are another job's" in err and "--overwrite" in err, err
    assert main(args(vocab_ckpt, p, tmp_path / "done")) == 0
    got = capsys.readouterr()
    assert "nothing to do" in got.out and "job.json was missing: rebuilt" in got.err, (got.out, got.err)
    assert main(args(vocab_ckpt, p, tmp_path / "half")) == 0
    got = capsys.readouterr()
    assert "encoded " in got.out and "nothing to do" not in got.out, got.out
    assert (tmp_path / "half" / "job.json").read_text() == job
    assert len(load_embeddings(tmp_path / "half")) == len(load_embeddings(tmp_path / "done")) == 12
