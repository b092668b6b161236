from configparser import ConfigParser
import hashlib, json, setuptools, shlex, subprocess
from pathlib import Path
from packaging.version import Version
from setuptools.command.build_py import build_py

# nbdev 2's classic setup.py, with `packaging.version` in place of `pkg_resources` (gone from setuptools)
assert Version(setuptools.__version__) >= Version('36.2')

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

cfg_keys = 'version description keywords author author_email'.split()
expected = cfg_keys + "lib_name user branch license status min_python audience language".split()
for o in expected: assert o in cfg, "missing expected setting: {}".format(o)
setup_cfg = {o: cfg[o] for o in cfg_keys}

licenses = {
    'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License'),
    'mit': ('MIT License', 'OSI Approved :: MIT License'),
}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive']
py_versions = '3.10 3.11 3.12 3.13'.split()

requirements = shlex.split(cfg.get('requirements', ''))
dev_requirements = shlex.split(cfg.get('dev_requirements', ''))
lic = licenses.get(cfg['license'].lower(), (cfg['license'], None))
min_python = cfg['min_python']
console_scripts = cfg.get('console_scripts', '').split()

def built_from(lib: str) -> dict:
    "The commit this tree is at (dirty: the package or the notebooks differ) and the sources' digest; {} outside git."
    here = Path(__file__).resolve().parent
    git = lambda *a: subprocess.run(['git', '-C', str(here), *a], capture_output=True, text=True).stdout.strip()
    try:
        if Path(git('rev-parse', '--show-toplevel') or '/nonexistent').resolve() != here: return {}
        commit, dirty = git('rev-parse', 'HEAD'), bool(git('status', '--porcelain', '--', lib, 'nbs'))
    except OSError: return {}   # no git
    h = hashlib.sha256()   # provenance.source_digest's (tests/test_provenance.py checks that they agree)
    for f in sorted((here / lib).rglob('*.py')):
        data = f.read_bytes()
        h.update(f"{f.relative_to(here / lib).as_posix()} {len(data)}\n".encode()); h.update(data)
    return dict(commit=commit, dirty=dirty, sources=h.hexdigest()[:16]) if commit else {}

class BuildPy(build_py):
    "build_py that records, for a non-editable install, the commit it was built from (provenance reads _build.json)."
    def run(self):
        super().run()
        if not getattr(self, 'editable_mode', False) and (info := built_from(cfg['lib_name'])):
            (Path(self.build_lib) / cfg['lib_name'] / '_build.json').write_text(json.dumps(info))

setuptools.setup(
    cmdclass={'build_py': BuildPy},
    name=cfg['lib_name'],
    license=lic[0],
    classifiers=['Development Status :: ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(),
                 'Natural Language :: ' + cfg['language'].title()]
                + ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]]
                + (['License :: ' + lic[1]] if lic[1] else []),
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data=True,
    install_requires=requirements,
    extras_require={'dev': dev_requirements},
    python_requires='>=' + cfg['min_python'],
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={'console_scripts': console_scripts, 'nbdev': [f'{cfg.get("lib_path")}={cfg.get("lib_path")}._modidx:d']},
    **setup_cfg)
