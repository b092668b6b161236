"""Headless Chromium over the built docs site: the home page and one analysis page show their title, every image
loads, the stylesheets apply, search finds a function, math is typeset without a network, the CLI page opens with the
program's help; screenshots go to docs/_build/screenshots/."""
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import build  # noqa: E402
import test_docs  # noqa: E402

site = test_docs.site   # the session fixture that builds the site when needed

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: apt-get install chromium "
                                "(Debian's package; bash .ci/run installs it as CI does)")
SHOTS = build.BUILD / "screenshots"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]

# Injected before </body> of a copy of the page: after `load`, it writes what the page shows into <pre id="docs-probe">.
PROBE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const imgs = [...document.images], css = getComputedStyle(document.body);
  const results = [...document.querySelectorAll("#search-results a")].map(a => a.getAttribute("href"));
  const p = document.createElement("pre"); p.id = "docs-probe";
  p.textContent = JSON.stringify({title: document.title, h1: (document.querySelector("h1") || {}).textContent || "",
    images: imgs.length, broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src")),
    furo: css.getPropertyValue("--color-brand-primary").trim(), nbdev: css.getPropertyValue("--nbdev-css").trim(),
    results, wide: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    clipped: [...document.querySelectorAll("div.cell_input pre")].filter(e => e.scrollWidth > e.clientWidth + 1).length,
    inputs: document.querySelectorAll("div.cell_input pre").length,
    math: [...document.querySelectorAll("math")].map(m => { const r = m.getBoundingClientRect();
      return [m.getAttribute("display") || "inline", Math.round(r.width), Math.round(r.height)]; }),
    text: document.body.innerText, article: (document.querySelector("article") || document.body).innerText});
  document.body.appendChild(p);
}, 1500));
</script>"""


def _chromium(*args):
    with tempfile.TemporaryDirectory() as prof:
        r = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={prof}", *args], capture_output=True, text=True,
                           timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.fixture(scope="module")
def probe_site(site, tmp_path_factory):
    "A copy of the site to put probe pages in (the real one stays as built)."
    return Path(shutil.copytree(site, tmp_path_factory.mktemp("site") / "s"))


def probe(probe_site, page, query=""):
    "Load `page` (with `query`) in headless Chromium; returns what the PROBE script saw."
    src = probe_site / page
    dst = src.with_name("probe-" + src.name)
    dst.write_text(src.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _chromium("--window-size=1280,1600", "--virtual-time-budget=10000", "--dump-dom", dst.as_uri() + query)
    m = re.search(r'<pre id="docs-probe">(.*?)</pre>', dom, re.DOTALL)
    assert m, f"the probe did not run on {page}:\n{dom[-1500:]}"
    return json.loads(html.unescape(m.group(1)))


def screenshot(site, page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    out = SHOTS / name
    out.unlink(missing_ok=True)
    _chromium("--window-size=1280,1600", f"--screenshot={out}", (site / page).as_uri())
    import matplotlib.image
    img = matplotlib.image.imread(out)
    assert img.shape[:2] == (1600, 1280) and img[..., :3].std() > 0.05, "blank screenshot"   # not one flat colour
    return out


def analysis_page(site):
    "The first analysis notebook's page; before there is one, the page with the most images."
    pages = [build.page_of(nb) for nb in build.notebooks() if nb.parent.name == "analysis"]
    if pages: return pages[0]
    return max((p.relative_to(site).as_posix() for p in site.glob("*.html")),
               key=lambda p: (site / p).read_text().count("<img"))


def _title(nb):
    cells = json.loads(nb.read_text())["cells"]
    first = next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.sub(r"[`*]", "", re.search(r"^#\s+(\S.*?)\s*$", first, re.MULTILINE).group(1))


@pytest.mark.parametrize("which", ["home", "analysis"])
def test_page_in_browser(site, probe_site, which):
    page = "index.html" if which == "home" else analysis_page(site)
    nb = next((nb for nb in build.notebooks() if build.page_of(nb) == page), None)
    seen = probe(probe_site, page)
    want = _title(nb) if nb else ""
    assert want in seen["h1"] and want in seen["title"], seen
    assert seen["broken"] == [], f"images that did not load on {page}: {seen['broken']}"
    assert seen["images"] == (site / page).read_text(encoding="utf-8").count("<img"), seen
    assert seen["furo"] and seen["nbdev"] == "loaded", f"stylesheets did not apply on {page}: {seen}"
    # at 1280 px the page does not scroll sideways and no code cell hides its long lines (they wrap: nbdev.css)
    assert seen["wide"] <= 0 and seen["clipped"] == 0, f"{page} at 1280 px: {seen}"
    screenshot(site, page, f"{which}.png")


def test_search_finds_a_function(site, probe_site):
    "Sphinx's search page, opened from file:// with ?q=, lists the page that documents an exported function."
    mods = build.exported()
    page, name = next((url.split("#")[0], n) for _, names in mods.values() for n, url in names if "#" in url)
    seen = probe(probe_site, "search.html", f"?q={name}")
    assert any(r.split("#")[0].endswith(page) for r in seen["results"]), (name, page, seen["results"])


def test_math_in_browser(site, probe_site):
    """The page with display math shows it typeset (MathML laid out as a block taller than a line of text, inline math
    beside it) and no TeX source, opened from file:// with no network."""
    page = next(p.relative_to(site).as_posix() for p in sorted(site.rglob("*.html"))
                if 'display="block"' in p.read_text(encoding="utf-8"))
    seen = probe(probe_site, page)
    blocks = [m for m in seen["math"] if m[0] == "block"]
    assert blocks and all(w > 200 and h > 30 for _, w, h in blocks), seen["math"]   # a fraction: two lines tall
    assert all(w > 0 and h > 0 for _, w, h in seen["math"]), seen["math"]
    assert "$$" not in seen["text"] and "\\frac" not in seen["text"] and "\\(" not in seen["text"]
    screenshot(site, page, "math.png")


def test_cli_page_in_browser(site, probe_site):
    "The CLI page opens with the program's usage, above everything else on the page."
    (prog, mod, _), = build.console_scripts()
    nb = next(nb for nb in build.notebooks() if build.default_exp(nb) == mod.split(".", 1)[1])
    page = build.page_of(nb)
    seen = probe(probe_site, page)
    assert seen["wide"] <= 0, seen["wide"]
    body = seen["article"]
    assert body.index(_title(nb)) < body.index(f"usage: {prog} [-h]") < 600, body[:800]
    screenshot(site, page, "cli.png")
