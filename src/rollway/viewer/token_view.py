"""The token stream a trainer sees, laid out for the page: each sample's ids with their loss
mask, logprob and policy version, where its turns begin and end, where drift starts, and each
id's text when the run's model's tokenizer loads offline."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollway.model_folders import DEFAULT_MODEL, DEFAULT_MODEL_NAME, resolve_model_path
from rollway.trajectory import Sample, Trajectory

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
            for name, tokenizer in self._loaded(model_names):
                known = self._texts.setdefault(name, {})
                missing = sorted(i for i in ids if i not in known)
                try:
                    known.update(_decode_each(tokenizer, missing))
                except Exception as exc:  # an id past the vocabulary: another model's ids
                    log.info("tokenizer %s cannot decode these ids: %r", name, exc)
                    continue
                return name, {i: known[i] for i in ids}
        return None

    def decode(self, model_names: list[str], ids: list[int]) -> str | None:
        """``ids`` decoded as one text (a character split over several ids comes out whole),
        special tokens kept; None when no tokenizer loads or it cannot decode them."""
        with self._lock:
            for name, tokenizer in self._loaded(model_names):
                try:
                    return str(
                        tokenizer.decode(
                            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
                        )
                    )
                except Exception as exc:  # an id past the vocabulary: another model's ids
                    log.info("tokenizer %s cannot decode these ids: %r", name, exc)
        return None

    def _loaded(self, model_names: list[str]) -> Iterator[tuple[str, Any]]:
        """Each tokenizer that loads, the explicit one alone when given (under the lock)."""
        for name in [self._explicit] if self._explicit else model_names:
            tokenizer = self._tokenizer(name)
            if tokenizer is not None:
                yield name, tokenizer

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


#: Tokens a page of a sample's stream holds: a 200-turn rollout's 100k tokens come in pages,
#: so that the page opens at once and the browser never lays out the whole stream.
PAGE_TOKENS = 4096


def sample_views(trajectory: Trajectory, limit: int = PAGE_TOKENS) -> list[dict[str, Any]]:
    """Per sample (segment): its first page of tokens (``token_page``), its whole length, and
    its turns' spans in the stream and where drift starts (for pages the browser asks for)."""
    samples = trajectory.all_samples
    views = [_page(trajectory, sample, 0, limit) for sample in samples]
    drift = trajectory.drift
    if views and drift is not None and drift.first_mismatch is not None:
        # Drift compares the last segment (plus its closing glue) with a fresh render.
        last = views[-1]
        if drift.first_mismatch < last["length"]:
            last["drift_at"] = drift.first_mismatch
    return views


def token_page(
    trajectory: Trajectory, segment: int, offset: int, limit: int = PAGE_TOKENS
) -> dict[str, Any] | None:
    """Tokens ``offset`` to ``offset + limit`` of a segment's stream (None: no such segment),
    as ``sample_views`` lays out the first page."""
    views = {sample.segment: sample for sample in trajectory.all_samples}
    sample = views.get(segment)
    if sample is None:
        return None
    page = _page(trajectory, sample, offset, limit)
    drift = trajectory.drift
    if segment == max(views) and drift is not None and drift.first_mismatch is not None:
        page["drift_at"] = drift.first_mismatch if drift.first_mismatch < page["length"] else None
    return page


def _page(trajectory: Trajectory, sample: Sample, offset: int, limit: int) -> dict[str, Any]:
    """One page of a sample's stream (prompt, then response): ``ids`` from ``offset``; mask,
    logprobs and versions for the response ids among them (from ``response_offset`` in the
    response); the turns' spans in the whole stream."""
    prompt = len(sample.prompt_ids)
    end = offset + limit
    ids = (sample.prompt_ids[offset:end] if offset < prompt else []) + sample.response_ids[
        max(0, offset - prompt) : max(0, end - prompt)
    ]
    first, last = max(0, offset - prompt), max(0, end - prompt)
    versions = sample.policy_versions
    turns = [t for t in trajectory.turns if t.segment == sample.segment]
    return {
        "segment": sample.segment,
        "prompt_len": prompt,
        "length": prompt + len(sample.response_ids),
        "sampled": sum(sample.loss_mask),
        "offset": offset,
        "response_offset": first,
        "ids": ids,
        "loss_mask": sample.loss_mask[first:last],
        "logprobs": sample.logprobs[first:last],
        "policy_versions": versions[first:last] if versions is not None else None,
        # Present where the run asked for it (record_entropy): the page's entropy shading.
        "entropy": sample.entropy[first:last] if sample.entropy is not None else None,
        # A turn's prompt is the stream so far: its completion follows it.
        "turns": [
            {
                "index": t.index,
                "start": t.prompt_len,
                "end": t.prompt_len + len(t.completion_ids),
                "reissued": t.reissued,
            }
            for t in turns
        ],
        "drift_at": None,
    }


def token_texts(
    texts: TokenTexts, trajectory: Trajectory, views: list[dict[str, Any]], config_model: str | None
) -> tuple[str | None, dict[str, str]]:
    """The tokenizer used (None: ids only) and the text of every id the samples hold."""
    ids = {i for view in views for i in view["ids"]}
    found = texts.texts(model_names(trajectory, config_model), ids) if ids else None
    if found is None:
        return None, {}
    name, by_id = found
    return name, {str(i): text for i, text in by_id.items()}


def model_names(trajectory: Trajectory, config_model: str | None) -> list[str]:
    """The models whose tokenizer may decode the trajectory's ids, the trajectory's first."""
    return list(dict.fromkeys(n for n in (trajectory.model, config_model) if n))
