"The docs site (docs/build.py): every notebook has a page, internal links resolve, every exported name is documented."
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import build  # noqa: E402  (docs/build.py)
import check  # noqa: E402  (docs/check.py)

if not os.environ.get("CI"):   # CI installs docs/requirements.txt (make docs): there a missing Sphinx fails
    pytest.importorskip("myst_nb", reason="docs tools not installed: pip install -r docs/requirements.txt")


@pytest.fixture(scope="session")
def site():
    "The built site; (re)built when missing or older than a notebook."
    index = build.SITE / "index.html"
    newest = max(p.stat().st_mtime for p in build.notebooks())
    if not index.exists() or index.stat().st_mtime < newest:
        subprocess.run([sys.executable, str(ROOT / "docs" / "build.py")], check=True, cwd=ROOT)
    return build.SITE


def test_every_notebook_has_a_page(site):
    assert check.missing_pages(site) == []
    assert (site / "index.html").exists() and (site / "search.html").exists() and (site / "api.html").exists()


def test_internal_links_resolve(site):
    assert check.broken_links(site) == []


def test_every_exported_name_is_documented(site):
    assert check.undocumented(site) == []


def test_navigation_in_sections(site):
    """The sidebar: the library's notebooks, the findings, the harness, each in notebook order, under its caption;
    every analysis notebook is in one of the two analysis sections."""
    html = (site / "index.html").read_text(encoding="utf-8")
    nav = html[html.index('class="sidebar-tree"'):]
    secs = build.sections()
    assert [c for c, _ in secs] == ["Library", "Findings", "Harness"]
    want = [(c, build.page_of(nb)) for c, nbs in secs for nb in nbs] + [("Reference", "api.html")]
    pos = [nav.find(f'href="{p}"') for _, p in want]
    assert -1 not in pos and pos == sorted(pos), dict(zip(want, pos))
    for (c, p), at in zip(want, pos):   # under its own caption: the last caption before the link
        assert re.findall(r'<span class="caption-text">([^<]*)<', nav[:at])[-1] == c, p
    ana = {nb for nb in build.notebooks() if nb.parent.name == "analysis"}
    assert ana == set(secs[1][1]) | set(secs[2][1]) and not set(secs[1][1]) & set(secs[2][1])
    assert {nb.stem for nb in secs[1][1]} >= {"01_tp_size", "04_speed"} and "00_weights" in build.HARNESS


def test_sections_name_every_analysis_notebook(monkeypatch):
    "A new analysis notebook, or a listed one that is gone, stops the build with what to do."
    monkeypatch.setattr(build, "HARNESS", tuple(n for n in build.HARNESS if n != "00d_timing"))
    with pytest.raises(ValueError, match="00d_timing.ipynb is in neither FINDINGS nor HARNESS"): build.sections()
    monkeypatch.setattr(build, "HARNESS", build.HARNESS + ("00d_timing", "99_gone"))
    with pytest.raises(ValueError, match=r"lists \['99_gone'\]"): build.sections()


def test_navigation_shows_notebook_numbers(site):
    "The sidebar names a numbered notebook's page by its number and title (`01 · Error vs tensor-parallel size`)."
    html = (site / "index.html").read_text(encoding="utf-8")
    nav = html[html.index('class="sidebar-tree"'):]
    numbered = [(nb, m.group(1)) for nb in build.notebooks() if (m := re.match(r"(\d+[a-z]?)_", nb.name))]
    assert any(nb.parent.name == "analysis" for nb, _ in numbered)
    for nb, num in numbered:
        a = re.search(rf'href="{re.escape(build.page_of(nb))}">([^<]*)</a>', nav)
        assert a and a.group(1).startswith(f"{num} · "), (nb.name, a and a.group(1))
    assert build.nav_title("nbs/analysis/01_tp_size.ipynb", "Error vs `tp` <size>") == "01 · Error vs tp ‹size›"
    assert build.nav_title("nbs/index.ipynb", "Home") == "Home"


def test_checker_finds_problems(tmp_path):
    ("The checker itself: a missing file, a missing anchor, a link out of the site and an absolute link to the site's "
     "own host are reported; good links are not.")
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text('<h1 id="top">T</h1><a href="sub/a.html#x">ok</a><a href="#top">ok</a>'
                                         '<a href="nope.html">bad</a><a href="sub/a.html#nope">bad</a>'
                                         '<img src="../outside.png"><a href="https://example.org/x">external</a>')
    (tmp_path / "sub" / "a.html").write_text('<a id="x"></a><a href="../index.html#top">ok</a>'
                                              f'<a href="{build._cfg().doc_host.rstrip("/")}/tp.html#shard">own</a>')
    probs = check.broken_links(tmp_path)
    assert len(probs) == 4, probs
    assert (any("nope.html" in p for p in probs) and any("#nope" in p for p in probs)
            and any("leaves" in p for p in probs) and any("published site" in p for p in probs))


def test_quarto_to_myst():
    "Quarto's cell options, show_doc markdown, and nbdev's doc links, as the build turns them into MyST-NB input."
    assert build.pandoc_id("EncoderConfig.from_hf") == "encoderconfig.from_hf"
    assert build.pandoc_id("[`divide`](x.html#divide) and `shard`") == "divide-and-shard"
    assert build._options("#| echo: false\n#| output: asis\nshow_doc(f)") == ({"echo": "false", "output": "asis"},
                                                                          "show_doc(f)")
    proc = dict(path="nbs/02_x.ipynb", cells=[
        dict(cell_type="raw", source="---\ntitle: X\ndescription: the x\noutput-file: x.html\n---\n\n"),
        dict(cell_type="code", source="#| echo: false\n#| output: asis\nshow_doc(qwen3vl_32b)", outputs=[dict(
            output_type="execute_result",
            data={"text/markdown": "---\n\n[source](https://g/x.py#L1){target=\"_blank\"}\n\n"
                                   "### qwen3vl_32b\n\n*Doc.*"})]),
        dict(cell_type="code", source='#| code-fold: show\n#| code-summary: "Exported source"\ndef qwen3vl_32b(): pass',
             outputs=[]),
        dict(cell_type="code", source="#| echo: false\n1",
             outputs=[dict(output_type="stream", name="stdout", text="1\n")])])
    cells, title, anchors = build.to_myst(proc)
    assert title == "X" and cells[0]["source"].startswith("# X\n") and "the x" in cells[0]["source"]
    sd = cells[1]["source"]
    assert '<a id="qwen3vl_32b"></a>' in sd and "### qwen3vl_32b" in sd and not sd.startswith("---")
    assert '<a class="nbdev-source" href="https://g/x.py#L1">source</a>' in sd and "qwen3vl_32b" in anchors
    assert cells[2]["source"].startswith('<details class="nbdev-fold" open><summary>Exported source</summary>')
    assert cells[3]["metadata"]["tags"] == ["remove-input"] and cells[3]["outputs"]
    pages = {(ROOT / "nbs" / "02_tp.ipynb").resolve(): "tp.html"}
    md = ("[`shard`](https://h.org/tp.html#shard), [m](https://h.org/tp.html#shard.meth), [nb](../02_tp.ipynb#x), "
          "[[`shard`](https://h.org/tp.html#shard)](../02_tp.ipynb)")
    assert build.fix_links(md, "analysis/a.html", pages, {"tp.html": {"shard", "x"}}, "https://h.org/",
                           ROOT / "nbs" / "analysis", ROOT / "nbs") == \
        "[`shard`](../tp.html#shard), [m](../tp.html#shard), [nb](../tp.html#x), [`shard`](../tp.html)"


def test_math_rendered_offline(site):
    "TeX becomes MathML when the site is built: no raw TeX on any page, nothing loaded from another host (no CDN)."
    assert check.raw_tex(site) == [] and check.external_assets(site) == []
    for nb in build.notebooks():   # a notebook with display math: its page has a block of MathML
        md = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown")
        if "$$" in md: assert 'display="block"' in (site / build.page_of(nb)).read_text(encoding="utf-8"), nb.name
    assert build.display_math("fed:\n$$a = \\frac{b}{c}$$\n(then)") == "fed:\n\n\n$$\na = \\frac{b}{c}\n$$\n\n\n(then)"
    assert build.display_math("`$$` and\n```\n$$x$$\n```") == "`$$` and\n```\n$$x$$\n```"


def test_checker_finds_raw_tex_and_cdn(tmp_path):
    "The checker itself: TeX left as text and scripts or stylesheets from another host are reported; code is not."
    (tmp_path / "_static").mkdir()
    (tmp_path / "index.html").write_text(
        '<p>$<span class="math">\\(\\frac{a}{b}\\)</span>$ and $x_1$; costs $5 and $6</p><pre>$$ $x_1$</pre>'
        '<code>$OUT/report</code><math><mi>x</mi></math><a href="https://example.org/">a link</a>'
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@4/tex-mml-chtml.js"></script><script src="_static/a.js">'
        '</script><link rel="stylesheet" href="//cdn.example.org/k.css"><link rel="stylesheet" href="_static/a.css">')
    (tmp_path / "_static" / "a.css").write_text('@import url("https://fonts.example.org/f.css"); p { color: red }')
    tex = check.raw_tex(tmp_path)
    assert len(tex) == 2 and "frac" in tex[0] and "x_1" in tex[1], tex
    ext = check.external_assets(tmp_path)
    assert len(ext) == 3 and any("mathjax" in p for p in ext) and any("_static/a.css" in p for p in ext), ext


def test_api_in_source_order(site, tmp_path):
    "Each page documents its module's exports in the module's order; the checker notices two swapped (nbdev's order)."
    assert check.out_of_order(site) == []
    for mod, (page, names) in build.exported().items():
        m, heads = importlib.import_module(mod), check.Page(site / page).heads
        docd = sorted((inspect.getsourcelines(o)[1], n) for n, _ in names if heads.count(n) == 1
                      and (inspect.isfunction(o := getattr(m, n)) or inspect.isclass(o)) and o.__module__ == mod)
        if len(docd) >= 2: break
    (a, b), html = [n for _, n in docd[:2]], (site / page).read_text(encoding="utf-8")
    swap = {f">{a}<a class": f">{b}<a class", f">{b}<a class": f">{a}<a class"}   # the two show_doc headings
    swapped = re.sub("|".join(map(re.escape, swap)), lambda m: swap[m.group(0)], html)
    (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / page).write_text(swapped, encoding="utf-8")
    assert check.out_of_order(tmp_path) == [f"{page}: {b} is documented before {a}, which the module defines first"]


class _Rec(NamedTuple):
    "A record."
    name: str          # what it is called
    size: int | None = None


@dataclasses.dataclass(frozen=True)
class _Cfg:
    "A config."
    width: int = 8     # columns
    tags: tuple = ("a|b",)


def _f(x: int,             # the input
       scale: float = 1.0,
       *rest, **kw) -> int:   # the output
    "A function."
    return x


def test_show_doc_tables():
    "A NamedTuple's and a dataclass's fields, and a function's parameters (when documented), as show_doc's tables."
    head, rows = build.record(_Rec)
    assert head == "class _Rec(NamedTuple):" and rows == [("name", "str", "", "what it is called"),
                                                        ("size", "int | None", "None", "")]
    head, rows = build.record(_Cfg)
    assert head == "@dataclasses.dataclass(frozen=True)\nclass _Cfg:" and rows[0] == ("width", "int", "8", "columns")
    assert build.record(_f) is None and build.record(Path) is None
    assert build.param_rows(_f) == [("x", "int", "", "the input"), ("scale", "float", "1.0", ""), ("*rest", "", "", ""),
                                    ("**kw", "", "", ""), ("return", "int", "", "the output")]
    assert build.param_rows(lambda x: x) == []
    table = build.doc_table(rows, "field").splitlines()
    assert table[:2] == ["{.nbdev-params}", "| field | type | default | details |"]
    assert table[-1] == '| `tags` | `tuple` | `("a\\|b",)` |  |'


def test_one_table_per_show_doc(site):
    "Every show_doc section of the site has at most one parameter or field table, and the site has such tables."
    tables = 0
    for page in site.rglob("*.html"):
        for part in re.split(r"<h[234][ >]", page.read_text(encoding="utf-8")):
            assert part.count('<table class="nbdev-params') <= 1, page.name
            tables += part.count('<table class="nbdev-params')
    assert tables >= 20, tables


def test_cli_page_opens_with_help(site):
    "The CLI page opens with the program's --help, then each command's (epilog and examples included)."
    (prog, mod, _), = build.console_scripts()
    nb = next(nb for nb in build.notebooks() if build.default_exp(nb) == mod.split(".", 1)[1])
    page = check.Page(site / build.page_of(nb))
    text = re.sub(r"\s+", " ", "".join(page.text))
    cmds = [h.split(" ", 1)[1] for h in page.heads if h.startswith(f"{prog} ")]
    assert len(cmds) >= 5 and text.index(f"usage: {prog} [-h]") < text.index("Usage") + 200
    for c in cmds:   # a section per command with its usage line, each named in the program's help
        assert f"usage: {prog} {c} [-h]" in text and text.count(c) >= 3, c
