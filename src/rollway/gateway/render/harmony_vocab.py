"""GPT-OSS's harmony vocabulary made offline, from the model folder's own ``tokenizer.json``.

``openai_harmony`` downloads ``o200k_base.tiktoken`` at run time, which fails where nothing
but a package registry is reachable. The file is the tokenizer's byte-level BPE vocabulary
written as tiktoken writes it: each non-special token's bytes (its string mapped back through
GPT-2's byte table), base64-encoded, a space, its rank, a newline, in rank order. Made so it
is byte-identical to the official file, whose SHA-256 harmony checks (``O200K_SHA256``), and
harmony loads it from the folder named by ``TIKTOKEN_ENCODINGS_BASE``.

Standard library only: ``scripts/fetch_families.sh`` runs this file as a script
(``python3 harmony_vocab.py TOKENIZER_JSON OUT_DIR``) where rollway may not be installed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

VOCAB_NAME = "o200k_base.tiktoken"
#: The SHA-256 of the official file, as harmony checks it.
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class VocabError(ValueError):
    """The tokenizer.json does not make the official vocabulary."""


def gpt2_byte_table() -> dict[str, int]:
    """GPT-2's map from the characters byte-level BPE writes back to the bytes they stand for."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


def vocab_text(tokenizer_json: dict[str, Any]) -> bytes:
    """The tiktoken file's bytes for a byte-level BPE ``tokenizer.json``."""
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, dict):
        raise VocabError("tokenizer.json has no byte-level BPE vocabulary")
    table = gpt2_byte_table()
    by_rank = sorted(vocab.items(), key=lambda item: item[1])
    lines = []
    for token, rank in by_rank:
        try:
            raw = bytes(table[char] for char in token)
        except KeyError:
            raise VocabError(f"token {token!r} is not byte-level BPE") from None
        lines.append(base64.b64encode(raw) + b" " + str(rank).encode() + b"\n")
    return b"".join(lines)


def write_vocab(tokenizer_json: Path, out_dir: Path) -> Path:
    """``out_dir/o200k_base.tiktoken`` made from ``tokenizer_json``, checked against the
    official SHA-256 (a mismatch writes nothing), written atomically; kept where present."""
    target = out_dir / VOCAB_NAME
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256:
        return target
    try:
        data = vocab_text(json.loads(tokenizer_json.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise VocabError(f"cannot make {VOCAB_NAME} from {tokenizer_json}: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise VocabError(
            f"{tokenizer_json} is not GPT-OSS's tokenizer: its vocabulary's SHA-256 is "
            f"{digest}, harmony's o200k_base is {O200K_SHA256}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f".{VOCAB_NAME}.{os.getpid()}"
    partial.write_bytes(data)
    partial.replace(target)
    return target


def load_harmony(tokenizer_json: Path) -> Any:
    """``openai_harmony``'s GPT-OSS encoding, offline: its vocabulary made from the model
    folder's ``tokenizer_json`` into rollway's cache once (``ROLLWAY_CACHE_DIR``/harmony),
    never downloaded. Sets ``TIKTOKEN_ENCODINGS_BASE`` to that folder, as harmony reads it."""
    try:
        import openai_harmony
    except ImportError:
        raise ImportError(
            "GPT-OSS's harmony encoder needs openai-harmony: pip install 'rollway[gptoss]'"
        ) from None
    cache = Path(os.environ.get("ROLLWAY_CACHE_DIR", Path.home() / ".cache" / "rollway"))
    folder = write_vocab(tokenizer_json, cache / "harmony").parent
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    name = openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS
    return openai_harmony.load_harmony_encoding(name)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} TOKENIZER_JSON OUT_DIR")
    try:
        print(write_vocab(Path(sys.argv[1]), Path(sys.argv[2])))
    except VocabError as error:
        sys.exit(str(error))
