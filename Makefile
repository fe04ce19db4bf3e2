# One entry point. `make run` and `make test` work on a fresh machine: they create .venv, install the
# pinned requirements, and start embedded PostgreSQL+pgvector and Valkey unless DATABASE_URL/REDIS_URL are set.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench bench-hosts bench-scale lint format check migrations shell clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

run: $(STAMP)  ## run the platform on http://127.0.0.1:$${PORT:-8283}
	$(PY) scripts/devenv.py run

test: $(STAMP)  ## the whole test suite against real PostgreSQL+pgvector and Redis
	$(PY) scripts/devenv.py test

bench: $(STAMP)  ## benchmarks (prints a table, writes bench/results/)
	$(PY) scripts/devenv.py bench

bench-hosts: $(STAMP)  ## turns/s with one and with two worker hosts, same cores (bench/worker_hosts.py)
	echo "$(PY) -m bench.worker_hosts" | DATA_DIR=$${DATA_DIR:-var}/bench-hosts $(PY) scripts/devenv.py shell

bench-scale: $(STAMP)  ## 10k agents, 1M messages, 1M passages: seeded once (~1 h on 2 cores, kept), then measured
	DATA_DIR=$${DATA_DIR:-var}/scale-bench $(PY) scripts/devenv.py manage migrate --noinput --verbosity 0
	echo "$(PY) -m bench.scale_bench $(ARGS)" | DATA_DIR=$${DATA_DIR:-var}/scale-bench $(PY) scripts/devenv.py shell

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

check: $(STAMP)  ## lint, formatting, the apps' import layers, types against their baseline, migrations
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_types.py
	DJANGO_SECRET_KEY=check DATABASE_URL=postgres://check@127.0.0.1:1/none REDIS_URL=redis://127.0.0.1:1/0 \
		$(PY) -W ignore::RuntimeWarning manage.py makemigrations --check --dry-run

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

migrations: $(STAMP)  ## make new migrations after a model change
	$(PY) scripts/devenv.py manage makemigrations

shell: $(STAMP)  ## a shell with the embedded services running and their URLs exported
	$(PY) scripts/devenv.py shell

clean:
	rm -rf $(VENV) var/test
