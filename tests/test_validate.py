"`qwen3vl-l50 validate` end to end: TP 1 and 2 on gloo, pictures and videos, every verdict path, bad input first."
import json
import os
import re
import subprocess
import sys
from argparse import Namespace

import pandas as pd
import pytest

from qwen3vl_l50_nbdev.cli import main, parser
from qwen3vl_l50_nbdev.cli.validate import validate_kwargs
from qwen3vl_l50_nbdev.check import validate as V
from qwen3vl_l50_nbdev.check import report as R
from qwen3vl_l50_nbdev.check.contract import HF_COLUMNS, Variant
from qwen3vl_l50_nbdev.check.hf import Checkpoint
from qwen3vl_l50_nbdev.inputs.pixels import sample_photo
from qwen3vl_l50_nbdev.settings import Numerics

ENV = os.environ | {"OMP_NUM_THREADS": "1"}
CLI = [sys.executable, "-m", "qwen3vl_l50_nbdev.cli"]


@pytest.fixture(scope="module")
def ckpt(vocab_ckpt): return vocab_ckpt   # conftest's: one tiny real-vocabulary checkpoint for the session


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    "A prompts file: a photograph, an MP4 clip (PyAV), an animated GIF, text alone; the paths relative to the file."
    import av
    import numpy as np
    from PIL import Image
    d = tmp_path_factory.mktemp("prompts")
    photo = Image.open(sample_photo()).resize((40, 48))
    photo.save(d / "photo.png")
    clip = [np.asarray(photo.crop((i, i, 32 + i, 32 + i))) for i in range(4)]
    with av.open(str(d / "clip.mp4"), "w") as box:
        s = box.add_stream("libx264", rate=4)
        s.width, s.height, s.pix_fmt = 32, 32, "yuv420p"
        for f in clip: box.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        box.mux(s.encode())
    frames = [Image.fromarray(f) for f in clip]
    frames[0].save(d / "spin.gif", save_all=True, append_images=frames[1:], duration=250, loop=0)
    lines = [dict(id="photo", text="A portrait of a naval officer.", images=["photo.png"]),
             dict(id="mp4", text="What happens in the clip?", videos=["clip.mp4"]),
             dict(id="gif", text="And in this one?", videos=["spin.gif"], images=["photo.png"]),
             dict(text="A lighthouse at dusk.")]
    (d / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d / "p.jsonl"


def args(ckpt, prompts, out, **kw) -> Namespace:
    "validate's parsed options, as the command line would give them."
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    return parser().parse_args(["validate", "--model", str(ckpt), "--prompts", str(prompts), "--out", str(out),
                                "--max-pixels", "4096", *flags])


def test_tp_1_and_2_on_gloo(ckpt, prompts, tmp_path):
    "`--nproc 2 --tp 1,2`: TP 1 bitwise HF bf16 at every layer, TP 2 (both reductions) within 1.25x; the report."
    out = tmp_path / "r"
    r = subprocess.run([*CLI, "validate", "--nproc", "2", "--model", str(ckpt), "--prompts", str(prompts),
                        "--out", str(out), "--tp", "1,2", "--reduce", "fp32,bf16", "--max-pixels", "4096"],
                       env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "PASS: every variant within the numerics contract" in r.stdout, r.stdout
    assert "variants x prompts" in r.stderr   # the progress bar, once (rank 0)
    df = R.load_results(out)
    test_variants = ["tp1 exact", "tp2 fp32-reduce exact", "tp2 bf16-reduce exact"]
    assert list(dict.fromkeys(df.variant)) == [R.HF_BF16, *test_variants]
    assert set(df.prompt) == {"photo", "mp4", "gif", "4"} and set(df.kind) == {"accumulated", "local", "output"}
    assert df[df.variant == "tp1 exact"].bitwise_hf.all()
    assert not df[df.variant.str.startswith("tp2") & (df.kind == "output")].bitwise_hf.all()   # TP 2: other sums
    v = R.verdicts(df)
    assert v.passed.all() and (v[v.rule == "tp>1"].worst_ratio <= 1.25).all(), v
    assert df.world.eq(2).all() and df.checkpoint_sha.nunique() == 1 and df.command.str.contains("validate").all()
    # as typed, not rebuilt
    assert df.command.str.contains(" -m qwen3vl_l50_nbdev.cli validate --nproc 2 --model ").all(), df.command[0]
    assert len(str(df.peak_gib_ranks.iloc[-1]).split(";")) == 2   # a peak per rank
    assert {p.name for p in out.iterdir()} == {"results.csv", "report.html", "report.ipynb", V.OWNED}
    nb = json.loads((out / "report.ipynb").read_text())
    assert any("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))


def test_verdict_paths_in_process(ckpt, prompts, tmp_path, capsys):
    "A layer made deliberately wrong: exact names its first differing layer, fast fails 1.1x; FP8 passes; exit 1."
    def wrong(enc, v):
        if v.numerics.quant is None: enc.text.layers[2].mlp.down_proj.weight.data.mul_(1.5)
    a = args(ckpt, prompts, tmp_path / "bad", mode="exact,fast", quant="none,fp8")
    assert V.run_validate(**validate_kwargs(a), perturb=wrong) == 1
    out = capsys.readouterr().out
    assert "FAIL tp1 exact: bitwise equal to HF bf16 at every layer; worst prompts: photo (layer 3 accumulated" in out
    assert re.search(r"FAIL tp1 fast: rel L2 <= 1.1 x HF bf16's own; worst prompts: \w+ \(\d+\.\d\dx\)", out), out
    assert "FAIL: 2 of 4 variant(s) outside the contract" in out
    v = R.verdicts(R.load_results(tmp_path / "bad"))
    assert v.passed.tolist() == [False, False, True, True], v
    assert (tmp_path / "bad" / "report.html").read_text().count('class="fail">FAIL') == 2


def _rows(variant: Variant | None, rels: dict, bitwise: bool = True) -> list[dict]:
    "Output rows of `variant` (None: HF bf16's) with rel L2 `rels[prompt]`."
    name, cols = (R.HF_BF16, HF_COLUMNS) if variant is None else (variant.name, variant.columns())
    return [dict(variant=name, **cols, prompt=p, kind="output", layer=3, rel_l2=x, cosine=1.0,
                 max_abs=0.1, bitwise_hf=bitwise, max_abs_hf=0.0, time_s=0.01, peak_gib=1.0) for p, x in rels.items()]


@pytest.mark.parametrize("variant,bound", [(Variant(1, Numerics(mode="fast")), 1.1), (Variant(2, Numerics()), 1.25),
                                           (Variant(2, Numerics(reduce="bf16", mode="fast")), 1.25),
                                           (Variant(1, Numerics(quant="fp8", fp8_granularity="tensor")), 16),
                                           (Variant(4, Numerics("bf16", "fp32", "fp8", "channel", mode="fast")), 16)])
def test_every_rule_at_its_bound(variant, bound):
    "Each rule passes just inside its bound and fails just outside, naming the worst prompt; exact: the bits."
    hf = _rows(None, dict(a=0.01, b=0.02))
    for x, ok in ((0.999 * bound, True), (1.001 * bound, False)):   # b is well inside: a decides, and is named
        v = R.verdicts(pd.DataFrame(hf + _rows(variant, dict(a=0.01 * x, b=0.02))))
        assert v.passed.tolist() == [ok] and v.worst_prompts[0].startswith(f"a ({x:.2f}x)"), (x, v)
    exact = R.verdicts(pd.DataFrame(hf + _rows(Variant(), dict(a=0.01, b=0.02), bitwise=False)))
    assert exact.passed.tolist() == [False] and "a (layer 3 output" in exact.worst_prompts[0], exact


@pytest.fixture()
def no_weights(monkeypatch):
    "Reading weights fails the test: bad input must stop before."
    def boom(*a, **k): raise AssertionError("weights were read before the input was checked")
    monkeypatch.setattr(V, "reference", boom)
    monkeypatch.setattr(V.Encoder, "from_pretrained", boom)
    monkeypatch.setattr(Checkpoint, "read", boom)


def _bad(tmp_path, text: str):
    f = tmp_path / "bad.jsonl"; f.write_text(text)
    return f


@pytest.mark.parametrize("case,msg", [
    ("json", "bad.jsonl:2: not JSON"),
    ("text", 'bad.jsonl:1: no "text"'),
    ("missing", "bad.jsonl:1: image nope.png: no such file"),
    ("unreadable", "bad.jsonl:2: image"),
    ("video", "bad.jsonl:1: video"),
    ("reduce", "--reduce 'fp16': unknown value 'fp16'; choose from bf16, fp32, fp32-partials"),
    ("mode", "--mode 'exact,turbo': unknown value 'turbo'"),
    ("tp3", "--tp 3: tensor-parallel size 3 does not divide"),
    ("tp2", "--tp 2 needs 2 ranks but this run has 1: add --nproc 2"),
    ("out-file", "is a file: name a directory"),
    ("out-under-file", "is not writable"),
    ("out-theirs", "holds results.csv, not written by validate (or changed since): move them away"),
    ("config", "tensor(s) with the wrong shape: model.language_model.layers.0.mlp.down_proj.weight has shape"),
])
def test_bad_input_stops_first(case, msg, ckpt, prompts, tmp_path, capsys, no_weights):
    "Exit 2 with one line naming what and where, before any weight is read."
    base = prompts.parent
    (base / "notes.png").write_text("not a picture")
    (tmp_path / "file").write_text("")
    p, out, kw = prompts, tmp_path / "o", {}
    if case == "json": p = _bad(base, '{"text": "a"}\n{"text": "b",\n')
    if case == "text": p = _bad(base, '{"images": ["photo.png"]}\n')
    if case == "missing": p = _bad(base, '{"text": "a", "images": ["nope.png"]}\n')
    if case == "unreadable": p = _bad(base, '{"text": "a"}\n{"text": "b", "images": ["notes.png"]}\n')
    if case == "video": p = _bad(base, '{"text": "a", "videos": ["notes.png"]}\n')
    if case == "reduce": kw = dict(tp="1,2", reduce="fp16")
    if case == "mode": kw = dict(mode="exact,turbo")
    if case == "tp3": kw = dict(tp="1,3")
    if case == "tp2": kw = dict(tp="2")
    if case == "out-file": out = tmp_path / "file"
    if case == "out-under-file": out = tmp_path / "file" / "report"
    if case == "out-theirs": out.mkdir(); (out / "results.csv").write_text("my own table")
    model = ckpt
    if case == "config":   # config.json disagrees with the weights: said as encode says it, before the reference
        model = tmp_path / "m"; model.mkdir()
        for f in ckpt.iterdir(): (model / f.name).symlink_to(f)
        c = json.loads((ckpt / "config.json").read_text()); c["text_config"]["intermediate_size"] *= 2
        (model / "config.json").unlink(); (model / "config.json").write_text(json.dumps(c))
    flags = [f"--{k}={v}" for k, v in kw.items()]
    rc = main(["validate", "--model", str(model), "--prompts", str(p), "--out", str(out), "--max-pixels", "4096",
               *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("qwen3vl-l50 validate: error: "), err
    assert msg in err, err
    if not case.startswith("out"): assert not out.exists()   # bad input leaves no --out behind
    if case == "out-theirs": assert sorted(f.name for f in out.iterdir()) == ["results.csv"]


def test_bad_input_once_under_torchrun(ckpt, prompts, tmp_path):
    "Under torchrun every rank finds the bad line: it is said once, exit 2, no launcher traceback."
    p = _bad(prompts.parent, '{"text": "a"}\n{"id": "x"}\n')
    r = subprocess.run([*CLI, "validate", "--nproc", "2", "--model", str(ckpt), "--prompts", str(p), "--out",
                        str(tmp_path / "o"), "--tp", "2"], env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.count('bad.jsonl:2: no "text"') == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_fp64_reference_and_fingerprint(ckpt, prompts, tmp_path):
    "`--ref-dtype fp64`: the same verdict against a reference below fp32's noise; the checkpoint's fingerprint."
    a = args(ckpt, prompts, tmp_path / "r64", ref_dtype="fp64")
    assert V.run_validate(**validate_kwargs(a)) == 0
    df = R.load_results(tmp_path / "r64")
    assert df.ref_dtype.eq("fp64").all() and df.checkpoint_sha.iloc[0] == V.checkpoint_fingerprint(ckpt)
    assert df[df.variant == "tp1 exact"].bitwise_hf.all()


def test_help():
    r = subprocess.run([*CLI, "validate", "--help"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and "usage: qwen3vl-l50 validate" in r.stdout
    for flag in ("--tp", "--reduce", "--quant", "--fp8-granularity", "--mode", "--ref-dtype", "--nproc", "--prompts"):
        assert flag in r.stdout, flag


def test_report_replaced_said_interrupted_marked_full_disk_named(ckpt, prompts, tmp_path, capsys, monkeypatch):
    ("An earlier report is said to be replaced; an interrupted run leaves INCOMPLETE, not the old PASS report; a "
     "results.csv that cannot be written is named, and none is left half-written.")
    out = tmp_path / "o"; out.mkdir()
    for f in ("results.csv", "report.html"): (out / f).write_text("an old PASS")
    V.mark_owned(out, ["results.csv", "report.html"])   # as a run records its report
    def stop(enc, v): raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt): V.run_validate(**validate_kwargs(args(ckpt, prompts, out)), perturb=stop)
    assert "replacing the earlier report in" in capsys.readouterr().out
    assert sorted(f.name for f in out.iterdir()) == [V.OWNED, "INCOMPLETE"]
    def full(self, path, **kw): raise OSError(28, "No space left on device")
    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    with pytest.raises(ValueError, match="results.csv cannot be written \\(No space left on device\\)"):
        V.run_validate(**validate_kwargs(args(ckpt, prompts, out)))
    assert sorted(f.name for f in out.iterdir()) == [V.OWNED, "INCOMPLETE"]
    monkeypatch.undo()
    assert V.run_validate(**validate_kwargs(args(ckpt, prompts, out))) in (0, 1)
    assert sorted(f.name for f in out.iterdir() if not f.name.startswith(".")) == ["report.html", "report.ipynb",
                                                                                  "results.csv"]


def test_full_disk_found_before_the_run(ckpt, prompts, tmp_path):
    ("A disk too small for the report (a file size limit) is found before the reference runs: one line, rc 2, and "
     "no --out left behind.")
    import resource
    import signal
    def small():   # larger than any file the run writes before its report, smaller than the report's estimate
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (600_000, 600_000))
    out = tmp_path / "new" / "o"
    r = subprocess.run([*CLI, "validate", "--model", str(ckpt), "--prompts", str(prompts), "--out", str(out),
                        "--max-pixels", "4096"], env=ENV, capture_output=True, text=True, timeout=600,
                       preexec_fn=small)
    assert r.returncode == 2 and f"--out {out} cannot hold the report (about" in r.stderr, r.stdout + r.stderr[-2000:]
    assert "variants x prompts" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not out.exists()


def test_report_notebook_whole_or_not_at_all(tmp_path, monkeypatch):
    "report.ipynb whose execution fails half-way: the earlier report.ipynb stays whole, no temporary file is left."
    import shutil
    from execnb.shell import CaptureShell
    from qwen3vl_l50_nbdev.analysis.report import data_dir
    shutil.copy(data_dir() / "validate_h200.csv", tmp_path / "results.csv")
    (tmp_path / "report.ipynb").write_text("the earlier report")
    def half(self, src, dest=None, **kw):
        with open(dest, "a") as f: f.write("half a notebook")
        raise RuntimeError("the kernel died")
    monkeypatch.setattr(CaptureShell, "execute", half)
    with pytest.raises(RuntimeError, match="the kernel died"): R.report_notebook(tmp_path)
    assert (tmp_path / "report.ipynb").read_text() == "the earlier report"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["report.ipynb", "results.csv"]
