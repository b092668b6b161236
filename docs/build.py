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
import importlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
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

def page_of(nb, nbs=None):
    "The page nbdev gives a notebook, relative to the site root: nbs/02_tp.ipynb -> tp.html (as in _modidx.py)."
    from nbdev.doclinks import _nbpath2html
    return _nbpath2html(Path(nb).relative_to(Path(nbs or _cfg().nbs_path))).as_posix()


# -- 2. nbdev processing (runs in a worker process) ----------------------------------------------------------------
_re_title = re.compile(r"^#\s+\S.*$\n?", re.MULTILINE)
_re_desc = re.compile(r"^>\s+\S.*$\n?", re.MULTILINE)

def _procs():
    from nbdev.processors import FilterDefaults, exec_show_docs, _do_eval, _is_showdoc
    from nbdev.frontmatter import FrontmatterProc, _md2dict

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
            swap = {FrontmatterProc: Frontmatter, exec_show_docs: ExecShowDocs}
            return [swap.get(p, p) for p in super().base_procs()]
    return Filter()

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
    cells = [dict(c, source=_anchored(c["source"])) if c["cell_type"] == "markdown" else c for c in cells]
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
        for c in cells:
            if c["cell_type"] == "markdown":
                c["source"] = fix_links(c["source"], page, pages, anchors, doc_root, nb_dir, nbs_path)
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
    mods = dict(sorted(exported().items(), key=lambda kv: order.index(kv[1][0]) if kv[1][0] in order else len(order)))
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
    if failed: sys.exit(f"docs: built without {', '.join(p.name for p in failed)} (errors above)")
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
    "The navigation: the numbered notebooks, the analysis notebooks, then the API reference, in notebook order."
    top = [p for p in conv if p != "index.html" and "/" not in p]
    ana = [p for p in conv if p.startswith("analysis/")]
    def entry(p):
        doc = Path(p).with_suffix("").as_posix()
        return f"{nav_title(conv[p][0]['path'], conv[p][2])} <{doc}>" if p in conv else doc
    out = ""
    for caption, group in (("Notebooks", top), ("Analysis", ana), ("Reference", ["api.html"])):
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
