# Conveniences over the scripts in bin/ (which are what the README documents).
.PHONY: install run test lint format check bench

install:
	bin/install

run:
	bin/run-console

test:
	bin/run-tests

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format:
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

check:
	.venv/bin/python manage.py queuecheck

bench:
	.venv/bin/python bench/run.py
