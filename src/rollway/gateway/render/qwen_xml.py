"""Qwen3-Coder: tools declared in the system prompt as XML-ish ``<function>`` entries, calls
written as ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...``.

A value is text as the model wrote it: its type is the tool's JSON schema's, as vLLM's
``qwen3_coder`` parser reads it (an integer parameter's ``3`` is 3, a string's ``3`` is "3").
A value that is not of its declared type, like any call not of that shape, is flagged with
the reason and the text kept whole: never guessed.

The model folder's own template renders where it writes calls so (``<function=``); otherwise
(``--renderer qwen3_coder`` on a Qwen3 tokenizer whose folder has another template)
``QWEN3_CODER_TEMPLATE`` does: Qwen3-Coder's template, rendering token for token what the
``renderers`` package's ``prime-qwen3`` renderer (a reimplementation of it) renders.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from typing import Any

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.template_marks import family_hint
from rollway.gateway.render.tool_calls import OPEN_TAG, ParsedToolCalls, new_call

#: What marks a template as writing calls the Qwen3-Coder way.
XML_CALL = "<function="
_TOKENS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>")
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
# One newline each side of the value is the template's (it writes ">\nVALUE\n</").
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

QWEN3_CODER_TEMPLATE = """\
{%- macro render_extra_keys(json_dict, handled_keys) -%}
{%- if json_dict is mapping -%}
{%- for json_key in json_dict if json_key not in handled_keys -%}
{%- if json_dict[json_key] is mapping or (json_dict[json_key] is sequence \
and json_dict[json_key] is not string) -%}
{{- '\\n<' ~ json_key ~ '>' ~ (json_dict[json_key] | tojson | safe) ~ '</' ~ json_key ~ '>' -}}
{%- else -%}
{{- '\\n<' ~ json_key ~ '>' ~ (json_dict[json_key] | string) ~ '</' ~ json_key ~ '>' -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if messages[0]['role'] == 'system' -%}
{%- set system_message = messages[0]['content'] -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- if not tools is defined or tools is none -%}{%- set tools = [] -%}{%- endif -%}
{%- if system_message is defined -%}
{{- '<|im_start|>system\\n' + system_message -}}
{%- elif tools | length > 0 -%}
{{- '<|im_start|>system\\nYou are Qwen, a helpful AI assistant that can interact with a \
computer to solve tasks.' -}}
{%- endif -%}
{%- if tools | length > 0 -%}
{{- '\\n\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}
{%- for tool in tools -%}
{%- if tool.function is defined -%}{%- set tool = tool.function -%}{%- endif -%}
{{- '\\n<function>\\n<name>' ~ tool.name ~ '</name>' -}}
{%- if tool.description is defined -%}
{{- '\\n<description>' ~ (tool.description | trim) ~ '</description>' -}}
{%- endif -%}
{{- '\\n<parameters>' -}}
{%- if tool.parameters is mapping and tool.parameters.properties is mapping -%}
{%- for param_name, param_fields in tool.parameters.properties | items -%}
{{- '\\n<parameter>\\n<name>' ~ param_name ~ '</name>' -}}
{%- if param_fields is mapping -%}
{%- if param_fields.type is defined -%}
{{- '\\n<type>' ~ (param_fields.type | string) ~ '</type>' -}}
{%- endif -%}
{%- if param_fields.description is defined -%}
{{- '\\n<description>' ~ (param_fields.description | trim) ~ '</description>' -}}
{%- endif -%}
{{- render_extra_keys(param_fields, ['name', 'type', 'description']) -}}
{%- endif -%}
{{- '\\n</parameter>' -}}
{%- endfor -%}
{%- endif -%}
{{- render_extra_keys(tool.parameters, ['type', 'properties']) -}}
{{- '\\n</parameters>' -}}
{{- render_extra_keys(tool, ['type', 'name', 'description', 'parameters']) -}}
{{- '\\n</function>' -}}
{%- endfor -%}
{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format \
with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=\
example_parameter_1>\\nvalue_1\\n</parameter>\\n<parameter=example_parameter_2>\\nThis is the \
value for the second parameter\\nthat can span\\nmultiple lines\\n</parameter>\\n</function>\\n\
</tool_call>\\n\\n<IMPORTANT>\\nReminder:\\n- Function calls MUST follow the specified format: \
an inner <function=...></function> block must be nested within <tool_call></tool_call> XML \
tags\\n- Required parameters MUST be specified\\n- You may provide optional reasoning for your \
function call in natural language BEFORE the function call, but NOT after\\n- If there is no \
function call available, answer the question like normal with your current knowledge and do \
not tell the user about function calls\\n</IMPORTANT>' -}}
{%- endif -%}
{%- if system_message is defined or tools | length > 0 -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- for message in loop_messages -%}
{%- if message.role == 'assistant' and message.tool_calls -%}
{{- '<|im_start|>assistant' -}}
{%- if message.content is string and message.content | trim | length > 0 -%}
{{- '\\n' + (message.content | trim) + '\\n' -}}
{%- endif -%}
{%- for tool_call in message.tool_calls -%}
{%- if tool_call.function is defined -%}{%- set tool_call = tool_call.function -%}{%- endif -%}
{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' -}}
{%- if tool_call.arguments is mapping -%}
{%- for args_name, args_value in tool_call.arguments | items -%}
{{- '<parameter=' + args_name + '>\\n' -}}
{%- if args_value is mapping or (args_value is sequence and args_value is not string) -%}
{{- args_value | tojson | safe -}}
{%- else -%}
{{- args_value | string -}}
{%- endif -%}
{{- '\\n</parameter>\\n' -}}
{%- endfor -%}
{%- endif -%}
{{- '</function>\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.previtem and loop.previtem.role != 'tool' -%}{{- '<|im_start|>user\\n' -}}{%- endif -%}
{{- '<tool_response>\\n' + message.content + '\\n</tool_response>\\n' -}}
{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


class QwenXmlRenderer(ChatRenderer):
    """Qwen3-Coder (``qwen3_coder``): no reasoning; calls in XML, their values typed by the
    tools' schemas (``parse_xml_tool_calls``). Refused on a tokenizer without Qwen's chat
    and tool tokens, rather than rendering what that model never saw."""

    name = "qwen3_coder"
    tool_call_open = OPEN_TAG

    def __init__(self, tokenizer: Any) -> None:
        vocabulary = tokenizer.get_vocab()
        if missing := [t for t in _TOKENS if t not in vocabulary]:
            raise InvalidFieldsError(
                f"renderer 'qwen3_coder': the tokenizer of {tokenizer.name_or_path!r} has no "
                f"{', '.join(missing)} (Qwen3-Coder's is Qwen3's); "
                f"{family_hint(tokenizer, 'qwen3_coder')}",
                param="renderer",
            )
        if XML_CALL not in str(tokenizer.chat_template or ""):
            # Its own copy: the folder's tokenizer keeps its template for other renderers.
            tokenizer = copy.copy(tokenizer)
            tokenizer.chat_template = QWEN3_CODER_TEMPLATE
        super().__init__(tokenizer)

    def parse(
        self,
        text: str,
        use_tools: bool,
        tools: list[dict[str, Any]] | None = None,
        end_id: int | None = None,
    ) -> ParsedToolCalls:
        reasoning = None
        if self.thinking is not None:  # a template of this shape that thinks (named so)
            reasoning, text = self.thinking.split(text)
        parsed = parse_xml_tool_calls(text, tools) if use_tools else ParsedToolCalls(text)
        return dataclasses.replace(parsed, reasoning=reasoning)


def parse_xml_tool_calls(text: str, tools: list[dict[str, Any]] | None) -> ParsedToolCalls:
    """Split Qwen3-Coder's ``<tool_call>`` blocks out of ``text``, each value typed by the
    schema of its tool in ``tools``; on any bad block keep the text whole, saying why."""
    if OPEN_TAG not in text:
        if XML_CALL in text:
            return ParsedToolCalls(text, error="a <function=...> call outside <tool_call>")
        return ParsedToolCalls(text)
    schemas = _parameter_schemas(tools)
    calls = []
    for block in _BLOCK.finditer(text):
        call, error = _parse_block(block.group(1), schemas)
        if error is not None:
            return ParsedToolCalls(text, error=error)
        calls.append(call)
    if text.count(OPEN_TAG) != len(calls):
        return ParsedToolCalls(text, error="unterminated <tool_call> block")
    return ParsedToolCalls(_BLOCK.sub("", text).rstrip(), calls)


def _parse_block(
    body: str, schemas: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], str | None]:
    function = _FUNCTION.fullmatch(body)
    if function is None:
        return {}, "tool call is not one <function=NAME>...</function> block"
    name, inner = function.group(1), function.group(2)
    arguments: dict[str, Any] = {}
    at = 0
    while (parameter := _PARAMETER.match(inner, at)) is not None:
        key, value = parameter.group(1), parameter.group(2)
        if key in arguments:
            return {}, f"tool call {name!r} gives parameter {key!r} twice"
        typed, error = typed_value(value, schemas.get(name, {}).get(key))
        if error is not None:
            return {}, f"tool call {name!r}: parameter {key!r} {error}"
        arguments[key] = typed
        at = parameter.end()
    if inner[at:].strip():
        return {}, f"tool call {name!r} has text outside its <parameter> blocks"
    return new_call(name, arguments), None


def typed_value(value: str, schema: Any) -> tuple[Any, str | None]:
    """A parameter's text as its schema's type: ``(value, None)``, or ``(None, why not)``.

    As vLLM's ``qwen3_coder`` parser reads it: a parameter the tool does not declare, or
    declares without a type, is its text; ``null`` is None unless the type is only string.
    Of a union, the types other than string are tried first; string takes any text."""
    types = _types(schema)
    if not types:
        return value, None
    if value.strip().lower() == "null" and types != ["string"]:
        return None, None
    for kind in sorted((t for t in types if t != "null"), key=lambda t: t == "string"):
        read = _READERS.get(kind)
        if read is None:  # a type vLLM does not know (null, a custom name): its text
            return value, None
        typed = read(value)
        if typed is not _NOT:
            return typed, None
    return None, f"is not {' or '.join(types)}: {value!r}"


_NOT = object()


def _json(value: str) -> Any:
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return _NOT


def _integer(value: str) -> Any:
    typed = _json(value)
    return typed if type(typed) is int else _NOT


def _number(value: str) -> Any:
    typed = _json(value)
    number = type(typed) in (int, float) and math.isfinite(typed)
    return typed if number else _NOT


def _boolean(value: str) -> Any:
    word = value.strip().lower()
    return {"true": True, "false": False}.get(word, _NOT)


def _of(kind: type) -> Any:
    def read(value: str) -> Any:
        typed = _json(value)
        return typed if isinstance(typed, kind) else _NOT

    return read


_READERS = {
    "string": lambda value: value,
    "integer": _integer,
    "number": _number,
    "boolean": _boolean,
    "object": _of(dict),
    "array": _of(list),
}


#: The other names vLLM's parser reads as the JSON types.
_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(("int", "uint", "long", "short", "unsigned"), "integer"),
    **dict.fromkeys(("num", "float", "double"), "number"),
    **dict.fromkeys(("bool", "binary"), "boolean"),
    **dict.fromkeys(("dict", "map"), "object"),
    **dict.fromkeys(("list", "tuple"), "array"),
}


def _types(schema: Any) -> list[str]:
    """The JSON types a parameter's schema allows (its ``type``, or its ``anyOf``/``oneOf``
    branches'), lower-cased; none where it says none."""
    if not isinstance(schema, dict):
        return []
    declared = schema.get("type")
    if declared is None:
        branches = schema.get("anyOf") or schema.get("oneOf") or []
        return [t for b in branches if isinstance(b, dict) for t in _types(b)]
    listed = declared if isinstance(declared, list) else [declared]
    return [_ALIASES.get(str(t).strip().lower(), str(t).strip().lower()) for t in listed]


def _parameter_schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> parameter name -> that parameter's schema."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        spec = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(spec, dict):
            continue
        parameters = spec.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        if isinstance(spec.get("name"), str) and isinstance(properties, dict):
            schemas[spec["name"]] = properties
    return schemas
