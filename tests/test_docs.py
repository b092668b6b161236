"The docs site (docs/build.py): every notebook has a page, internal links resolve, every exported name is documented."
import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_navigation_in_notebook_order(site):
    "The sidebar lists the notebooks' pages in notebook order (nbs/*.ipynb sorted, then nbs/analysis/*.ipynb)."
    html = (site / "index.html").read_text(encoding="utf-8")
    nav = html[html.index('class="sidebar-tree"'):]
    want = [build.page_of(nb) for nb in build.notebooks() if nb.name != "index.ipynb"] + ["api.html"]
    pos = [nav.find(f'href="{p}"') for p in want]
    assert -1 not in pos and pos == sorted(pos), dict(zip(want, pos))


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
    "The checker itself: a missing file, a missing anchor and a link out of the site are reported; good links are not."
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text('<h1 id="top">T</h1><a href="sub/a.html#x">ok</a><a href="#top">ok</a>'
                                         '<a href="nope.html">bad</a><a href="sub/a.html#nope">bad</a>'
                                         '<img src="../outside.png"><a href="https://example.org/x">external</a>')
    (tmp_path / "sub" / "a.html").write_text('<a id="x"></a><a href="../index.html#top">ok</a>')
    probs = check.broken_links(tmp_path)
    assert len(probs) == 3, probs
    assert (any("nope.html" in p for p in probs) and any("#nope" in p for p in probs)
            and any("leaves" in p for p in probs))


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
