"""Check a built docs site: every notebook has a page, internal links resolve, every exported name is documented (in
source order), no TeX is left unrendered, and nothing is loaded from another host.

    python docs/check.py [docs/_site]      # prints the problems; exit 1 if any

tests/test_docs.py runs the same checks under pytest.
"""
import importlib
import inspect
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))
import build  # noqa: E402  (docs/build.py: notebook discovery, page names, exported names)


class Page(HTMLParser):
    """The ids, links, headings and text of one HTML page; its prose (the text outside code and math); the scripts and
    stylesheets it loads."""
    _void = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, path):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.text, self.h1, self._tags = set(), [], [], "", []
        self.prose, self.heads, self.assets = [], [], []
        self.feed(Path(path).read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("id", "name") if tag == "a" else ("id",):
            if a.get(k): self.ids.add(a[k])
        for k in ("href", "src"):
            if a.get(k) is not None and tag in ("a", "link", "img", "script", "source", "iframe"):
                self.links.append(a[k])
        if tag == "script" and a.get("src"): self.assets.append(a["src"])
        if tag == "link" and {"stylesheet", "preload", "modulepreload"} & set((a.get("rel") or "").split()):
            self.assets.append(a.get("href") or "")
        if tag in ("h2", "h3", "h4"): self.heads.append("")   # show_doc's: h2 on a page without sections
        if tag not in self._void: self._tags.append(tag)

    def handle_endtag(self, tag):
        if tag in self._tags: del self._tags[len(self._tags) - 1 - self._tags[::-1].index(tag):]

    def handle_data(self, data):
        if "style" in self._tags: self.assets += re.findall(r"@import\s+(?:url\()?['\"]?([^'\")\s;]+)", data)
        if "script" in self._tags or "style" in self._tags: return
        self.text.append(data)
        if "h1" in self._tags: self.h1 += data
        if {"h2", "h3", "h4"} & set(self._tags) and "a" not in self._tags: self.heads[-1] += data
        if not {"code", "pre", "kbd", "samp", "math", "textarea"} & set(self._tags): self.prose.append(data)


def _pages(site):
    return {p.relative_to(site).as_posix(): Page(p) for p in sorted(site.rglob("*.html")) if "_static" not in p.parts}


def missing_pages(site, pages=None):
    "Notebooks with no page, or whose page lacks the notebook's title."
    pages = pages if pages is not None else _pages(site)
    probs = []
    for nb in build.notebooks():
        page = build.page_of(nb)
        if page not in pages: probs.append(f"{nb.name}: no page {page}"); continue
        cells = json.loads(nb.read_text())["cells"]
        first = next(("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"), "")
        m = re.search(r"^#\s+(\S.*?)\s*$", first, re.MULTILINE)
        if m and _norm(m.group(1)) not in _norm(pages[page].h1):
            probs.append(f"{nb.name}: {page} has title {pages[page].h1.strip()!r}, not {m.group(1)!r}")
    return probs


def broken_links(site, pages=None):
    "Links (href, src) from one page of the site to a file or an anchor of the site that is not there."
    pages = pages if pages is not None else _pages(site)
    probs, own = [], build._cfg().doc_host.rstrip("/") + "/"   # the site's own host: its pages link relatively
    for name, page in pages.items():
        for link in page.links:
            u = urlsplit(link)
            if own and link.startswith(own):
                probs.append(f"{name}: {link} points at the published site, not at this page's neighbour"); continue
            if u.scheme or link.startswith("//") or not (u.path or u.fragment): continue
            target = (site / name).parent / unquote(u.path) if u.path else site / name
            target = target.resolve()
            if not target.is_relative_to(site.resolve()):
                probs.append(f"{name}: {link} leaves the site"); continue
            if target.is_dir(): target = target / "index.html"
            if not target.exists(): probs.append(f"{name}: {link} -> no file"); continue
            if u.fragment and target.suffix == ".html":
                tp = pages.get(target.relative_to(site.resolve()).as_posix())
                if tp is not None and unquote(u.fragment) not in tp.ids: probs.append(f"{name}: {link} -> no anchor")
    return probs


def undocumented(site, pages=None):
    """Exported names (each module's `__all__`) missing from the site: a function or class needs its show_doc anchor on
    its notebook's page, where _modidx.py (and so every nbdev doc link) points; any name needs an entry in api.html; and
    Sphinx's search index must know the page of each."""
    pages = pages if pages is not None else _pages(site)
    probs, api = [], pages.get("api.html")
    if api is None: return ["api.html missing"]
    titles = search_titles(site)
    for mod, (page, names) in build.exported().items():
        m = importlib.import_module(mod)
        short = mod.rsplit(".", 1)[-1]
        if page not in pages: probs.append(f"{mod}: no page {page}"); continue
        for n, url in names:
            obj = getattr(m, n, None)
            # an alias (`run = cmd_encode`) is documented under the name it was defined with
            if getattr(obj, "__name__", n) != n and any(o == obj.__name__ for o, _ in names): continue
            path, _, frag = url.partition("#")
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and frag not in pages.get(path, api).ids:
                probs.append(f"{mod}.{n}: no show_doc on {page} (no anchor #{frag})")
            elif n not in "".join(pages[page].text) and n not in "".join(api.text):
                probs.append(f"{mod}.{n}: name appears neither on {page} nor in api.html")
            if f"{short}.{n}" not in api.ids: probs.append(f"{mod}.{n}: no entry in api.html")
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and n not in titles:
                probs.append(f"{mod}.{n}: not a title in the search index")
    return probs


_re_tex = re.compile(r"""\$\$ | \\[(\[] | \\[A-Za-z]+\{       # $$, \(, \[, a command with an argument (\frac{)
                         | \$[^$\s][^$]*?(?:\\[A-Za-z]|[\^_{}])[^$]*?\$   # $...$: a command, ^, _ or braces
                         """, re.X)

def raw_tex(site, pages=None):
    """TeX that reached a reader as text: `$$`, `\\(`, `\\[`, a command with an argument, a `$...$` holding a command,
    `^`, `_` or braces, in a page's prose (code and rendered math are not prose)."""
    pages = pages if pages is not None else _pages(site)
    probs = []
    for name, page in pages.items():
        text = re.sub(r"\s+", " ", "".join(page.prose))
        for m in _re_tex.finditer(text):
            probs.append(f"{name}: raw TeX {text[max(0, m.start() - 30):m.end() + 30].strip()!r}")
    return probs


def external_assets(site, pages=None):
    """Scripts and stylesheets a page or the site's CSS loads from another host (a CDN): offline they are missing, and
    the page with them (math, styles) breaks."""
    pages = pages if pages is not None else _pages(site)
    probs = [f"{name}: loads {url}" for name, page in pages.items() for url in page.assets
             if urlsplit(url).scheme or url.startswith("//")]
    for css in sorted(Path(site).rglob("*.css")):
        text = css.read_text(encoding="utf-8")
        for url in re.findall(r"(?:@import\s+(?:url\()?|url\()\s*['\"]?((?:https?:)?//[^'\")\s]+)", text):
            probs.append(f"{css.relative_to(site).as_posix()}: loads {url}")
    return probs


def out_of_order(site, pages=None):
    """Exported functions and classes whose show_doc comes on their page in another order than their definitions in
    the module (nbdev documents a cell's definitions where the cell is, in the cell's order)."""
    pages = pages if pages is not None else _pages(site)
    probs = []
    for mod, (page, names) in build.exported().items():
        if page not in pages: continue
        m, heads = importlib.import_module(mod), [_norm(h) for h in pages[page].heads]
        found = []
        for n, _ in names:
            obj = getattr(m, n, None)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or obj.__module__ != mod: continue
            if n not in heads: continue   # documented elsewhere, or not at all: `undocumented` says which
            at = len(heads) - 1 - heads[::-1].index(n)   # the last: a section may be named after what it defines
            try: found.append((inspect.getsourcelines(obj)[1], at, n))
            except (OSError, TypeError): continue
        found.sort()
        probs += [f"{page}: {b[2]} is documented before {a[2]}, which the module defines first"
                  for a, b in zip(found, found[1:]) if b[1] < a[1]]
    return probs


def _norm(s):   # Sphinx's smart quotes turn ' into ’ and " into “ ”: compare the plain forms
    s = s.translate(str.maketrans("’‘“”", "''\"\""))
    return re.sub(r"\s+", " ", re.sub(r"[`*¶#]", "", s)).strip()

def search_titles(site):
    "The section titles in Sphinx's search index (searchindex.js), which the search page matches queries against."
    s = (Path(site) / "searchindex.js").read_text(encoding="utf-8")
    return set(json.loads(s[s.index("(") + 1:s.rindex(")")])["alltitles"])


def check(site=build.SITE):
    site = Path(site)
    if not (site / "index.html").exists(): return [f"{site}/index.html missing: run `make docs`"]
    pages = _pages(site)
    return (missing_pages(site, pages) + broken_links(site, pages) + undocumented(site, pages) + raw_tex(site, pages)
            + external_assets(site, pages) + out_of_order(site, pages))


if __name__ == "__main__":
    site = Path(sys.argv[1]) if len(sys.argv) > 1 else build.SITE
    probs = check(site)
    for p in probs: print(p)
    n = len(list(site.rglob("*.html")))
    print(f"docs check: {n} pages, {len(probs)} problems")
    sys.exit(1 if probs else 0)
