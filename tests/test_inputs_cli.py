"A checkpoint's chat template, missing packages, the typed command line: each said in one line by the CLI, exit 2."
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

ENV = os.environ | {"OMP_NUM_THREADS": "1"}


def cli(argv, block=(), timeout=300):
    "`qwen3vl-l50 argv` in a fresh process whose imports of the packages `block` fail (as if not installed)."
    code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in block) +
            "from qwen3vl_l50_nbdev.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def one_line(r, cmd: str) -> str:
    "The one error line of a run that ended with exit 2 and no traceback."
    err = r.stderr.strip()
    assert r.returncode == 2 and "Traceback" not in err, (r.returncode, err[-3000:])
    lines = [s for s in err.splitlines() if s.startswith(f"qwen3vl-l50 {cmd}: error: ")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.fixture
def model(vocab_ckpt, tmp_path):
    "A copy of the tiny checkpoint (its files linked) to add files to."
    d = tmp_path / "m"; d.mkdir()
    for f in vocab_ckpt.iterdir(): (d / f.name).symlink_to(f)
    return d


def encode(model, tmp_path):
    return ["encode", "--model", model, "--layer", "2", "--prompt", "A lighthouse at dusk.", "--out", tmp_path / "h.st"]


@pytest.mark.parametrize("case,msg", [
    ("syntax", "chat_template.jinja: line 2: Jinja syntax error: "),
    ("raise", "chat_template.jinja refused the prompt (TemplateError: this model takes no user turns"),
    ("latin1", "chat_template.jinja is not UTF-8 (byte 0xe9 at offset 7): save it as UTF-8"),
    ("no-default", "tokenizer_config.json has chat templates ['rag', 'tool_use'] and none called 'default'"),
])
def test_bad_chat_template(case, msg, model, tmp_path):
    "A template with a syntax error, one that refuses the prompt, one not in UTF-8, named ones without a default."
    jinja = model / "chat_template.jinja"
    if case == "syntax": jinja.write_text("{% for m in messages %}\n{{ m.role }\n{% endfor %}")
    if case == "raise": jinja.write_text("{{ raise_exception('this model takes no user turns') }}")
    if case == "latin1": jinja.write_bytes("{{ 'caf\xe9' }}".encode("latin-1"))
    if case == "no-default":
        named = [dict(name="tool_use", template="x"), dict(name="rag", template="y")]
        (model / "tokenizer_config.json").write_text(json.dumps(dict(chat_template=named)))
    line = one_line(cli(encode(model, tmp_path)), "encode")
    assert msg in line and str(model) in line, line


def test_named_templates_default_is_used(model, tmp_path):
    "transformers' list of named templates: the default one renders the prompt (its marker is in the ids' text)."
    from qwen3vl_l50_nbdev.inputs.processor import Processor
    named = [dict(name="tool_use", template="TOOLS"),
             dict(name="default", template="{% for m in messages %}[{{ m.role }}]{% endfor %}DEFAULT")]
    (model / "tokenizer_config.json").write_text(json.dumps(dict(chat_template=named)))
    proc = Processor.from_pretrained(model)
    assert proc.tokenizer.decode(proc("hi")["input_ids"]) == "[user]DEFAULT"


@pytest.mark.parametrize("package,cmd", [
    ("tiktoken", "encode"), ("jinja2", "encode"), ("tokenizers", "encode"), ("xxhash", "encode-dataset"),
    ("pyarrow", "encode-dataset"),
])
def test_missing_package(package, cmd, model, tmp_path):
    ("A package the command needs, not installed: one line naming it and its pip command, before any batch is "
     "encoded; the tokenizer files are not blamed.")
    if package == "jinja2": (model / "chat_template.jinja").write_text("{{ 'x' }}")
    if package == "tokenizers": (model / "tokenizer.json").write_text("{}")   # read by `tokenizers`
    out = tmp_path / "emb"
    if cmd == "encode": argv = encode(model, tmp_path)
    else:
        (tmp_path / "p.jsonl").write_text('{"text": "a"}\n{"text": "b c"}\n')
        argv = ["encode-dataset", "--model", model, "--prompts", tmp_path / "p.jsonl", "--out", out, "--layer", "2"]
    line = one_line(cli(argv, block=[package]), cmd)
    assert line.endswith(f"the Python package {package} is not installed (import {package} failed): pip install "
                         f"{package}"), line
    assert not list(out.glob("shard-*")), list(out.iterdir())


def test_command_recorded_as_typed(vocab_ckpt, tmp_path):
    "validate's provenance: the command line as it was typed (here `python -c ... validate ...`), not one rebuilt."
    (tmp_path / "p.jsonl").write_text('{"text": "A lighthouse at dusk."}\n')
    argv = ["validate", "--model", vocab_ckpt, "--prompts", tmp_path / "p.jsonl", "--out", tmp_path / "r b",
            "--layer", "2"]
    r = cli(argv)
    assert r.returncode == 0, r.stderr[-3000:]
    import pandas as pd
    got = pd.read_csv(tmp_path / "r b" / "results.csv").command.iloc[0]
    exe = os.path.basename(sys.executable)   # as typed where PATH finds it, else the path
    exe = exe if shutil.which(exe) == sys.executable else sys.executable
    assert got.startswith(shlex.quote(exe) + " -c ") and got.endswith(shlex.join(map(str, argv))), got
