"""The package is a stack: the import graph (drawn from the sources) has no loop and no upward arrow; entry points
import only what they need (counted in fresh processes)."""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "qwen3vl_l50_nbdev"
# the house, low to high: a room is a top-level module or a wing (a subpackage, counted as one room); a room imports
# only rooms to its left. settings, files, metrics, provenance and deadline import nothing of ours; dist only deadline.
ROOMS = ("settings files metrics provenance deadline dist config tiny model quant runners fast weights inputs encoder "
         "check dataset cli").split()
FLOORS = 9          # the longest chain of rooms importing rooms
LINES = 500         # a module past this is two topics
TEST_ONLY = "testing"   # imports anything; nothing in the core imports it
HEAVY = ("transformers", "pandas", "matplotlib")


def _name(p: Path) -> str:
    return ".".join(p.relative_to(PKG).with_suffix("").parts).removesuffix(".__init__")


def _top(tree: ast.Module) -> list[ast.stmt]:
    "The statements run when the module is imported: its body and the bodies of its top-level `try`s."
    return tree.body + [n for t in tree.body if isinstance(t, ast.Try) for n in t.body]


def imports(p: Path, top: bool = False) -> set[str]:
    ("The package's modules that `p` imports anywhere (top level or inside a function), from its syntax tree; `top`: "
     "only those imported when `p` is.")
    me, found = list(p.relative_to(PKG).with_suffix("").parts), set()   # a package's __init__ sits inside it
    tree = ast.parse(p.read_text())
    for n in (_top(tree) if top else ast.walk(tree)):
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


def room(m: str) -> str:
    "The room a module lives in: its wing (`model.text` -> `model`) or itself."
    return m.split(".")[0]


def rooms(g: dict[str, set[str]]) -> dict[str, set[str]]:
    "Room -> the other rooms its modules import (the harness, the test module and `python -m`'s entry left out)."
    out = {}
    for m, deps in g.items():
        r = room(m)
        if r in ("analysis", "__init__", "__main__", TEST_ONLY): continue   # `python -m`: the CLI's main
        out.setdefault(r, set()).update(room(d) for d in deps if room(d) != r)
    return out


def floors(g: dict[str, set[str]]) -> dict[str, int]:
    "Each room's floor: 1 + the highest floor it imports (the room graph has no circle, checked before)."
    memo = {}
    def f(r): 
        if r not in memo: memo[r] = 1 + max((f(d) for d in g[r] if d in g), default=0)
        return memo[r]
    return {r: f(r) for r in g}


def test_floors_counted():
    "The floor count sees a chain (the test can fail)."
    assert floors({"a": set(), "b": {"a"}, "c": {"b", "a"}}) == {"a": 1, "b": 2, "c": 3}
    assert room("model.text") == "model" and room("config") == "config"


def test_stack_order():
    ("Every room imports only rooms below it: no circle between wings, no upward arrow, at most FLOORS floors; the "
     "core never imports the harness, the CLI or the test module.")
    g = rooms(graph())
    if lost := sorted(set(g) - set(ROOMS)):
        pytest.fail(f"{lost}: not in the house; place each in ROOMS (tests/test_layout.py) between what it imports "
                    "and what imports it")
    up = [f"{r} -> {d}" for r in g for d in g[r]
          if d in ("analysis", TEST_ONLY) or d not in ROOMS or ROOMS.index(d) > ROOMS.index(r)]
    assert up == [], f"imports of a higher room: {up}"
    assert cycles(g) == [], f"circles between rooms: {cycles(g)}"
    fl = floors(g)
    print({r: fl[r] for r in ROOMS if r in fl})
    assert max(fl.values()) <= FLOORS, f"{max(fl.values())} floors (at most {FLOORS}): {fl}"


def test_module_size():
    "No module of the package over LINES lines (the generated index left out)."
    big = {_name(p): n for p in PKG.rglob("*.py") if p.name != "_modidx.py"
           if (n := len(p.read_text().splitlines())) > LINES}
    assert big == {}, f"modules over {LINES} lines, each two topics: {big}"


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
    assert "torch._dynamo" not in mods and not _fast(mods), _fast(mods)


def _fast(mods: set[str]) -> list[str]:
    "Fast mode's modules among `mods`: exact mode, which must give HF's bits, depends on none of them."
    return sorted(m for m in mods if m == "qwen3vl_l50_nbdev.fast" or m.startswith("qwen3vl_l50_nbdev.fast."))


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
    assert not _fast(full), f"exact mode's encode imported fast mode: {_fast(full)}"
    del torch



def test_triton_only_in_the_kernel():
    ("Importing Triton and registering a Triton op cost a fresh process seconds: only `quant.kernel` imports Triton "
     "at its top level, and no module imports `quant.kernel` at its top level (block FP8 imports it on its first CUDA "
     "call).")
    bad = []
    for p in PKG.rglob("*.py"):
        names = {a.name for n in _top(ast.parse(p.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))
                 for a in n.names} | {n.module or "" for n in _top(ast.parse(p.read_text()))
                                       if isinstance(n, ast.ImportFrom)}
        if any(x.split(".")[0] == "triton" for x in names) and _name(p) != "quant.kernel": bad.append(f"{p}: triton")
        if "quant.kernel" in imports(p, top=True): bad.append(f"{p}: quant.kernel")
    assert bad == [], bad


def test_encode_prompt_with_tokenizer_files_imports_no_transformers(tmp_path):
    ("A real-format checkpoint ships tokenizer.json and a chat template: exact `encode --prompt` reads both without "
     "importing transformers (seconds in a fresh process).")
    from qwen3vl_l50_nbdev.config import tiny
    from qwen3vl_l50_nbdev.inputs.processor import with_qwen_vocab
    from qwen3vl_l50_nbdev.tiny import make_tiny_checkpoint
    from qwen3vl_l50_nbdev.inputs.tokenizer import byte_tokenizer
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
    _modules("import sys\nimport qwen3vl_l50_nbdev.inputs.tokenizer as t\nseen, pre = [], t.prefetch\n"
             "def prefetch(path): seen.append('torch' in sys.modules); pre(path)\nt.prefetch = prefetch\n"
             f"from qwen3vl_l50_nbdev.cli import main\nassert main({argv!r}) == 0\n"
             "assert seen == [False] and not t._PREFETCHED, (seen, t._PREFETCHED)")


def _rows(text: str, head: str) -> list[list[str]]:
    "The rows of the README table whose header starts with `head`, as lists of cells."
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {head} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"): break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])])   # `\|` is a cell's own
    return rows


def _ticked(cell: str) -> list[str]:
    return [x.strip("`") for x in cell.split(", ") if x.strip()]


def test_readme_map():
    ("The README's map of the house is the code's: its rooms in ROOMS order, each wing with every module it has, and "
     "a line for every notebook.")
    text = (PKG.parent / "README.md").read_text(encoding="utf-8")
    wings = _rows(text, "room")
    shown = [r[0].strip("`").removesuffix("/") for r in wings]
    assert shown == [*ROOMS, TEST_ONLY, "analysis"], f"the README's rooms {shown}, the house's {ROOMS}"
    for r, (_, mods, what) in zip(shown, wings):
        if r == "analysis": continue
        have = sorted(m for m in (_name(p) for p in PKG.rglob("*.py") if not p.name.startswith("_"))
                      if room(m) == r and m != r)
        assert sorted(_ticked(mods)) == [m.removeprefix(f"{r}.") for m in have], (r, mods, have)
        assert what, f"{r}: say what it holds"
    nbs = sorted(str(p.relative_to(PKG.parent / "nbs").with_suffix("")) for p in (PKG.parent / "nbs").rglob("*.ipynb")
                 if p.name != "index.ipynb" and ".ipynb_checkpoints" not in p.parts)
    listed = sorted(r[0].strip("`") for r in _rows(text, "notebook"))
    assert listed == nbs, f"notebooks missing from the README: {sorted(set(nbs) - set(listed))}; " \
                          f"listed but gone: {sorted(set(listed) - set(nbs))}"


def test_encode_prompt_reads_config_once(tmp_path):
    ("One command, one read of the checkpoint's config.json: exact `encode --prompt` passes one `CheckpointDir` to the "
     "processor, the encoder and the loader's checks (counted in a fresh process).")
    from qwen3vl_l50_nbdev.config import tiny
    from qwen3vl_l50_nbdev.inputs import with_qwen_vocab
    from qwen3vl_l50_nbdev.tiny import make_tiny_checkpoint
    ckpt = make_tiny_checkpoint(tmp_path / "m", with_qwen_vocab(tiny(selected_layer=2)))
    argv = ["encode", "--model", str(ckpt), "--layer", "2", "--prompt", "a harbour at dawn", "--out",
            str(tmp_path / "h.safetensors")]
    code = ("import builtins, io, json, sys\nopened, _open = [], io.open\n"
            "def counting(f, *a, **k):\n    opened.append(str(f)); return _open(f, *a, **k)\n"
            "builtins.open = io.open = counting\n"
            f"from qwen3vl_l50_nbdev.cli import main\nassert main({argv!r}) == 0\n"
            f"print(json.dumps([f for f in opened if f == {str(ckpt / 'config.json')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=PKG.parent,
                         env=os.environ | {"PYTHONPATH": str(PKG.parent), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(json.loads(out.stdout.splitlines()[-1])) == 1, out.stdout[-500:]
