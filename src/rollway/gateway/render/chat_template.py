"""Chat messages to token ids with the model's own template, whole or incrementally.

For turn k+1 of an append-only conversation the gateway never re-tokenizes the model's earlier
tokens: it takes turn k's prompt + completion and appends only the ids of (a) the template glue
that closes the assistant turn and (b) the newly appended messages plus the generation prompt.
(b) is found by rendering a fixed sentinel conversation with and without the new messages and
tokenizing the difference; (a) is what the template writes after an assistant's content,
less the end-of-turn token when the model sampled it itself.

Some templates render earlier messages differently once later ones follow: Qwen3's writes the
last answer's thinking, then drops it (or an empty ``<think></think>``) once a tool result or a
new question follows. The sampled ids stay as sampled: (b) is then what the template writes
after the sentinel answer's content and its closing glue, which no earlier message changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
from collections import OrderedDict
from typing import Any

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.message_shapes import MessageShapes
from rollway.gateway.render.message_template import ROLES, read_pieces
from rollway.gateway.render.prefix_cache import PieceIds
from rollway.gateway.render.reasoning import think_tags
from rollway.gateway.render.token_bound import TokenBound
from rollway.gateway.render.token_bytes import token_bytes
from rollway.gateway.render.tool_calls import (
    OPEN_TAG,
    ParsedToolCalls,
    parse_tool_calls,
    render_tool_calls,
    render_tool_result,
    tool_system_prompt,
)
from rollway.generation import Message

log = logging.getLogger(__name__)
#: One continuation in this many is rendered by the template too, to check the pieces.
AUDIT_EVERY = 64
#: Longer texts are encoded by the Rust tokenizer's batch call, which releases the GIL: a
#: worker thread tokenizing a huge prompt then never stalls the event loop.
GIL_FREE_ABOVE_CHARS = 8192
#: First prompts kept: a few batches' worth of distinct tasks.
PROMPT_CACHE_SIZE = 1024
#: Tools blocks whose message shapes are kept (``MessageShapes``).
SHAPES_CACHE_SIZE = 64

_SENTINEL = "rollwaysentinel"
_BASE: list[Message] = [
    {"role": "system", "content": _SENTINEL},
    {"role": "user", "content": _SENTINEL},
    {"role": "assistant", "content": _SENTINEL},
]
#: The same, its answer with reasoning: for templates that write reasoning, an answer that
#: thought (Qwen3 writes its thinking back while a tool loop lasts, and drops it after).
_BASE_THINKING: list[Message] = [*_BASE[:2], {**_BASE[2], "reasoning_content": _SENTINEL}]


class TokenBudgetExceeded(Exception):
    """A text needs more tokens than allowed: ``at_least`` is its exact count, or a lower
    bound when its length alone ruled it out (then it was never tokenized)."""

    def __init__(self, at_least: int) -> None:
        super().__init__(at_least)
        self.at_least = at_least


class ChatRenderer:
    """Renders and tokenizes conversations for one HF tokenizer. Methods that take
    ``max_tokens`` raise ``TokenBudgetExceeded`` past it, before tokenizing where they can.

    The ``hermes`` renderer (``base.Renderer``): the template as it is, tools it has no place
    for shown by the Hermes tool prompt, and calls parsed as Hermes ``<tool_call>`` blocks.
    A family whose calls are written otherwise overrides the ``tool_*`` and ``parse`` hooks."""

    name = "hermes"
    #: Text where a tool call begins: a stream holds it back (``turn_stream``).
    tool_call_open = OPEN_TAG

    def __init__(self, tokenizer: Any) -> None:
        if not tokenizer.chat_template:
            raise InvalidFieldsError("the model's tokenizer has no chat template")
        self.tokenizer = tokenizer
        #: Special tokens: the sampled ones end a turn or are left out of its text.
        self.stop_ids = frozenset(int(i) for i in tokenizer.all_special_ids)
        self.bound = TokenBound(tokenizer)
        self.native_tools = "tools" in tokenizer.chat_template
        self.eos_text: str = tokenizer.eos_token or ""
        base = self.render(_BASE, None, add_generation_prompt=False)
        # What the template writes after an assistant's content, e.g. "<|im_end|>\n".
        self._assistant_tail = base[base.rindex(_SENTINEL) + len(_SENTINEL) :]
        #: How the template marks reasoning (None: it has none): answers are split by it.
        self.thinking = think_tags(str(tokenizer.chat_template), self._generation_prompt())
        self._base = _BASE_THINKING if self.thinking is not None else _BASE
        self._base_renders: dict[str, str] = {}
        # The Rust tokenizer itself where there is one: transformers' wrapper costs more than
        # the encoding of a turn's few new tokens.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # Its batch call without offsets (tokenizers 0.21+): the same ids, a third faster on
        # long texts (a tool's output), and it releases the GIL like every batch call.
        self._encode_fast = getattr(self._backend, "encode_batch_fast", None)
        # transformers' decode then rewrites " ," and the like; the Rust one alone does not.
        self._cleans_up_spaces = bool(getattr(tokenizer, "clean_up_tokenization_spaces", True))
        self._pieces = read_pieces(_BASE, self._render_prepared)
        #: First prompts' ids by pieces (``prefix_cache``): a system prompt and tools that
        #: many tasks share are tokenized once; None where the tokenizer's pieces do not fit.
        self.prompt_pieces = PieceIds.for_tokenizer(tokenizer, self._encode_many)
        self._piece_prompts = 0
        #: First prompts of recent conversations: a group's rollouts all start from one.
        self._prompts: OrderedDict[bytes, list[int]] = OrderedDict()
        self._glue: dict[int, str] = {}
        self._continued = 0
        #: New messages rendered by their shape, per tools block and history choice: where
        #: the pieces do not fit the template (Qwen3's).
        self._shapes: OrderedDict[tuple[str, bool], MessageShapes] | None = OrderedDict()

    def parse(
        self,
        text: str,
        use_tools: bool,
        tools: list[dict[str, Any]] | None = None,
        end_id: int | None = None,
    ) -> ParsedToolCalls:
        """An answer's text (special tokens and stop strings already cut) as reasoning,
        content and tool calls; a malformed call leaves the text whole with ``error`` set.
        ``tools`` (the request's) type the arguments of families that write them as text."""
        reasoning = None
        if self.thinking is not None:
            reasoning, text = self.thinking.split(text)
        parsed = self.parse_tool_calls(text) if use_tools else ParsedToolCalls(text)
        return dataclasses.replace(parsed, reasoning=reasoning)

    def parse_tool_calls(self, text: str) -> ParsedToolCalls:
        return parse_tool_calls(text)

    def tool_prompt(self, tools: list[dict[str, Any]]) -> str:
        """The system prompt's text that shows ``tools``, where the template has none."""
        return tool_system_prompt(tools)

    def tool_calls_text(self, content: str, tool_calls: list[dict[str, Any]]) -> str:
        """An earlier answer's calls written back, where the template does not write them."""
        return render_tool_calls(content, tool_calls)

    def tool_result_text(self, content: str) -> str:
        return render_tool_result(content)

    def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
        if max_tokens is not None and (least := self.bound.at_least(text)) > max_tokens:
            raise TokenBudgetExceeded(least)
        if self._encode_fast is not None:
            ids: list[int] = self._encode_fast([text], add_special_tokens=False)[0].ids
        elif self._backend is not None and len(text) <= GIL_FREE_ABOVE_CHARS:
            ids = self._backend.encode(text, add_special_tokens=False).ids
        elif self._backend is not None:  # the batch call lets go of the GIL while it works
            ids = self._backend.encode_batch([text], add_special_tokens=False)[0].ids
        else:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        if max_tokens is not None and len(ids) > max_tokens:
            raise TokenBudgetExceeded(len(ids))
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str
        if self._backend is not None and not self._cleans_up_spaces:
            text = self._backend.decode(ids, skip_special_tokens=False)
        else:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text

    def decode_one(self, token_id: int) -> str:
        text: str = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def token_piece(self, token_id: int) -> tuple[str, bytes]:
        """A token's text alone and its own bytes (``token_bytes``: part of a character's
        where the text is U+FFFD)."""
        text = self.decode_one(token_id)
        return text, token_bytes(self.tokenizer, token_id, text)

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        prepared = self._prepare(messages, tools)
        kwargs: dict[str, Any] = {"tools": tools} if (tools and self.native_tools) else {}
        text: str = self.tokenizer.apply_chat_template(
            prepared, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
        return text

    def prompt_ids(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """The whole conversation, ready for the model to answer."""
        key = _cache_key(messages, tools)
        ids = self._prompts.get(key)
        if ids is None:
            # The budget goes in: an over-long prompt is refused before it is tokenized.
            text = self.render(messages, tools, add_generation_prompt=True)
            ids = self._encode_prompt(text, max_tokens)
            self._prompts[key] = ids
            if len(self._prompts) > PROMPT_CACHE_SIZE:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(key)
        if max_tokens is not None and len(ids) > max_tokens:
            raise TokenBudgetExceeded(len(ids))
        return list(ids)

    def _encode_prompt(self, text: str, max_tokens: int | None) -> list[int]:
        """A first prompt's ids by its pieces where the tokenizer allows, one prompt in
        ``AUDIT_EVERY`` checked against encoding it whole; a mismatch drops the pieces,
        loudly."""
        pieces = self.prompt_pieces
        if pieces is None:
            return self.encode(text, max_tokens)
        if max_tokens is not None and (least := self.bound.at_least(text)) > max_tokens:
            raise TokenBudgetExceeded(least)
        ids = pieces.ids(text)
        self._piece_prompts += 1
        if self._piece_prompts % AUDIT_EVERY == 1 and ids != (whole := self.encode(text)):
            log.warning("a prompt's ids by pieces disagree with the whole text's; not used again")
            self.prompt_pieces = None
            self._prompts.clear()  # those made by pieces since the last audit
            ids = whole
        if max_tokens is not None and len(ids) > max_tokens:
            raise TokenBudgetExceeded(len(ids))
        return ids

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        """Texts' ids in one call of the Rust tokenizer (which lets go of the GIL)."""
        if self._encode_fast is not None:
            return [e.ids for e in self._encode_fast(texts, add_special_tokens=False)]
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]
        return [self.tokenizer.encode(text, add_special_tokens=False) for text in texts]

    def transcript_ids(
        self, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """The whole conversation as a closed transcript (no generation prompt)."""
        return self.encode(self.render(messages, tools, add_generation_prompt=False))

    def closing_glue(self, completion_ids: list[int]) -> str:
        """Template text that closes an assistant turn after the sampled ``completion_ids``."""
        if not completion_ids:
            return self._assistant_tail
        glue = self._glue.get(completion_ids[-1])
        if glue is None:
            last = self.decode(completion_ids[-1:])
            tail = self._assistant_tail
            glue = tail[len(last) :] if last and tail.startswith(last) else tail
            self._glue[completion_ids[-1]] = glue
        return glue

    def continuation_ids(
        self,
        completion_ids: list[int],
        new_messages: list[Message],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None = None,
        keep_sampled: bool = True,
    ) -> list[int] | None:
        """Ids to append after a completion for ``new_messages`` and the generation prompt.

        Where the template renders earlier messages differently once these follow (it is not
        append-stable), ``keep_sampled`` keeps the history as sampled and appends what the
        template writes for the new messages; without it the answer is None, and the caller
        starts a new segment rendered as the template does.
        """
        if self._pieces is not None and self._plain(new_messages, tools):
            text = self._pieces.render([self._prepare_one(m) for m in new_messages])
            self._continued += 1
            if self._continued % AUDIT_EVERY != 1 or self._audit(text, new_messages, tools):
                return self.encode(self.closing_glue(completion_ids) + text, max_tokens)
        added = self._shaped(new_messages, tools, keep_sampled)
        if added is None:
            added = self._template_tail(new_messages, tools, keep_sampled)
        if added is None:
            return None
        return self.encode(self.closing_glue(completion_ids) + added, max_tokens)

    def _template_tail(
        self, new_messages: list[Message], tools: list[dict[str, Any]] | None, keep_sampled: bool
    ) -> str | None:
        """The template's text for ``new_messages`` and the generation prompt, after an
        answer (``continuation_ids``), by a Jinja run over the sentinel conversation."""
        base = self._base_render(tools)
        extended = self.render(self._base + new_messages, tools, add_generation_prompt=True)
        if extended.startswith(base):
            return extended[len(base) :]
        return self._after_sampled(extended, new_messages) if keep_sampled else None

    def _shaped(
        self, new_messages: list[Message], tools: list[dict[str, Any]] | None, keep_sampled: bool
    ) -> str | None:
        """``_template_tail`` by the messages' shape (``MessageShapes``), None where it has
        none; checked against the template now and then, and dropped, loudly, on a mismatch."""
        if self._shapes is None:
            return None
        # The tools as given: a template may write them in the new messages (their order too).
        key = (json.dumps(tools) if tools else "", keep_sampled)
        shapes = self._shapes.get(key)
        if shapes is None:
            shapes = MessageShapes(lambda m: self._template_tail(m, tools, keep_sampled))
            self._shapes[key] = shapes
            if len(self._shapes) > SHAPES_CACHE_SIZE:
                self._shapes.popitem(last=False)
        text = shapes.render(new_messages)
        if text is None:
            return None
        self._continued += 1
        audit = self._continued % AUDIT_EVERY == 1
        if audit and text != self._template_tail(new_messages, tools, keep_sampled):
            log.warning("the chat template's message shapes disagree with it; not used again")
            self._shapes = None
            return None
        return text

    def _after_sampled(self, extended: str, new_messages: list[Message]) -> str | None:
        """What the template writes for ``new_messages`` after the sentinel answer, where it
        rendered the earlier messages differently: the text past that answer's content and
        closing glue (None when the template puts something else there)."""
        if any(_SENTINEL in str(message) for message in new_messages):
            return None  # the last sentinel would not be the answer's
        after = extended[extended.rindex(_SENTINEL) + len(_SENTINEL) :]
        if not after.startswith(self._assistant_tail):
            return None
        return after[len(self._assistant_tail) :]

    def _audit(
        self, text: str, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> bool:
        """Check the pieces against the template on a real turn now and then; on a mismatch
        the template is used from then on (and the mismatch said once, loudly)."""
        extended = self.render(self._base + messages, tools, add_generation_prompt=True)
        if extended == self._base_render(tools) + text:
            return True
        log.warning("the chat template's pieces disagree with the template; not used again")
        self._pieces = None
        return False

    def _plain(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> bool:
        """Whether the template's pieces render these messages: tools folded into the system
        prompt (or none), and nothing but a role and text for the template to see."""
        if self.native_tools and (tools or any(set(m) - {"role", "content"} for m in messages)):
            return False
        return all(m["role"] in ROLES or m["role"] == "developer" for m in messages)

    def _generation_prompt(self) -> str:
        question: list[Message] = [{"role": "user", "content": _SENTINEL}]
        asked = self._render_prepared(question, True)
        return asked[len(self._render_prepared(question, False)) :]

    def _render_prepared(self, messages: list[Message], add_generation_prompt: bool) -> str:
        text: str = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return text

    def _base_render(self, tools: list[dict[str, Any]] | None) -> str:
        key = json.dumps(tools, sort_keys=True) if tools else ""
        cached = self._base_renders.get(key)
        if cached is None:
            cached = self.render(self._base, tools, add_generation_prompt=False)
            self._base_renders[key] = cached
        return cached

    def _prepare(
        self, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> list[Message]:
        prepared = [self._prepare_one(m) for m in messages]
        if tools and not self.native_tools:
            prompt = self.tool_prompt(tools)
            if prepared and prepared[0]["role"] == "system":
                prepared[0] = {"role": "system", "content": f"{prepared[0]['content']}\n\n{prompt}"}
            else:
                prepared.insert(0, {"role": "system", "content": prompt})
        return prepared

    def _prepare_one(self, message: Message) -> Message:
        role = "system" if message["role"] == "developer" else message["role"]
        content = content_text(message.get("content"))
        tool_calls = message.get("tool_calls") or []
        if self.native_tools:
            out: Message = {"role": role, "content": content}
            if message.get("reasoning_content") is not None:  # a recorded answer's
                out["reasoning_content"] = message["reasoning_content"]
            if tool_calls:
                out["tool_calls"] = [_with_dict_arguments(c) for c in tool_calls]
            if message.get("tool_call_id"):
                out["tool_call_id"] = message["tool_call_id"]
            return out
        if role == "assistant" and tool_calls:
            content = self.tool_calls_text(content, tool_calls)
        elif role == "tool":
            content = self.tool_result_text(content)
        return {"role": role, "content": content}


def content_text(content: Any) -> str:
    """Message content as text: strings as they are, text parts joined, None as empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise InvalidFieldsError(
                f"content part of type {part.get('type')!r} is not supported; only text",
                param="messages",
            )
        parts.append(part.get("text", ""))
    return "".join(parts)


def _with_dict_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function", {}))
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError, RecursionError):
            function["arguments"] = json.loads(arguments)
    return {**call, "function": function}


def _cache_key(messages: list[Message], tools: list[dict[str, Any]] | None) -> bytes:
    """What tells first prompts apart: the json module in the order given, since the template
    renders keys in that order, and orjson writes NaN and Infinity as null and cannot write
    integers past 64 bits."""
    try:
        text = json.dumps([messages, tools], ensure_ascii=False, default=repr)
    except (ValueError, RecursionError):
        text = repr([messages, tools])
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass")).digest()
