# Everything runs from a local virtual environment that these targets build on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test check bench soak reliability lint clean

$(STAMP): Makefile setup.cfg setup.py pyproject.toml persistlog/_cbor_json.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# compat: a plain path entry in a .pth, which mypy follows for users' scripts (PEP 561);
	# the default editable mode installs an import hook that type checkers cannot see.
	$(PY) -m pip install --quiet -e '.[test,s3,spark,zstd]' --config-settings editable_mode=compat
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

# The fast lane while developing (about two minutes): every test but the slow, Spark and
# soak ones (markers in setup.cfg; CONTRIBUTING.md). `make test` stays what CI runs.
check: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not spark"

bench: $(STAMP)
	$(PY) bench/run.py

soak: $(STAMP)
	$(PY) tests/soak.py --iterations 1000 --seconds 600 --destinations local,s3 --json build/soak.json

reliability: $(STAMP)
	$(PY) tests/reliability/report.py --soak-seconds 300 --json build/reliability.json

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build *.egg-info persistlog/*.so
