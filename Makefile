# The two commands: `make demo` (swarl's main job on its embedded default) and `make test`.
.PHONY: setup demo test lint bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/swarl demo $(ARGS)

test: setup
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/python -m pytest -q -p no:cacheprovider $(ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/lint-imports

bench: setup
	for b in benchmarks/*.py; do .venv/bin/python $$b || exit 1; done

clean:
	rm -rf .swarl runs
