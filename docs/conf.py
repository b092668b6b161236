# Sphinx configuration for the docs site. docs/build.py writes the pages into docs/_build/src and runs
# `sphinx-build -c docs docs/_build/src docs/_site`: the paths below are relative to this folder.
from configparser import ConfigParser
from pathlib import Path

_ini = ConfigParser(delimiters=["="])
_ini.read(Path(__file__).resolve().parent.parent / "settings.ini", encoding="utf-8")
_cfg = _ini["DEFAULT"]

project = _cfg["title"]
author = _cfg["author"]
copyright = _cfg["copyright"]
release = version = _cfg["version"]

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = []

# MyST-NB: render the outputs stored in the notebooks (CI runs them separately with nbdev_test)
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "attrs_inline", "attrs_block", "colon_fence"]
myst_all_links_external = True     # build.py already made every link a relative .html link; docs/check.py checks them
suppress_warnings = ["myst.header"]   # show_doc puts `###` headings right under the `#` title, as on nbdev sites

html_math_renderer = "mathml"     # below: TeX -> MathML at build time, so the pages need no MathJax (no CDN)
html_theme = "furo"
html_title = project
html_static_path = ["static"]
html_css_files = ["nbdev.css"]
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {"sidebar_hide_name": False, "navigation_with_keys": True}


# -- math: TeX -> MathML when the page is written ------------------------------------------------------------------
# Every browser renders MathML Core; the site then works offline and loads no script for math. A TeX command that
# latex2mathml does not know fails the build, naming the page and the TeX.
def _mathml(self, node, display):
    from latex2mathml.converter import convert
    from docutils import nodes
    tex = node.astext().strip()
    try: ml = convert(tex, display="block" if display else "inline")
    except Exception as e:
        raise RuntimeError(f"{self.builder.current_docname}: cannot render the TeX {tex!r} as MathML: {e}") from e
    tag = "div" if display else "span"
    self.body.append(self.starttag(node, tag, "", CLASS="math") + ml + f"</{tag}>" + ("\n" if display else ""))
    raise nodes.SkipNode

def setup(app):
    app.add_html_math_renderer("mathml", (lambda self, node: _mathml(self, node, False), None),
                               (lambda self, node: _mathml(self, node, True), None))
