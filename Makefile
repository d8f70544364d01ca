# Everything a fresh machine needs: `make demo` and `make test`.
PY     ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup nsq test demo bench bench-spark clean

setup: $(VENV)/.installed nsq

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install -qq -e '.[test,spark]'  # -qq: errors only (setuptools' generic note on editable installs is not ours to fix)
	touch $@

nsq:
	scripts/install-nsq

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

demo: setup
	$(BIN)/python scripts/demo

bench: setup
	$(BIN)/pip install -qq -e '.[bench]'
	$(BIN)/python -m bench.run $(BENCH_ARGS)

bench-spark: setup
	$(BIN)/python -m bench.spark $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .nsq .pytest_cache .hypothesis
