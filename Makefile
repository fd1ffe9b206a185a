# The two entry points of README.md: `make demo` (main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# test workers (pytest-xdist): the reference machine has 2 cores; tests of one file share a worker
TEST_JOBS ?= 2
STAMP := $(VENV)/.installed-stamp
# one OpenBLAS kernel for the tests on every x86 machine with AVX2 (Haswell's): a float32
# matmul's last bits depend on the kernel. The accuracy (offset) draws' verdicts do not:
# they evaluate with exact accumulations (GPT-2's block at a 65536 offset was refused with
# the AVX-512 kernel and accepted with Haswell's until they did); the other native draws
# still sum in float32 with tolerances. Set OPENBLAS_CORETYPE
# yourself to test another kernel.
BLAS_KERNEL := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo Haswell)
OPENBLAS_CORETYPE ?= $(BLAS_KERNEL)
export OPENBLAS_CORETYPE

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/eqsat-mirage demo

test: $(STAMP)
	$(PY) -m ruff check eqsat_mirage tests bench
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

bench: $(STAMP)
	$(PY) bench/verify_bench.py --write bench/RESULTS.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
