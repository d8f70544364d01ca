# Everything a fresh machine needs: `make demo` and `make test`.
PY     ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PYTEST_ARGS ?= --durations=25  # where CI time goes: the 25 slowest tests of each pass
# pytest-xdist: the tests mostly wait on real servers, so 4 run at once on 2 cores. The Spark tests
# have passes of their own, in groups of whole files (tests/conftest.py): among the rest they
# were 2-3x slower and hit the timeout. scripts/test-passes runs the passes two at a time.
XDIST ?= -n 4 --dist loadgroup
SPARK_XDIST ?= -n 3 --dist loadgroup
LTS_XDIST ?= -n 2 --dist loadgroup
# `make test` runs the whole suite on NSQ v1.3.0 (.nsq/bin), then the tests that exercise the
# server - client core, pub/mpub/tail, to-file, admin, TLS/AUTH - again on each older release
# here (built into .nsq/versions/VERSION/bin). `make test COMPAT_VERSIONS=` runs the first pass
# only. What the second pass leaves out, and why: tests/conftest.py (COMPAT_LEFT_OUT, nsq_1_3).
COMPAT_VERSIONS ?= v1.2.1
COMPAT_TESTS ?= tests/client/test_conn.py tests/client/test_consumer.py tests/client/test_producer.py \
	tests/client/test_interop.py tests/client/test_discovery.py tests/cli/test_pub.py tests/cli/test_mpub.py \
	tests/cli/test_tail.py tests/cli/test_to_file.py tests/cli/test_admin.py tests/cli/test_security_hints.py \
	tests/daemon/test_daemons.py tests/daemon/test_lag.py

# The editable install as a path in a .pth file (setuptools' compat mode), not its default import
# hook: that hook imports pathlib, re and fnmatch in every Python process of the environment - each
# nsqcli run, pytest worker and Spark Python worker - 15-20 ms of CPU a start (50 starts: 1.97 ->
# 1.22 CPU-s), for ~2,000 starts a `make test`. scripts/spark-env installs the same way.
EDITABLE = --config-settings editable_mode=compat -e

# `make test` also runs the tests marked spark_lts again on the oldest supported pyspark (the LTS
# line of the managed runtimes), in its own environment made by scripts/spark-env. Before each
# Spark pass scripts/spark-cds archives that pyspark's driver classes (class-data sharing): the
# tests' ~40 Spark drivers then start in about half the time.
SPARK_LTS ?= 4.0.5
SPARK_LTS_VENV = .venv-spark-$(SPARK_LTS)

.PHONY: setup nsq test spark-cds lts-env test-spark-lts demo bench bench-spark clean

setup: $(VENV)/.installed nsq

$(VENV)/.installed: pyproject.toml Makefile  # Makefile: how it installs (EDITABLE)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install -qq $(EDITABLE) '.[test,spark]'  # -qq: errors only (setuptools' generic note on editable installs is not ours to fix)
	touch $@

nsq:
	scripts/install-nsq v1.3.0 $(COMPAT_VERSIONS)
	scripts/install-toxiproxy

# A fresh machine's installs run at once (-O, where make has it: each one's output whole): the Python
# environments while Go builds NSQ, and each environment's Spark class archive as soon as that
# environment is there (alone, one after another, they took 31 + 51 + 48 s, then 50 s for the
# archives). The pyspark 4.0.5 environment comes after the first: an editable install writes
# nsqcli.egg-info into this tree, so two at once could tread on each other.
test:
	$(MAKE) --no-print-directory -j3 $(if $(filter output-sync,$(.FEATURES)),-O) setup spark-cds lts-env LTS_AFTER=$(VENV)/.installed
	BIN=$(BIN) LTS_VENV=$(SPARK_LTS_VENV) XDIST="$(XDIST)" SPARK_XDIST="$(SPARK_XDIST)" LTS_XDIST="$(LTS_XDIST)" PYTEST_ARGS="$(PYTEST_ARGS)" \
		COMPAT_VERSIONS="$(COMPAT_VERSIONS)" COMPAT_TESTS="$(COMPAT_TESTS)" scripts/test-passes

spark-cds: $(VENV)/.installed
	$(BIN)/python scripts/spark-cds

lts-env: $(LTS_AFTER)
	scripts/spark-env $(SPARK_LTS) $(SPARK_LTS_VENV)
	$(SPARK_LTS_VENV)/bin/python scripts/spark-cds

test-spark-lts: nsq lts-env
	@echo "== the spark_lts tests again, on pyspark $(SPARK_LTS)"
	env -u PYTHONDONTWRITEBYTECODE $(SPARK_LTS_VENV)/bin/pytest -m spark_lts  # its pyspark is installed without bytecode (scripts/spark-env)

demo: setup
	$(BIN)/python scripts/demo

bench: setup
	$(BIN)/pip install -qq $(EDITABLE) '.[bench]'
	$(BIN)/python -m bench.run $(BENCH_ARGS)

bench-spark: setup
	$(BIN)/python -m bench.spark $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-spark-* .nsq .pytest_cache .hypothesis
