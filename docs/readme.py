"""README.md from nbs/index.ipynb (nbdev_readme needs Quarto): markdown cells as they are, code with its text output.

A `#| echo: false` cell shows only its output; progress bars and warnings (stderr) are left out."""
import json
from pathlib import Path

root = Path(__file__).resolve().parents[1]

def render(nb: dict) -> str:
    out = ["<!-- generated from nbs/index.ipynb by docs/readme.py: edit the notebook, then `make readme` -->"]
    for c in nb["cells"]:
        src = "".join(c["source"]).strip()
        if c["cell_type"] == "markdown": out.append(src); continue
        if src.startswith("#| hide"): continue
        if not src.startswith("#| echo: false"): out.append(f"```python\n{src}\n```")
        for o in c.get("outputs", []):
            if o.get("name") == "stderr": continue
            data = o.get("data", {})
            if "text/markdown" in data: out.append("".join(data["text/markdown"]).strip())
            elif "text/plain" in data or "text" in o:
                out.append("```\n" + "".join(data.get("text/plain", o.get("text", ""))).rstrip() + "\n```")
    return "\n\n".join(out) + "\n"

if __name__ == "__main__":
    (root / "README.md").write_text(render(json.loads((root / "nbs/index.ipynb").read_text())))
