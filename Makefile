# Two commands do all the set-up on a fresh machine (see README "Quick start"):
#   make example   - create .venv, install the launcher + PyTorch CPU + NumPy, run the 4-rank fault demo
#   make test      - create .venv, install everything the suite needs, run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch==2.13.0 resolves to the local CPU wheel on these machines; pinning it first keeps pip
# from ever pulling the CUDA build through a looser requirement.
TORCH := torch==2.13.0
# torch warns "Failed to initialize NumPy" at import without it: installed with torch, never alone.
NUMPY := numpy
# The checkout is installed editable as a path entry (`compat`), not through setuptools' import hook:
# the hook's .pth imports pathlib and importlib.util in `site`, ~10 ms at the start of every Python
# process of this venv (the launcher and each of its ranks), which an installed wheel never pays.
EDITABLE := --config-settings editable_mode=compat
MINDSPORE := mindspore==2.10.0
RUNS := runs/example
# Test files run in parallel, one file per worker at a time (`--dist loadfile`: a file's module
# fixtures, such as the chaos suite's reference runs, are built once). 2 workers on 2 cores halve the
# suite's wall time; `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 2

.PHONY: example test bench venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.base: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install -q $(TORCH) $(NUMPY)
	$(BIN)/python -m pip install -q $(EDITABLE) -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(BIN)/python -m pip install -q $(EDITABLE) -e '.[test]' $(TORCH) $(NUMPY) $(MINDSPORE)
	touch $@

venv: $(VENV)/.base

example: $(VENV)/.base
	rm -rf $(RUNS)
	$(BIN)/launcher run --nproc-per-node 4 --max-restarts 3 --console-ranks 0,2 \
		--run-dir $(RUNS)/run --log-dir $(RUNS)/logs --checkpoint-dir $(RUNS)/ckpt --dp 4 \
		--heartbeat-timeout 120 -- \
		examples/pytorch/train.py --ckpt-dir $(RUNS)/ckpt \
		--steps 200 --ckpt-every 20 --step-time 0.2 --fail-at-step 150 --fail-rank 2 --fail-mode kill

test: $(VENV)/.test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: $(VENV)/.test
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) runs
