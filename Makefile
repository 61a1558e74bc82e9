# The two commands of the README. Both set up everything they need (scripts/bootstrap.sh).
.PHONY: demo test lint bench setup asan fuzz

setup:
	@bash scripts/bootstrap.sh

# Main job: generate a demo dataset and measure it against the baselines.
demo: setup
	@.venv/bin/rowstore-bench --demo tiny --compare --plot .cache/rowstore/demo-tiny.png

# The whole test suite (examples included), on both cores; tests sharing the Spark session or
# the Dask cluster are grouped on one worker each (xdist_group + --dist loadgroup).
test: setup
	@.venv/bin/python -m pytest -q -n 2 --dist loadgroup

# The linter and the formatter's check, over the trees tests/meta/test_lint.py checks.
lint: setup
	@.venv/bin/ruff check rowstore tests bench examples tools
	@.venv/bin/ruff format --check rowstore tests bench examples tools

bench: setup
	@.venv/bin/python bench/read_bench.py

# The kernels under AddressSanitizer + UBSan (clang; build/asan, the normal build untouched): the
# fuzz reproducers and corpus, new fuzz cases and the kernel tests (docs/reliability.md).
asan: setup
	@.venv/bin/python tools/robustness/asan_check.py

# Coverage-guided fuzzing with atheris in its own venv (.fuzz-venv), kernels built with libFuzzer
# coverage and ASan + UBSan (build/fuzz); MINUTES=10 by default. Crashers go to
# bench/results/atheris-work/crashers (commit them to tests/data/atheris/crashers).
fuzz: setup
	@bash scripts/fuzz_venv.sh && bash scripts/build_sanitized.sh fuzz && \
		.fuzz-venv/bin/python tools/robustness/fuzz_atheris.py --minutes $(or $(MINUTES),10)
