"""The package is a stack: the import graph (drawn from the sources) has no loop and no upward arrow; entry points
import only what they need (counted in fresh processes)."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "qwen3vl_l50_nbdev"
# the core, low to high: a module imports only modules to its left (settings and files import nothing of ours)
ORDER = ("settings files config metrics provenance dist tp rope vision deepstack text tiny fp8 fp8_kernel fp8_blocks "
         "loading fast_layers overlap fast offload encoder tokenizer inputs prompts contract hf validate_report "
         "validate dataset cli").split()
TEST_ONLY = "testing"   # imports anything; nothing in the core imports it
HEAVY = ("transformers", "pandas", "matplotlib")


def _name(p: Path) -> str:
    return ".".join(p.relative_to(PKG).with_suffix("").parts).removesuffix(".__init__")


def imports(p: Path) -> set[str]:
    "The package's modules that `p` imports anywhere (top level or inside a function), from its syntax tree."
    me, found = _name(p).split("."), set()
    for n in ast.walk(ast.parse(p.read_text())):
        if isinstance(n, ast.ImportFrom):
            base = me[:len(me) - n.level] if n.level else []
            mod = ".".join(base + ([n.module] if n.module else [])) if n.level else (n.module or "")
            names = [mod] + [f"{mod}.{a.name}" for a in n.names]
        elif isinstance(n, ast.Import): names = [a.name for a in n.names]
        else: continue
        relative = isinstance(n, ast.ImportFrom) and n.level
        for x in names:
            if relative: found.add(x)
            elif x.startswith("qwen3vl_l50_nbdev."): found.add(x.removeprefix("qwen3vl_l50_nbdev."))
    return found


def graph() -> dict[str, set[str]]:
    "Module -> the package's modules it imports."
    files = {_name(p): p for p in PKG.rglob("*.py") if p.name != "_modidx.py" and _name(p)}
    out = {}
    for m, p in files.items():
        deps = set()
        for x in imports(p):
            while x and x not in files: x = x.rpartition(".")[0]
            if x and x != m: deps.add(x)
        out[m] = deps
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    "The strongly connected components of more than one module (Tarjan): each holds an import circle."
    index, low, stack, on, found = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index); stack.append(v); on.add(v)
        for w in g[v]:
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            c = [stack.pop()]
            while c[-1] != v: c.append(stack.pop())
            on.difference_update(c)
            if len(c) > 1: found.append(sorted(c))
    for v in g:
        if v not in index: visit(v)
    return found


def test_cycles_found():
    "The cycle finder finds a circle where there is one (the test can fail)."
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    g = graph()
    print("\n".join(f"{m} -> {' '.join(sorted(d))}" for m, d in sorted(g.items())))
    assert cycles(g) == [], f"import circles: {cycles(g)}"


def test_stack_order():
    "Every core module imports only modules below it; the core never imports the harness, the CLI or the test module."
    g = graph()
    core = [m for m in g if "." not in m and m not in ("analysis", "__init__")]
    if lost := sorted(set(core) - set(ORDER) - {TEST_ONLY}):
        pytest.fail(f"{lost}: not in the stack; place each in ORDER (tests/test_layout.py) between what it imports "
                    "and what imports it")
    up = [f"{m} -> {d}" for m in core if m != TEST_ONLY for d in g[m]
          if d.startswith("analysis") or d == TEST_ONLY or ORDER.index(d) > ORDER.index(m)]
    assert up == [], f"imports of a higher module: {up}"


def test_harness_apart():
    "The harness imports the core, never the other way (checked above); its own modules have no circle either."
    g = graph()
    assert not [c for c in cycles(g) if any(m.startswith("analysis") for m in c)]
    assert all(not d.startswith("analysis") for m, d0 in g.items() if not m.startswith("analysis") for d in d0)


def _modules(code: str, full: bool = False) -> set[str]:
    "The modules a fresh interpreter holds after running `code`: top-level names, or `full` dotted names."
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=300, cwd=PKG.parent,
                         env=os.environ | {"PYTHONPATH": str(PKG.parent)})
    assert out.returncode == 0, out.stderr[-2000:]
    return {m if full else m.split(".")[0] for m in json.loads(out.stdout.splitlines()[-1])}


def test_encoder_imports_nothing_heavy():
    "`import qwen3vl_l50_nbdev.encoder`: no pandas, matplotlib or transformers, and not the compiler (fast mode's)."
    mods = _modules("import qwen3vl_l50_nbdev.encoder", full=True)
    top = {m.split(".")[0] for m in mods}
    assert "torch" in top and not top & set(HEAVY), sorted(top & set(HEAVY))
    assert "torch._dynamo" not in mods and "qwen3vl_l50_nbdev.fast_layers" not in mods


def test_cli_help_imports_no_torch():
    "`qwen3vl-l50 --help` needs argparse, not torch: the CLI module and its parser import none of the heavy ones."
    mods = _modules("from qwen3vl_l50_nbdev.cli import parser\nparser().format_help()")
    assert not mods & {"torch", "numpy", *HEAVY}, sorted(mods & {"torch", "numpy", *HEAVY})


def _encode_modules(ckpt, out, *args: str) -> set[str]:
    "The modules a fresh interpreter holds after `qwen3vl-l50 encode --model ckpt --layer 2 ARGS --out out`."
    argv = ["encode", "--model", str(ckpt), "--layer", "2", *args, "--out", str(out)]
    return _modules(f"import torch; torch.set_num_threads(1)\nfrom qwen3vl_l50_nbdev.cli import main\n"
                    f"assert main({argv!r}) == 0", full=True)


def test_encode_imports_no_transformers(tmp_path):
    "Exact `encode` on an inputs file imports torch and the encoder: no transformers, pandas, matplotlib, compiler."
    import torch
    from safetensors.torch import save_file
    from qwen3vl_l50_nbdev.config import tiny
    from qwen3vl_l50_nbdev.tiny import make_tiny_checkpoint, synthetic_inputs
    cfg = tiny(selected_layer=2)
    ckpt = make_tiny_checkpoint(tmp_path / "m", cfg)
    save_file({k: v.contiguous() for k, v in synthetic_inputs(cfg).items()}, tmp_path / "in.safetensors")
    full = _encode_modules(ckpt, tmp_path / "h.safetensors", "--inputs", str(tmp_path / "in.safetensors"))
    mods = {m.split(".")[0] for m in full}
    assert (tmp_path / "h.safetensors").exists() and "torch" in mods and "safetensors" in mods
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))
    assert "torch._dynamo" not in full, "exact mode's encode loaded the compiler"
    del torch



def test_triton_only_in_fp8_kernel():
    ("Importing Triton and registering a Triton op cost a fresh process seconds: only `fp8_kernel` imports Triton at "
     "its top level, and no module imports `fp8_kernel` at its top level (block FP8 imports it on its first CUDA "
     "call).")
    bad = []
    for p in PKG.rglob("*.py"):
        body = ast.parse(p.read_text()).body
        top = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
        top += [n for t in body if isinstance(t, ast.Try) for n in t.body
                if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top for a in n.names} | {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
        if any(x.split(".")[0] == "triton" for x in names) and _name(p) != "fp8_kernel": bad.append(f"{p.name}: triton")
        if any(x.endswith("fp8_kernel") for x in names): bad.append(f"{p.name}: fp8_kernel")
    assert bad == [], bad


def test_encode_prompt_with_tokenizer_files_imports_no_transformers(tmp_path):
    ("A real-format checkpoint ships tokenizer.json and a chat template: exact `encode --prompt` reads both without "
     "importing transformers (seconds in a fresh process).")
    from qwen3vl_l50_nbdev.config import tiny
    from qwen3vl_l50_nbdev.inputs import with_qwen_vocab
    from qwen3vl_l50_nbdev.tiny import make_tiny_checkpoint
    from qwen3vl_l50_nbdev.tokenizer import byte_tokenizer
    ckpt = make_tiny_checkpoint(tmp_path / "m", with_qwen_vocab(tiny(selected_layer=2)))
    byte_tokenizer().to_transformers().save_pretrained(ckpt)
    (ckpt / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% for c in m.content %}{% if c.type == 'text' %}"
        "{{ c.text }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    out = tmp_path / "h.safetensors"
    full = _encode_modules(ckpt, out, "--prompt", "a harbour at dawn")
    mods = {m.split(".")[0] for m in full}
    assert out.exists() and (ckpt / "tokenizer.json").exists()
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))
    # the tokenizer is started before torch is imported, and the prompt takes that one
    argv = ["encode", "--model", str(ckpt), "--layer", "2", "--prompt", "a harbour at dawn", "--out",
            str(tmp_path / "h2.safetensors")]
    _modules("import sys\nimport qwen3vl_l50_nbdev.tokenizer as t\nseen, pre = [], t.prefetch\n"
             "def prefetch(path): seen.append('torch' in sys.modules); pre(path)\nt.prefetch = prefetch\n"
             f"from qwen3vl_l50_nbdev.cli import main\nassert main({argv!r}) == 0\n"
             "assert seen == [False] and not t._PREFETCHED, (seen, t._PREFETCHED)")
