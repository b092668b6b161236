"""Build the docs site without Quarto: nbdev's processors, then Sphinx + MyST-NB.

    python docs/build.py            # -> docs/_site/index.html

1. Find the notebooks: `nbs/*.ipynb` sorted (index.ipynb is the home page), then `nbs/analysis/*.ipynb` sorted.
2. Run nbdev's own docs processors on each (`FilterDefaults`: frontmatter, `#| hide`, `#| export`, the `show_doc`
   cells added after exported functions and classes, which are executed; doc links), in parallel workers.
   Every other cell keeps the output stored in the notebook: nothing is re-executed (CI runs `nbdev_test`).
3. Turn what Quarto would read into what MyST-NB reads: the YAML frontmatter becomes the title, Quarto cell options
   (`echo: false`, `output: asis`, `code-fold`) become cell tags or markdown, `show_doc` output becomes markdown with
   the anchors nbdev links to (`tp.html#shard`), and links to `doc_host` or to notebooks become relative links.
4. `sphinx-build` with docs/conf.py renders docs/_build/src into docs/_site (furo theme, Sphinx's offline search).
"""
import argparse
import ast
import dataclasses
import functools
import importlib
import inspect
import io
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tokenize
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
BUILD = DOCS / "_build"
SRC = BUILD / "src"
SITE = DOCS / "_site"


# -- notebooks and pages ------------------------------------------------------------------------------------------
def _cfg():
    from nbdev.config import get_config
    return get_config(path=ROOT)

def notebooks(nbs=None):
    "The notebooks in site order: nbs/index.ipynb, nbs/*.ipynb sorted, then nbs/analysis/*.ipynb sorted."
    nbs = Path(nbs or _cfg().nbs_path)
    ok = lambda p: not p.name.startswith(("_", "."))
    top = sorted(p for p in nbs.glob("*.ipynb") if ok(p) and p.name != "index.ipynb")
    analysis = sorted(p for p in (nbs / "analysis").glob("*.ipynb") if ok(p))
    return ([nbs / "index.ipynb"] if (nbs / "index.ipynb").exists() else []) + top + analysis

# The navigation's sections. The analysis notebooks are of two kinds, told apart by what a reader comes for: findings
# (a question answered with measured results, plots and tables) and the harness (the tools, benchmarks and runners that
# produce them). Every notebook in nbs/analysis is in exactly one of the lists (a new one fails the build till then).
FINDINGS = ("01_tp_size", "02_reduce_precision", "03_fp8", "03a_fp8_bench", "03b_fp8_blocks", "04_speed",
            "05_tp_speed", "06_offload_bench", "07_dataset", "09_startup")
HARNESS = ("00_weights", "00a_sweep", "00b_report", "00c_runner", "00d_timing", "04a_speed_bench",
           "04b_roofline_bench", "05a_tp_bench", "05b_tp_report", "05c_tp_comm", "05d_tp_profile",
           "07a_dataset_bench", "00e_cases", "08_validate_bench", "08a_load_bench", "09a_startup_bench")

def sections(nbs=None):
    """The navigation: [(caption, [notebook])], each section in notebook order; the home page (nbs/index.ipynb) is in
    none. Raises when an analysis notebook is in neither FINDINGS nor HARNESS, or a name there has no notebook."""
    nbs_list = notebooks(nbs)
    ana = [nb for nb in nbs_list if nb.parent.name == "analysis"]
    stems = {nb.stem for nb in ana}
    unsorted = sorted(stems - set(FINDINGS) - set(HARNESS))
    if unsorted: raise ValueError(f"nbs/analysis/{unsorted[0]}.ipynb is in neither FINDINGS nor HARNESS in "
                                  "docs/build.py: add it to the one it belongs to (findings answer a question with "
                                  "results; the harness measures)")
    stale = sorted((set(FINDINGS) | set(HARNESS)) - stems)
    if stale: raise ValueError(f"docs/build.py lists {stale} in FINDINGS or HARNESS, but nbs/analysis has no such "
                               "notebook: rename or remove the entry")
    return [("Library", [nb for nb in nbs_list if nb.parent.name != "analysis" and nb.name != "index.ipynb"]),
            ("Findings", [nb for nb in ana if nb.stem in FINDINGS]),
            ("Harness", [nb for nb in ana if nb.stem in HARNESS])]

def default_exp(nb):
    "The module a notebook exports to (`#| default_exp cli` -> `cli`; a package's `cli.__init__` -> `cli`), or None."
    for c in json.loads(Path(nb).read_text(encoding="utf-8"))["cells"]:
        m = c["cell_type"] == "code" and re.search(r"^\s*#\|\s*default_exp\s+(\S+)", "".join(c["source"]), re.M)
        if m: return m.group(1).removesuffix(".__init__")

def page_of(nb, nbs=None):
    "The page nbdev gives a notebook, relative to the site root: nbs/02_tp.ipynb -> tp.html (as in _modidx.py)."
    from nbdev.doclinks import _nbpath2html
    return _nbpath2html(Path(nb).relative_to(Path(nbs or _cfg().nbs_path))).as_posix()


# -- 2. nbdev processing (runs in a worker process) ----------------------------------------------------------------
_re_title = re.compile(r"^#\s+\S.*$\n?", re.MULTILINE)
_re_desc = re.compile(r"^>\s+\S.*$\n?", re.MULTILINE)

def _docs_after(cells, i):
    "The end of the run of show_doc cells that nbdev added right after cell `i`."
    j = i + 1
    while j < len(cells) and getattr(cells[j], "has_sd", False): j += 1
    return j

def _procs():
    from nbdev.processors import FilterDefaults, exec_show_docs, _do_eval, _is_showdoc, add_show_docs, mv_exports
    from nbdev.frontmatter import FrontmatterProc, _md2dict

    class AddShowDocs(add_show_docs):
        "nbdev's `add_show_docs`, with a cell's definitions in source order (nbdev inserts each right after the cell)."
        def begin(self):
            super().begin()
            cells, i = self.nb.cells, 0
            while i < len(cells):
                j = _docs_after(cells, i)
                cells[i + 1:j] = cells[i + 1:j][::-1]
                i = j

    class MvExports(mv_exports):
        "nbdev's `mv_exports`, moving every show_doc of an `#| exports` cell above its source, not only the first."
        def begin(self):
            cells, i = self.nb.cells, 0
            while i < len(cells):
                j = _docs_after(cells, i)
                if "exports" in getattr(cells[i], "directives_", {}): cells[i:j] = cells[i + 1:j] + [cells[i]]
                i = j

    class Frontmatter(FrontmatterProc):
        "nbdev's frontmatter, but the first cell's text after the title and the `> description` is kept, not dropped."
        def _update(self, f, cell):
            s = cell.get("source")
            if not s: return
            d = f(s)
            if not d: return
            self.fm.update(d)
            rest = _re_desc.sub("", _re_title.sub("", s, count=1), count=1) if f is _md2dict else ""
            cell.source = rest.strip() or None

    class ExecShowDocs(exec_show_docs):
        """nbdev's `exec_show_docs`, except that only `show_doc` cells take fresh outputs: every other cell keeps its
        stored output, and a failing cell that nbdev runs only because it has an import (nbdev's FAQ: keep imports in
        their own cells) is reported instead of failing the page."""
        def __call__(self, cell):
            if not self.nb.has_docs_ or not hasattr(self, "k") or not _do_eval(cell): return
            stored, sd = cell.get("outputs"), bool(_is_showdoc(cell))
            try: super().__call__(cell)
            except Exception as e:
                if sd or cell.directives_.keys() & {"export", "exports", "exec_doc"}: raise
                self.k.exc = None
                first = cell.source.strip().splitlines()[0][:60]
                self.nb.docs_warnings_.append(f"cell {cell.idx_} ({first!r}...) failed with "
                                              f"{type(e.__cause__ or e).__name__} "
                                              "while nbdev built show_doc's namespace; its stored output is used. "
                                              "nbdev runs every cell with an import: keep imports in their own cells")
            if not sd and stored is not None: cell.outputs = stored

    class Filter(FilterDefaults):
        def base_procs(self):
            swap = {FrontmatterProc: Frontmatter, exec_show_docs: ExecShowDocs, add_show_docs: AddShowDocs,
                    mv_exports: MvExports}
            return [swap.get(p, p) for p in super().base_procs()]
    return Filter()

# -- show_doc as the site shows it: a parameter table, a record's fields ---------------------------------------------
def _type(a):
    "An annotation as a reader writes it, without module paths: `Group | None`, `Tensor`, `list[int]`."
    if a is inspect.Parameter.empty: return ""
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])", "", a if isinstance(a, str) else inspect.formatannotation(a))

_re_modpath = re.compile(r"\b(?:[a-z_][a-z0-9_]*\.)+(?=[A-Z])")   # a module path before a class name

def _default(d):
    if d is inspect.Parameter.empty: return ""
    return d.__name__ if isinstance(d, type) or inspect.isfunction(d) else repr(d)

def _class_source(cls):
    """A class's source, dedented; None for a builtin. A class that a notebook defines (show_doc runs the notebook's
    cells) has no file: its source is that of the class of the same name that the package exports."""
    try: return textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError): pass
    modidx = importlib.import_module(f"{_cfg().lib_name}._modidx").d["syms"]
    for mod, syms in modidx.items():
        if f"{mod}.{cls.__qualname__}" in syms:
            try: return textwrap.dedent(inspect.getsource(getattr(importlib.import_module(mod), cls.__qualname__)))
            except (OSError, TypeError, AttributeError): return None

def record(cls):
    """A dataclass's or NamedTuple's header (its decorators and `class` line) and its fields in order, as rows (name,
    type, default, comment): type and default as the source writes them, the comment after the field on its line
    (docments). None for any other object."""
    if not isinstance(cls, type): return None
    if dataclasses.is_dataclass(cls): names = [f.name for f in dataclasses.fields(cls)]
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"): names = list(cls._fields)
    else: return None
    found, header = {}, f"class {cls.__name__}"
    for k in reversed(cls.__mro__):   # a field inherited from a base class is declared there
        src = _class_source(k)
        if src is None: continue
        tokens = tokenize.generate_tokens(io.StringIO(src).readline)
        comments = {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}
        node = ast.parse(src).body[0]
        for st in node.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                seg = lambda n: ast.get_source_segment(src, n) if n is not None else ""
                found[st.target.id] = (seg(st.annotation), seg(st.value), comments.get(st.end_lineno, ""))
        if k is cls: header = "\n".join(src.splitlines()[:node.body[0].lineno - 1]).rstrip()
    return header, [(n, *found.get(n, ("", "", ""))) for n in names]

def param_rows(obj):
    """Rows (name, type, default, comment) of a function's or a class's parameters and its return, when at least one
    has a docments comment (the comment after a parameter); else []."""
    from fastcore.docments import docments
    try: sig, docs = inspect.signature(obj), docments(obj, args_kwargs=True)
    except (TypeError, ValueError, OSError, SyntaxError): return []
    star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    rows = [(star.get(p.kind, "") + n, _type(p.annotation), _default(p.default), docs.get(n) or "")
            for n, p in sig.parameters.items() if n != "self"]
    if docs.get("return"): rows.append(("return", _type(sig.return_annotation), "", docs["return"]))
    return rows if any(r[3] for r in rows) else []

def doc_table(rows, what):
    "Rows (name, type, default, comment) as a markdown table whose first column is headed `what`."
    esc = lambda x: str(x).replace("|", "\\|")
    code = lambda x: f"`{esc(x)}`" if x else ""
    return "\n".join(["{.nbdev-params}", f"| {what} | type | default | details |", "|---|---|---|---|"]
                     + [f"| {code(n)} | {code(t)} | {code(d)} | {esc(c)} |" for n, t, d, c in rows])

@functools.cache
def _renderer():
    ("nbdev's show_doc renderer, plus a table of the parameters (when they have docments) or of a record's fields; "
     "one class per process, made from nbdev's own the first time.")
    from nbdev.showdoc import BasicMarkdownRenderer

    class Renderer(BasicMarkdownRenderer):
        def __init__(self, sym, **kw):
            super().__init__(sym, **kw)
            rec = record(self.sym)
            if rec: (self.dm, rows), what = rec, "field"
            else:
                rows, what = param_rows(self.sym), "parameter"
                if rows:   # the table says what each is: the signature above it without the comments
                    for v in self.dm.dm.values(): v["docment"] = None
                self.dm = _re_modpath.sub("", str(self.dm))   # `qwen3vl_l50_nbdev.dist.Group` -> `Group`
            self.table = f"\n\n{doc_table(rows, what)}\n" if rows else ""

        def _repr_markdown_(self): return super()._repr_markdown_() + self.table
    return Renderer

def _plain(o):
    "AttrDict/L trees -> json-able dicts, without nbdev's private `*_` attributes."
    if isinstance(o, dict): return {k: _plain(v) for k, v in o.items() if not k.endswith("_")}
    if isinstance(o, (list, tuple)) or type(o).__name__ == "L": return [_plain(v) for v in o]
    return o

def process(nb_path):
    "Run nbdev's docs processors on one notebook; returns the processed cells and what went wrong."
    os.chdir(ROOT)
    os.environ["IN_TEST"] = "1"   # as nbdev's own docs driver does
    import matplotlib; matplotlib.use("Agg")
    from execnb.nbio import read_nb
    import nbdev.showdoc
    nbdev.showdoc.BasicMarkdownRenderer = _renderer()   # show_doc's default renderer, read when it is called
    nb = read_nb(nb_path)
    nb.docs_warnings_ = []
    t0 = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _procs()(nb)
    quiet = ("Found cells containing imports", "`cell_number` in settings.ini is deprecated")
    msgs = nb.docs_warnings_ + [str(w.message).strip() for w in caught if not any(q in str(w.message) for q in quiet)]
    return dict(path=str(nb_path), cells=_plain(nb.cells), metadata=_plain(nb.metadata),
                warnings=msgs, seconds=round(time.time() - t0, 1))


# -- 3. Quarto flavour -> MyST-NB flavour ---------------------------------------------------------------------------
def _src(c): return "".join(c.get("source") or "")
def _md(text): return dict(cell_type="markdown", metadata={}, source=text)
def _code(text, outputs=(), tags=()):
    return dict(cell_type="code", metadata={"tags": list(tags)} if tags else {}, source=text, outputs=list(outputs),
                execution_count=None)

def pandoc_id(text):
    ("The id Quarto (pandoc) gives a heading, which nbdev's doc links use: "
     "`EncoderConfig.from_hf` -> `encoderconfig.from_hf`.")
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)            # links -> their text
    text = re.sub(r"[`*]|<[^>]+>|\{[^}]*\}", "", text).strip().lower()
    text = re.sub(r"[^\w\s.-]", "", text)
    text = re.sub(r"\s+", "-", text)
    return re.sub(r"^[^a-z]+", "", text)

_re_opt = re.compile(r"^\s*#\|\s*([\w-]+)\s*:\s*(.*?)\s*$")
def _options(src):
    "Split Quarto cell options (`#| key: value` lines at the top) from the code."
    lines, opts = src.splitlines(), {}
    while lines and re.match(r"^\s*#\|", lines[0]):
        m = _re_opt.match(lines.pop(0))
        if m: opts[m.group(1)] = m.group(2).strip("'\"")
    return opts, "\n".join(lines).strip("\n")

def _output_text(o):
    if o.get("output_type") == "stream": return "".join(o.get("text", ""))
    d = o.get("data", {})
    return "".join(d.get("text/markdown") or d.get("text/plain") or "")

_re_src_link = re.compile(r"\[source\]\(([^)\s]+)\)\{[^}]*\}")
def _showdoc_md(text):
    "show_doc's markdown: no leading rule (a section may not start with one), a plain source link, nbdev's anchor."
    text = re.sub(r"^\s*---\s*\n", "", text)
    text = _re_src_link.sub(r'<a class="nbdev-source" href="\1">source</a>', text)
    return text

def _anchored(text):
    "Put `<a id=pandoc-id>` before each heading whose docutils id differs, so nbdev's and Quarto's anchors resolve."
    from docutils.nodes import make_id
    out, fence = [], False
    for line in text.split("\n"):
        if re.match(r"^\s*(```|~~~)", line): fence = not fence
        m = None if fence else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m and len(m.group(1)) > 1:
            pid = pandoc_id(m.group(2))
            if pid and pid != make_id(m.group(2)): out += [f'<a id="{pid}"></a>', ""]
        out.append(line)
    return "\n".join(out)

_re_dmath = re.compile(r"(`+).*?\1|\$\$(.+?)\$\$", re.DOTALL)
def display_math(text):
    ("`$$...$$` as a block of its own: Quarto renders display math inside a paragraph, MyST only when it stands "
     "apart (else it reads `$` + inline math + `$`). Code spans and fences keep their dollars.")
    return _re_dmath.sub(lambda m: m.group(0) if m.group(2) is None else f"\n\n$$\n{m.group(2).strip()}\n$$\n\n", text)

def headings(text):
    "pandoc ids of the markdown headings in `text` (outside code fences)."
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.MULTILINE | re.DOTALL)
    return {pandoc_id(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.MULTILINE)}

def to_myst(proc):
    "Processed nbdev cells -> a notebook MyST-NB renders from stored outputs; returns (cells, title, anchors)."
    import yaml
    cells, title = [], None
    for c in proc["cells"]:
        src, kind = _src(c), c["cell_type"]
        if kind == "raw":
            m = re.match(r"^---\s*\n(.*?)\n---\s*$", src.strip(), re.DOTALL)
            fm = (yaml.safe_load(m.group(1)) or {}) if m else {}
            if "title" in fm:
                title = str(fm["title"])
                head = f"# {title}\n"
                if fm.get("description"): head += "\n{.nbdev-description}\n" + str(fm["description"]) + "\n"
                cells.append(_md(head))
            continue
        if kind == "markdown":
            if src.strip().startswith("<!-- WARNING: THIS FILE WAS AUTOGENERATED"): continue
            cells.append(_md(src))
            continue
        opts, code = _options(src)
        outs = c.get("outputs", [])
        if opts.get("include") == "false": continue
        if opts.get("output") == "asis":          # show_doc, or any cell printing markdown: the output *is* markdown
            if opts.get("echo") != "false" and code: cells.append(_code(code))
            text = "\n\n".join(_output_text(o) for o in outs if o.get("output_type") != "error")
            if text.strip(): cells.append(_md(_showdoc_md(text) if code.startswith("show_doc") else text))
            continue
        tags = ((["remove-input"] if opts.get("echo") == "false" else [])
                + (["remove-output"] if opts.get("output") == "false" else []))
        if "code-fold" in opts and "remove-input" not in tags and code:   # Quarto's collapsible "Exported source"
            summary = opts.get("code-summary", "Code")
            cells.append(_md(f'<details class="nbdev-fold"{" open" if opts["code-fold"] == "show" else ""}>'
                             f"<summary>{summary}</summary>\n\n```python\n{code}\n```\n\n</details>"))
            if outs: cells.append(_code(code, outs, ["remove-input"]))
            continue
        if not code and not outs: continue
        cells.append(_code(code, outs, tags))
    if title is None: cells.insert(0, _md(f"# {Path(proc['path']).stem}"))
    cells = [dict(c, source=_anchored(display_math(c["source"]))) if c["cell_type"] == "markdown" else c for c in cells]
    anchors = set().union(*[headings(c["source"]) for c in cells if c["cell_type"] == "markdown"])
    return cells, title or Path(proc["path"]).stem, anchors


# -- links --------------------------------------------------------------------------------------------------------
def fix_links(text, page, pages, anchors, doc_root, nb_dir, nbs):
    """Links to the doc site (nbdev's `add_links` writes `doc_host/tp.html#shard`) and to notebooks (`02_tp.ipynb`)
    -> links relative to `page`. A missing method anchor falls back to its class, then to the page."""
    here = posixpath.dirname(page)
    # nbdev's add_links also links a `name` that is already a link's text: [[`x`](doc_link)](own) -> [`x`](own)
    text = re.sub(r"\[\[(`[^`]+`)\]\([^)\s]+\)\]\(", r"[\1](", text)
    def target(path, frag):
        if frag and path in anchors and frag not in anchors[path]:
            frag = frag.split(".")[0] if frag.split(".")[0] in anchors[path] else ""
        return posixpath.relpath(path, here or ".") + (f"#{frag}" if frag else "")
    def site(m):
        path, frag = m.group(2) or "index.html", (m.group(3) or "")[1:]
        return f"{m.group(1)}{target(path, frag)}{m.group(4)}"
    text = re.sub(rf"(\]\(|href=\"){re.escape(doc_root)}([^)\s#\"]*)(#[^)\s\"]*)?([)\"])", site, text)
    def nb(m):
        p = (nb_dir / m.group(2)).resolve()
        if p not in pages: return m.group(0)
        frag = (m.group(3) or "")[1:]
        return f"{m.group(1)}{target(pages[p], frag)}{m.group(4)}"
    return re.sub(r"(\]\(|href=\")(?![a-z]+:)([^)\s#\"]+\.ipynb)(#[^)\s\"]*)?([)\"])", nb, text)


# -- the command line's help, at the top of its module's page ------------------------------------------------------
# Run in a fresh interpreter (the package's imports, argparse's exit): the console script's `--help`, then the `--help`
# of each of its commands, epilogs and their examples included. The commands are read from the parser the script
# builds (argparse keeps its sub-parsers in private attributes: there is no public way), else from the usage line.
_HELP = """
import argparse, contextlib, io, json, re, sys
prog, mod, fn = sys.argv[1:]
main = getattr(__import__(mod, fromlist=[fn]), fn)
parsers, parse = [], argparse.ArgumentParser.parse_known_args
def spy(self, *a, **k):
    parsers.append(self)
    return parse(self, *a, **k)
argparse.ArgumentParser.parse_known_args = spy
def help(*cmd):
    sys.argv, out = [prog, *cmd, "--help"], io.StringIO()
    with contextlib.redirect_stdout(out):
        try: main()
        except SystemExit: pass
    return out.getvalue()
top = help()
subs = [a for p in parsers[:1] for a in p._actions if isinstance(a, argparse._SubParsersAction)]
first = {}   # a command's first name (the others are its aliases)
for a in subs:
    for c, p in a.choices.items(): first.setdefault(id(p), c)
cmds = list(first.values())
if not subs: cmds = (m := re.search(r"[{]([\\w,-]+)[}]", top)) and m.group(1).split(",") or []
print("\\n" + json.dumps([[prog, top]] + [[f"{prog} {c}", help(c)] for c in cmds]))
"""

def console_scripts(cfg=None):
    "[(program, module, function)] of settings.ini's `console_scripts` (`qwen3vl-l50=qwen3vl_l50_nbdev.cli:main`)."
    spec = (cfg or _cfg()).get("console_scripts", "")
    return [(prog.strip(), *target.strip().split(":")) for prog, target in
            (item.split("=", 1) for item in spec.split() if "=" in item)]

def start_help(prog, mod, fn):
    "Start printing the help of console script `prog` in another process (`finish_help` reads it)."
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=path)   # argparse wraps at COLUMNS: a terminal's width
    return subprocess.Popen([sys.executable, "-c", _HELP, prog, mod, fn], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

def finish_help(proc):
    "[(command line, help text)] printed by `start_help`'s process; raises with its error when it failed."
    out, err = proc.communicate()
    if proc.returncode or not out.strip(): raise RuntimeError(f"`{proc.args[3]} --help` failed:\n{err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])

def help_md(helps):
    "The help texts as the opening of the CLI page: the program's `--help`, then a section per command."
    (prog, top), *cmds = helps
    out = ["## Usage", "", f"`{prog} --help`:", "", "```text", top.rstrip(), "```"]
    for line, text in cmds: out += ["", f"### `{line}`", "", "```text", text.rstrip(), "```"]
    return "\n".join(out) + "\n"


# -- the API reference page ---------------------------------------------------------------------------------------
def exported():
    "{module: (page, [(name, url)])} for every exported name, from the package's _modidx.py and each module's __all__."
    cfg = _cfg()
    modidx = importlib.import_module(f"{cfg.lib_name}._modidx").d["syms"]
    allurls = {k: v[0] for syms in modidx.values() for k, v in syms.items()}
    res = {}
    for mod, syms in modidx.items():
        try: m = importlib.import_module(mod)
        except Exception as e:
            raise SystemExit(f"docs: cannot import {mod} to list its exports: {type(e).__name__}: {e}")
        page = next(iter(syms.values()), ("#",))[0].split("#")[0]
        def url(n):   # a name re-exported from another module (`_all_ = [...]`) is documented where it is defined
            home = getattr(getattr(m, n, None), "__module__", mod)
            return allurls.get(f"{mod}.{n}") or allurls.get(f"{home}.{n}") or page
        res[mod] = (page, [(n, url(n)) for n in getattr(m, "__all__", [])])
    return res

def _summary(obj):
    doc = (getattr(obj, "__doc__", None) or "") if callable(obj) else ""
    # a dataclass's generated signature, not a docstring
    if doc.startswith(f"{getattr(obj, '__name__', '')}("): doc = ""
    if callable(obj) and doc: return doc.strip().splitlines()[0]
    if not callable(obj):
        r = repr(obj)
        return f"`{r if len(r) <= 70 else r[:67] + '...'}`"
    return ""

def api_page(mods, titles, anchors):
    lines = ["# API reference", "",
             "Every name each module exports (its `__all__`), linked to where its notebook documents it.", ""]
    for mod, (page, names) in mods.items():
        m = importlib.import_module(mod)
        lines += [f"## `{mod}`", "", f"[{titles.get(page, page)}]({page})", "",
                  "| name | kind | summary |", "|---|---|---|"]
        for n, url in names:
            obj = getattr(m, n, None)
            kind = "class" if isinstance(obj, type) else "function" if callable(obj) else type(obj).__name__
            path, _, frag = url.partition("#")
            link = url if frag in anchors.get(path, ()) else path
            summ = _summary(obj).replace("|", "\\|")
            lines.append(f'| <span id="{mod.rsplit(".", 1)[-1]}.{n}"></span>[`{n}`]({link}) | {kind} | {summ} |')
        lines.append("")
    return "\n".join(lines)


# -- 1-4 ----------------------------------------------------------------------------------------------------------
def build(out=SITE, jobs=2, quiet=False):
    t0 = time.time()
    cfg = _cfg()
    nbs_path = Path(cfg.nbs_path)
    nb_list = notebooks(nbs_path)
    if not nb_list: sys.exit(f"no notebooks in {nbs_path}")
    pages = {p.resolve(): page_of(p, nbs_path) for p in nb_list}
    dup = {v for v in pages.values() if list(pages.values()).count(v) > 1}
    if dup: sys.exit(f"two notebooks would make the same page: {sorted(dup)}")
    try: sections(nbs_path)
    except ValueError as e: sys.exit(f"docs: {e}")
    helps = [(mod, start_help(prog, mod, fn)) for prog, mod, fn in console_scripts(cfg)]
    exports = exported()   # imports every module first: the workers forked below start with them (and torch) loaded

    with ProcessPoolExecutor(max(1, jobs), mp_context=get_context("fork")) as ex:
        futs = [ex.submit(process, p) for p in nb_list]
        procs, failed = [], []
        for p, f in zip(nb_list, futs):
            try: procs.append(f.result())
            except Exception as e:
                failed.append(p)
                print(f"error: {p.relative_to(ROOT)}: nbdev's processing failed, so it has no page:\n{e}\n",
                      file=sys.stderr)
    t1 = time.time()

    conv = {pages[Path(p["path"]).resolve()]: (p, *to_myst(p)) for p in procs}
    for mod, proc in helps:   # the CLI page opens with the program's help, after the title
        page = next((pages[nb.resolve()] for nb in nb_list if default_exp(nb) == mod.split(".", 1)[-1]), None)
        try: text = help_md(finish_help(proc))
        except RuntimeError as e: failed.append(mod); print(f"error: {e}", file=sys.stderr); continue
        if page in conv:
            conv[page][1].insert(1, _md(text))
            conv[page][3].update(headings(text))
    anchors = {page: a for page, (_, _, _, a) in conv.items()}
    titles = {page: t for page, (_, _, t, _) in conv.items()}
    doc_root = cfg.doc_host.rstrip("/") + "/" + cfg.doc_baseurl.strip("/")
    doc_root = doc_root.rstrip("/") + "/"

    if SRC.exists(): shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    nbmeta = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
              "language_info": {"name": "python", "pygments_lexer": "ipython3"}}
    home = "index.html" if "index.html" in conv else None
    for page, (p, cells, title, _) in conv.items():
        nb_dir = Path(p["path"]).resolve().parent
        fix = lambda text: fix_links(text, page, pages, anchors, doc_root, nb_dir, nbs_path)
        for c in cells:
            if c["cell_type"] == "markdown": c["source"] = fix(c["source"])
            for o in c.get("outputs", []):   # markdown a cell displays (`display(Markdown(...))`) links too
                md = o.get("data", {}).get("text/markdown")
                if md: o["data"]["text/markdown"] = fix("".join(md))
        if page == home: cells.append(_md(_toctrees(conv, nbs_path)))
        dest = SRC / Path(page).with_suffix(".ipynb")
        dest.parent.mkdir(parents=True, exist_ok=True)
        cells = [dict(c, id=f"c{i}") for i, c in enumerate(cells)]
        dest.write_text(json.dumps(dict(cells=cells, metadata=nbmeta, nbformat=4, nbformat_minor=5), indent=1))
    order = list(conv)
    for f in nbs_path.rglob("*"):   # images and other files the notebooks link to, at the same relative paths
        rel = f.relative_to(nbs_path)
        if f.is_file() and f.suffix not in _NOT_ASSETS and not any(x.startswith((".", "_")) for x in rel.parts):
            (SRC / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, SRC / rel)
    mods = dict(sorted(exports.items(), key=lambda kv: order.index(kv[1][0]) if kv[1][0] in order else len(order)))
    (SRC / "api.md").write_text(api_page(mods, titles, anchors))
    if home is None:   # no nbs/index.ipynb yet: a stand-in home page, so the site still has one
        (SRC / "index.md").write_text(f"# {cfg.title}\n\n{cfg.description}\n\n" + _toctrees(conv, nbs_path))

    for p in procs:
        for w in p["warnings"]: print(f"warning: {Path(p['path']).relative_to(ROOT)}: {w}", file=sys.stderr, flush=True)
    html = BUILD / "html"   # not `out` itself: MyST-NB writes jupyter_execute/ beside the output folder
    if html.exists(): shutil.rmtree(html)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(DOCS), "-d", str(BUILD / "doctrees"),
           "-j", str(max(1, jobs)), "-q", "-E", str(SRC), str(html)]
    subprocess.run(cmd, check=True, cwd=ROOT)
    if out.exists(): shutil.rmtree(out)
    shutil.move(html, out)
    (out / ".nojekyll").touch()
    shutil.rmtree(out / "_sources", ignore_errors=True)   # empty: html_copy_source is off
    if failed: sys.exit(f"docs: built without {', '.join(getattr(p, 'name', p) for p in failed)} (errors above)")
    if not quiet:
        slow = ", ".join(f"{Path(p['path']).name} {p['seconds']}s"
                         for p in sorted(procs, key=lambda p: -p["seconds"])[:3])
        print(f"docs: {len(procs)} notebooks processed in {t1 - t0:.0f}s (slowest: {slow}), "
              f"site built in {time.time() - t0:.0f}s -> "
              f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}/index.html")
    return out

_NOT_ASSETS = {".ipynb", ".md", ".rst", ".py", ".yml", ".yaml", ".ini", ".txt"}

def nav_title(nb_path, title):
    ("The sidebar's name for a notebook's page: its number and its title, `01 · Error vs tensor-parallel size` "
     "(nbdev drops the number from the page's file name; the notebooks refer to each other by it).")
    m = re.match(r"^(\d+[a-z]?)_", Path(nb_path).name)
    t = re.sub(r"[`*]", "", title).replace("<", "‹").replace(">", "›").strip()   # a toctree title is plain text
    return f"{m.group(1)} · {t}" if m else t

def _toctrees(conv, nbs_path):
    "The navigation: the library's notebooks, the findings, the harness (`sections`), then the API reference."
    def entry(p):
        doc = Path(p).with_suffix("").as_posix()
        return f"{nav_title(conv[p][0]['path'], conv[p][2])} <{doc}>" if p in conv else doc
    out = ""
    groups = [(c, [page_of(nb, nbs_path) for nb in nbs]) for c, nbs in sections(nbs_path)]
    groups.append(("Reference", ["api.html"]))
    for caption, group in groups:
        group = [p for p in group if p in conv or p == "api.html"]
        if group:
            out += (f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n"
                    + "\n".join(entry(p) for p in group) + "\n```\n")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=SITE, help="where the site goes (default docs/_site)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    a = ap.parse_args(argv)
    build(a.out.resolve(), a.jobs)

if __name__ == "__main__":   # run as the importable module `build`, so that worker processes can unpickle `process`
    sys.path.insert(0, str(DOCS))
    import build as _build
    _build.main()
