# Two commands for users: `make demo` and `make test`. Both set everything up first,
# idempotently: a virtualenv with the pinned dependencies, then the JVM jars.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-slow test-s3 ci-slow ci-s3 bootstrap lint clean

demo: bootstrap
	$(BIN)/tidemark demo

test: bootstrap
	$(BIN)/pytest

# Fault-injection tests (broker kills, SIGKILL harnesses); CI's second stage. Those also marked
# s3 run in the third stage instead, on s3a:// tables (`pytest -m slow` runs them all locally).
test-slow: bootstrap
	$(BIN)/pytest -m 'slow and not s3'

# The same guarantees on s3a:// tables, against an embedded S3 server; CI's third stage.
test-s3: bootstrap
	TIDEMARK_STORAGE=s3 $(BIN)/python -m infra.bootstrap
	TIDEMARK_TEST_STORAGE=s3 $(BIN)/pytest -m s3

# CI runs the slow and the S3 stages side by side; these slow tests run after the S3 stage's own,
# so that the two take about as long (`make test-slow` alone runs them all).
SLOW_AFTER_S3 := tests/integration/test_transactions_crash.py \
	tests/integration/test_transactions_catchup.py \
	tests/integration/test_secured_crash.py::test_sigkill_at_every_step_over_sasl_ssl_and_the_password_leaks_nowhere

ci-slow: bootstrap
	$(BIN)/pytest -m 'slow and not s3' $(addprefix --deselect ,$(SLOW_AFTER_S3))

ci-s3: test-s3
	$(BIN)/pytest -m 'slow and not s3' $(SLOW_AFTER_S3)

bootstrap: $(STAMP)
	$(BIN)/python -m infra.bootstrap

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]'
	touch $@

lint: bootstrap
	$(BIN)/ruff check tidemark infra connectors offsets pipelines outbox quality orchestration bench tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache *.egg-info
