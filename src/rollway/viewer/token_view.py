"""The token stream a trainer sees, laid out for the page: each sample's ids with their loss
mask, logprob and policy version, where its turns begin and end, where drift starts, and each
id's text when the run's model's tokenizer loads offline."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from rollway.engines.models import DEFAULT_MODEL, DEFAULT_MODEL_NAME, resolve_model_path
from rollway.types import Trajectory

log = logging.getLogger(__name__)


class TokenTexts:
    """Token ids as text, one by one. The tokenizer is ``tokenizer`` when given, else the
    named model's: the embedded model's converted copy, a local folder, or a hub id already in
    the local cache (never downloaded). None when none loads: the page shows ids."""

    def __init__(self, tokenizer: str | None = None) -> None:
        self._explicit = tokenizer
        self._tokenizers: dict[str, Any] = {}
        self._texts: dict[str, dict[int, str]] = {}
        self._lock = threading.Lock()

    def texts(self, model_names: list[str], ids: set[int]) -> tuple[str, dict[int, str]] | None:
        """(the tokenizer's name, text of each id) with the first tokenizer that loads."""
        with self._lock:
            for name in [self._explicit] if self._explicit else model_names:
                tokenizer = self._tokenizer(name)
                if tokenizer is None:
                    continue
                known = self._texts.setdefault(name, {})
                missing = sorted(i for i in ids if i not in known)
                try:
                    known.update(_decode_each(tokenizer, missing))
                except Exception as exc:  # an id past the vocabulary: another model's ids
                    log.info("tokenizer %s cannot decode these ids: %r", name, exc)
                    continue
                return name, {i: known[i] for i in ids}
        return None

    def _tokenizer(self, name: str) -> Any:
        if name not in self._tokenizers:
            self._tokenizers[name] = _load_tokenizer(name)
        return self._tokenizers[name]


def _decode_each(tokenizer: Any, ids: list[int]) -> dict[int, str]:
    if not ids:
        return {}
    pieces = tokenizer.batch_decode(
        [[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return dict(zip(ids, pieces, strict=True))


def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        if name in (DEFAULT_MODEL_NAME, DEFAULT_MODEL):
            source: str | Path = resolve_model_path(None)
        elif Path(name).expanduser().is_dir():
            source = Path(name).expanduser()
        else:
            source = name
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception as exc:  # not a model, not here, not offline: show ids
        log.info("no tokenizer for %s: %r", name, exc)
        return None


def sample_views(trajectory: Trajectory) -> list[dict[str, Any]]:
    """Per sample (segment): the whole stream (prompt, then response) and, aligned with the
    response, mask, logprobs and versions; the turns' spans in the stream; drift's start."""
    views = []
    for sample in trajectory.samples:
        turns = [t for t in trajectory.turns if t.segment == sample.segment]
        views.append({
            "segment": sample.segment,
            "prompt_len": len(sample.prompt_ids),
            "ids": sample.prompt_ids + sample.response_ids,
            "loss_mask": sample.loss_mask,
            "logprobs": sample.logprobs,
            "policy_versions": sample.policy_versions,
            # A turn's prompt is the stream so far: its completion follows it.
            "turns": [
                {"index": t.index, "start": len(t.prompt_ids),
                 "end": len(t.prompt_ids) + len(t.completion_ids), "reissued": t.reissued}
                for t in turns
            ],
            "drift_at": None,
        })  # fmt: skip
    drift = trajectory.drift
    if views and drift is not None and drift.first_mismatch is not None:
        # Drift compares the last segment (plus its closing glue) with a fresh render.
        last = views[-1]
        if drift.first_mismatch < len(last["ids"]):
            last["drift_at"] = drift.first_mismatch
    return views


def token_texts(
    texts: TokenTexts, trajectory: Trajectory, views: list[dict[str, Any]], config_model: str | None
) -> tuple[str | None, dict[str, str]]:
    """The tokenizer used (None: ids only) and the text of every id the samples hold."""
    ids = {i for view in views for i in view["ids"]}
    names = [n for n in (trajectory.model, config_model) if n]
    found = texts.texts(list(dict.fromkeys(names)), ids) if ids else None
    if found is None:
        return None, {}
    name, by_id = found
    return name, {str(i): text for i, text in by_id.items()}
