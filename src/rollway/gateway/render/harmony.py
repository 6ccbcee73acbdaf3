"""GPT-OSS: conversations in OpenAI's harmony format, answers read by their channels.

The model folder's chat template writes the system and developer messages (model identity,
date, reasoning effort, the tools as a TypeScript namespace): rendered once per instructions,
tools and day. The messages after them are written here as ``openai_harmony`` renders them
(string work, then one tokenizer call): the format the model was trained on and vLLM serves.
Where gpt-oss's template differs from harmony, harmony is followed: a call is written
``<|start|>assistant to=functions.NAME<|channel|>commentary <|constrain|>json<|message|>``
(the template drops ``<|constrain|>``) and a tool result's text as it is (the template writes
it as a JSON string). ``openai_harmony`` is not needed at run time (``harmony_vocab``).

The model's own answers stay as sampled: its ``<|return|>``, its call written
``<|channel|>commentary to=functions.NAME <|constrain|>json``, and its analysis, which the
template drops from earlier turns once a final answer follows. Under ``as_template`` history a
new question after an answer starts a new segment rendered as the template does.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import datetime
from typing import Any

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.chat_template import ChatRenderer, content_text
from rollway.gateway.render.harmony_parse import HarmonyChannels, call_recipients, parse_harmony
from rollway.gateway.render.template_marks import family_hint
from rollway.gateway.render.tool_calls import ParsedToolCalls
from rollway.generation import Message

GENERATION_PROMPT = "<|start|>assistant"
#: Instructions, tools and days whose system and developer messages are kept.
PREFIX_CACHE_SIZE = 64
_PROBE = "rollwayharmonyprobe"


class GptOssRenderer(ChatRenderer):
    """GPT-OSS's harmony (``base.Renderer``): analysis is the reasoning, final the content,
    tool calls go to ``functions.NAME`` on the commentary channel; a turn ends at
    ``<|return|>`` or ``<|call|>``."""

    name = "gpt_oss"
    #: A call is a message of its own: nothing of the content is held back for it.
    tool_call_open = "<|start|>"

    def __init__(self, tokenizer: Any) -> None:
        template = str(tokenizer.chat_template or "")
        if not all(mark in template for mark in ("<|channel|>", "<|start|>", "<|message|>")):
            raise InvalidFieldsError(
                f"renderer 'gpt_oss': the chat template of {tokenizer.name_or_path!r} is not "
                f"GPT-OSS's harmony template; {family_hint(tokenizer, 'gpt_oss')}",
                param="renderer",
            )
        self._prefixes: OrderedDict[str, str] = OrderedDict()
        super().__init__(tokenizer)
        ids = {token: tokenizer.convert_tokens_to_ids(token) for token in _TOKENS}
        self.stop_ids = frozenset({ids["<|return|>"], ids["<|call|>"], ids["<|endoftext|>"]})
        self._closed_by = frozenset({ids["<|return|>"], ids["<|call|>"], ids["<|end|>"]})
        #: The stop tokens that end an answer, by id: a call ends at ``<|call|>``, the rest
        #: at ``<|return|>``.
        self._ends = {ids[token]: token for token in ("<|return|>", "<|call|>", "<|endoftext|>")}
        self.thinking = HarmonyChannels()
        self._pieces = None  # the template's pieces are not harmony's
        self._shapes = None

    def parse(
        self,
        text: str,
        use_tools: bool,
        tools: list[dict[str, Any]] | None = None,
        end_id: int | None = None,
    ) -> ParsedToolCalls:
        return parse_harmony(text, use_tools, None if end_id is None else self._ends.get(end_id))

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        head = messages[:1] if messages and messages[0]["role"] in ("system", "developer") else []
        rest = messages[len(head) :]
        text = self._prefix(head, tools) + messages_text(rest, None, add_generation_prompt)
        return text + GENERATION_PROMPT if add_generation_prompt else text

    def closing_glue(self, completion_ids: list[int]) -> str:
        """Nothing after an answer its stop token (or ``<|end|>``) closed; ``<|end|>`` after
        one cut short."""
        return "" if completion_ids and completion_ids[-1] in self._closed_by else "<|end|>"

    def continuation_ids(
        self,
        completion_ids: list[int],
        new_messages: list[Message],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None = None,
        keep_sampled: bool = True,
    ) -> list[int] | None:
        """The new messages after the answer as sampled, and the generation prompt; a tool
        result is from the function the answer called. As the template renders history, a
        new question drops the analysis the sample holds: None (a new segment)."""
        if not keep_sampled and any(m["role"] != "tool" for m in new_messages):
            return None
        called = call_recipients(self.decode(completion_ids))
        text = messages_text(new_messages, called[-1] if called else None, True)
        return self.encode(self.closing_glue(completion_ids) + text + GENERATION_PROMPT, max_tokens)

    def _prefix(self, head: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """The template's system and developer messages for ``head`` (the instructions, if
        any) and ``tools``: rendered before a probe question, cut there."""
        today = datetime.now().strftime("%Y-%m-%d")  # the template's strftime_now
        key = json.dumps([head, tools, today], ensure_ascii=False, default=repr)
        prefix = self._prefixes.get(key)
        if prefix is None:
            probe: list[Message] = [
                *({"role": m["role"], "content": content_text(m.get("content"))} for m in head),
                {"role": "user", "content": _PROBE},
            ]
            kwargs: dict[str, Any] = {"tools": harmony_tools(tools)} if tools else {}
            rendered: str = self.tokenizer.apply_chat_template(
                probe, tokenize=False, add_generation_prompt=False, **kwargs
            )
            rendered = rendered.replace(f"// {_NO_DESCRIPTION}\n", "")
            prefix = rendered[: rendered.rindex(f"<|start|>user<|message|>{_PROBE}")]
            self._prefixes[key] = prefix
            if len(self._prefixes) > PREFIX_CACHE_SIZE:
                self._prefixes.popitem(last=False)
        else:
            self._prefixes.move_to_end(key)
        return prefix


_TOKENS = ("<|return|>", "<|call|>", "<|end|>", "<|endoftext|>")
#: Stands for a function's missing description in the template's run, its line then cut.
_NO_DESCRIPTION = "rollwayharmonynodescription"


def harmony_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools whose descriptions the template writes as harmony does: one ``// `` comment line
    each, none for a function without one (optional in the OpenAI API, where the template
    would fail on it). The template writes ``"// " + description + "\n"``: a description is
    given it with its lines joined by ``\n// ``, a missing or empty one as a marker whose
    line is cut from the text."""
    written = []
    for tool in tools:
        function = tool.get("function")
        if not isinstance(function, dict):
            written.append(tool)
            continue
        lines = str(function.get("description") or "").split("\n")
        if lines[-1] == "":  # harmony's lines(): a final newline ends a line, opens none
            lines.pop()
        description = "\n// ".join(line.removesuffix("\r") for line in lines)
        written.append(
            {**tool, "function": {**function, "description": description or _NO_DESCRIPTION}}
        )
    return written


def messages_text(messages: list[Message], last_call: str | None, prompting: bool) -> str:
    """Harmony's text for ``messages`` (none of them the first system message). ``last_call``:
    the function an answer before them called. Without ``prompting`` (a closed transcript)
    the last answer is written whole, its analysis too, and ends with ``<|return|>``."""
    names = {
        str(call.get("id")): call.get("function", {}).get("name")
        for m in messages
        for call in m.get("tool_calls") or []
    }
    answered = max((at for at, m in enumerate(messages) if _is_answer(m)), default=-1)
    parts = []
    for at, message in enumerate(messages):
        role, content = message["role"], content_text(message.get("content"))
        if role == "user":
            parts.append(f"<|start|>user<|message|>{content}<|end|>")
        elif role in ("system", "developer"):
            parts.append(f"<|start|>developer<|message|># Instructions\n\n{content}<|end|>")
        elif role == "assistant":
            closing = not prompting and at == len(messages) - 1
            parts.append(_assistant_text(message, content, at > answered, closing))
            calls = message.get("tool_calls") or []
            last_call = calls[-1].get("function", {}).get("name") if calls else last_call
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id"))) or message.get("name") or last_call
            if not name:
                raise InvalidFieldsError(
                    "a tool message follows no assistant tool call to say whose result it is",
                    param="messages",
                )
            parts.append(f"<|start|>functions.{name} to=assistant<|channel|>commentary")
            parts.append(f"<|message|>{content}<|end|>")
        else:
            raise InvalidFieldsError(f"message role {role!r} is not supported", param="messages")
    return "".join(parts)


def _is_answer(message: Message) -> bool:
    return message["role"] == "assistant" and not message.get("tool_calls")


def _assistant_text(message: Message, content: str, keeps_analysis: bool, closing: bool) -> str:
    """An earlier answer: its analysis while its tool loop lasts (no final answer after it),
    its calls on the commentary channel, or its final answer."""
    reasoning = message.get("reasoning_content") or message.get("thinking")
    calls = message.get("tool_calls") or []
    parts = []
    if calls:
        analysis = reasoning or content  # the template writes a call's content as analysis
        if analysis and keeps_analysis:
            parts.append(f"<|start|>assistant<|channel|>analysis<|message|>{analysis}<|end|>")
        if reasoning and content:  # both: the content is a preamble, as the parser reads one
            parts.append(f"<|start|>assistant<|channel|>commentary<|message|>{content}<|end|>")
        for call in calls:
            function = call.get("function", {})
            arguments = function.get("arguments", "{}")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            parts.append(
                f"<|start|>assistant to=functions.{function.get('name')}<|channel|>commentary "
                f"<|constrain|>json<|message|>{arguments}<|call|>"
            )
        return "".join(parts)
    if closing and reasoning:
        parts.append(f"<|start|>assistant<|channel|>analysis<|message|>{reasoning}<|end|>")
    end = "<|return|>" if closing else "<|end|>"
    return "".join([*parts, f"<|start|>assistant<|channel|>final<|message|>{content}{end}"])
