# Every target sets itself up: `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
ACT := source $(VENV)/bin/activate

.PHONY: install demo test test-oldest check-sync lint readme nbtest stored pytest docs clean

$(VENV)/.installed: setup.py settings.ini
	python3 -m venv $(VENV)
	# torch first and pinned: the CPU wheel; an unpinned torch would pull a multi-GB CUDA build
	$(ACT) && pip install -q torch==2.13.0 && pip install -q -e ".[dev]"
	# the newest transformers, as a user's install gets it (an older one already here is upgraded)
	$(ACT) && pip install -q -U transformers
	touch $@

install: $(VENV)/.installed

$(VENV)/.docs-installed: $(VENV)/.installed docs/requirements.txt
	$(ACT) && pip install -q -r docs/requirements.txt
	touch $@

docs: $(VENV)/.docs-installed   # the site, offline, from the notebooks' stored outputs: open docs/_site/index.html
	$(ACT) && python docs/build.py && python docs/check.py

demo: install
	$(ACT) && qwen3vl-l50 demo

readme:   # README.md from nbs/index.ipynb
	python3 docs/readme.py

check-sync: install   # the notebooks are the source: exporting, cleaning and the README must change nothing
	$(ACT) && nbdev_export && nbdev_clean && python docs/readme.py
	@test -z "$$(git status --porcelain -- qwen3vl_l50_nbdev nbs README.md)" || { git status --short -- qwen3vl_l50_nbdev nbs README.md; echo "notebooks, qwen3vl_l50_nbdev/ and README.md are out of sync or not clean: run nbdev_export && nbdev_clean && make readme"; exit 1; }

lint: install   # ruff on the sources (the notebooks, not their exports), tests and docs scripts: pyproject.toml's rules
	$(ACT) && ruff check nbs tests docs

# The test steps run two processes at a time (nbdev_test's workers, pytest-xdist's) of one thread each: on 2 cores,
# threads that spin-wait for a core another process holds cost more than they give.
ONE := OMP_NUM_THREADS=1

nbtest: install
	$(ACT) && $(ONE) nbdev_test --n_workers 2 --timing

# the stored CPU runs (01-03's CSVs) computed once more, whole, under the avx2 and default kernels and two threads (what
# another machine may change must pass: 00b_report's stored_runs), and the quick check that `make pytest` runs on those
# paths failing on four broken variants; CI runs it after `make test`
stored: install
	$(ACT) && $(ONE) QWEN3VL_L50_STORED=whole pytest -q -n 3 tests/test_stored.py

pytest: install   # -rs lists every skipped test with its reason; a skip is named again on the last line
	@$(ACT) && { log=$$(mktemp); $(ONE) pytest -q -rs -n 2 --dist worksteal --durations=15 tests 2>&1 | tee $$log; rc=$${PIPESTATUS[0]}; \
	  skipped=$$(tail -n 1 $$log | grep -o '[0-9]* skipped' | cut -d' ' -f1); rm -f $$log; \
	  if [ $$rc -eq 5 ]; then \
	    if ls tests/test_*.py >/dev/null 2>&1; then echo "pytest collected no tests but tests/ has test files"; exit 1; \
	    else echo "no tests in tests/"; exit 0; fi; fi; \
	  if [ -n "$$skipped" ]; then echo "make pytest: $$skipped test(s) SKIPPED, so this run is less than CI's:" \
	    "install what the SKIPPED lines above name (bash .ci/run does it all, as CI)"; fi; exit $$rc; }

test: check-sync lint   # the notebooks and the docs site side by side (nbdev_test's last notebooks leave a core idle), then pytest
	@$(MAKE) --no-print-directory -j2 --output-sync=target nbtest docs
	@$(MAKE) --no-print-directory pytest

# The oldest transformers supported (settings.ini's lower bound) over $(VENV)'s packages, which a .pth file adds after
# its own (site.addsitedir also runs $(VENV)'s .pth files: the editable install): the tests that touch transformers
OLDEST_TRANSFORMERS := $(shell sed -n 's/^requirements = .*transformers>=\([0-9.]*\).*/\1/p' settings.ini)
OLDEST := .venv-oldest
PURELIB := -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'

$(OLDEST)/.installed: $(VENV)/.installed
	rm -rf $(OLDEST) && python3 -m venv $(OLDEST)
	echo "import site; site.addsitedir('$$($(VENV)/bin/python $(PURELIB))')" > "$$($(OLDEST)/bin/python $(PURELIB))/venv.pth"
	$(OLDEST)/bin/pip install -q transformers==$(OLDEST_TRANSFORMERS)
	touch $@

test-oldest: $(OLDEST)/.installed   # the processor's ids, the parity and validate's reference under the oldest transformers
	@$(OLDEST)/bin/python -c 'import transformers as t; from packaging.version import Version as V; \
	  assert V(t.__version__) == V("$(OLDEST_TRANSFORMERS)"), t.__version__; print("transformers", t.__version__)'
	$(ONE) $(OLDEST)/bin/python $(VENV)/bin/nbdev_test --n_workers 2 --timing --path nbs \
	  --file_re '^(08_encoder|11_inputs|11d_hf|14_validate)\.ipynb$$'
	$(ONE) $(OLDEST)/bin/python -m pytest -q -n 2 tests/test_video_prompt.py

clean:
	rm -rf $(VENV) $(OLDEST) docs/_site docs/_build _proc
