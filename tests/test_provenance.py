"The commit a run records is the package's own, imported from where it sits: a copy or an install in another project."
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
import pytest
import qwen3vl_l50_nbdev
from qwen3vl_l50_nbdev.provenance import BUILD, LIB, source_digest

ROOT = Path(qwen3vl_l50_nbdev.__file__).parent.parent
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]

def _repo(d: Path) -> Path:
    "Another project: a git repository that ignores its .venv, with a commit."
    d.mkdir(); (d / ".gitignore").write_text(".venv/\n"); (d / "notes.txt").write_text("another project\n")
    for a in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "another project"]):
        subprocess.run([*GIT, "-C", str(d), *a], check=True, capture_output=True)
    return d

def _head(d) -> str: return subprocess.run(["git", "-C", str(d), "rev-parse", "HEAD"], capture_output=True,
                                           text=True, check=True).stdout.strip()

def _recorded(path: Path, cwd: Path) -> dict:
    "What a run of the package imported from `path` records: its provenance's commit and its code identity."
    code = ("import json; from qwen3vl_l50_nbdev.provenance import provenance, code_identity, git_commit; "
            "print(json.dumps(dict(commit=provenance(command='x')['commit'], full=git_commit(False), "
            "identity=code_identity())))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(path)}
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])

def test_a_copy_in_another_repository_records_no_foreign_commit(tmp_path):
    other = _repo(tmp_path / "other")
    shutil.copytree(ROOT / LIB, other / LIB, ignore=shutil.ignore_patterns("__pycache__", BUILD))
    subprocess.run([*GIT, "-C", str(other), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(other), "commit", "-qm", "the package, copied in"], check=True)
    got = _recorded(other, other)
    assert _head(other)[:7] not in json.dumps(got), got
    assert got["commit"] == "unknown" and got["identity"] == f"sources+dirty-{source_digest(other / LIB)}", got

@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    "The package as a non-editable install gets it: setup.py's build_py output."
    out = tmp_path_factory.mktemp("build")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out / LIB

def test_an_install_in_another_projects_venv_records_its_build(tmp_path, built):
    rec = json.loads((built / BUILD).read_text())
    assert rec["commit"] == _head(ROOT) and rec["sources"] == source_digest(built)   # setup.py's digest is ours
    other = _repo(tmp_path / "other")
    site = other / ".venv" / "lib" / "site-packages"
    shutil.copytree(built, site / LIB)   # git-ignored inside the other project's tree
    got = _recorded(site, other)
    assert _head(other)[:7] not in json.dumps(got), got
    assert got["full"] == rec["commit"] + "+dirty" * rec["dirty"], got
    (site / LIB / "metrics.py").write_text((site / LIB / "metrics.py").read_text() + "\n# edited\n")
    got = _recorded(site, other)
    assert got["full"] == rec["commit"] + "+dirty" and got["identity"].startswith(rec["commit"] + "+dirty-"), got
