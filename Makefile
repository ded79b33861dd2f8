# Conveniences over the scripts in bin/ (which are what the README documents). The targets that
# use the virtual environment's tools run bin/install first, which only does what is missing (on a
# fresh clone: .venv with ruff, mypy and the rest).
.PHONY: install run test quick lint format check bench

install:
	bin/install

run:
	bin/run-console

test:
	bin/run-tests

quick:
	bin/run-tests --quick

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: install
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

check: install
	.venv/bin/python manage.py queuecheck

bench: install
	.venv/bin/python bench/run.py
