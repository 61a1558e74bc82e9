# The two commands of the README. Both set up everything they need (scripts/bootstrap.sh).
.PHONY: demo test lint bench setup

setup:
	@bash scripts/bootstrap.sh

# Main job: generate a demo dataset and measure it against the baselines.
demo: setup
	@.venv/bin/rowstore-bench --demo tiny --compare --plot .cache/rowstore/demo-tiny.png

# The whole test suite (examples included), on both cores; tests sharing the Spark session or
# the Dask cluster are grouped on one worker each (xdist_group + --dist loadgroup).
test: setup
	@.venv/bin/python -m pytest -q -n 2 --dist loadgroup

lint: setup
	@.venv/bin/ruff check rowstore tests bench examples

bench: setup
	@.venv/bin/python bench/read_bench.py
