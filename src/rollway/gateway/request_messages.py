"""A chat request's messages as the gateway works with them: dicts in the validated shape and
their keys, checked only past what the rollout's previous request already sent.

An agent resends its whole conversation every turn, so validating, dumping and keying every
message on every turn costs O(conversation) per turn (about 5 µs a message: 0.4 ms a turn at
80 messages). A request read off the wire (``ChatCompletionAsSent``: fresh objects nobody else
holds) whose messages begin with the previous request's, equal as sent, takes those from the
rollout as they were checked then; only the reply it echoes and what it appends are new.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, SkipValidation, TypeAdapter, ValidationError

from rollway.gateway.request_schema import ChatCompletionRequest, ChatMessage, refuse_non_text
from rollway.gateway.rollout_state import (
    Conversation,
    MessageKey,
    RolloutState,
    message_key,
    same_answer,
)
from rollway.generation import Message
from rollway.validation import parse_model

_MESSAGES = TypeAdapter(list[ChatMessage])


class ChatCompletionAsSent(ChatCompletionRequest):
    """A chat request parsed from an HTTP body or an in-process caller's dict: the same fields
    and checks as ``ChatCompletionRequest`` (which documents it), except that ``messages`` are
    kept as sent, for ``read_conversation`` to check against the rollout's conversation.

    An in-process caller's messages are its own objects (``callers_objects``), which it may
    change after the call: the rollout keeps copies of them to check the next request."""

    messages: SkipValidation[list[Any]]
    _callers_objects: bool = PrivateAttr(default=False)

    @classmethod
    def from_caller(cls, request: dict[str, Any]) -> ChatCompletionAsSent:
        body = parse_model(cls, request, strict=False)
        body._callers_objects = True
        return body

    def message_dicts(self) -> list[dict[str, Any]]:
        return _validated(self.messages)


class _Messages(BaseModel):
    """The messages alone, checked as ``ChatCompletionRequest`` checks them: for the error."""

    messages: list[ChatMessage] = Field(min_length=1)


def read_conversation(state: RolloutState, request: ChatCompletionRequest) -> Conversation:
    """The request's messages (validated dicts) and keys; ``InvalidFieldsError`` naming the
    field when a message is malformed."""
    if not isinstance(request, ChatCompletionAsSent):  # built in Python: checked whole already
        messages = request.message_dicts()
        keys = [message_key(m) for m in messages]
        _as_answered(state, messages, keys, 0)
        return Conversation(messages, keys)
    sent = request.messages
    known = _known_prefix(state, sent)
    fresh = _validated(sent, known)
    messages = state.messages[:known] + fresh
    keys = state.message_keys[:known] + [message_key(m) for m in fresh]
    _as_answered(state, messages, keys, known)
    # Kept for the next request unless a call's arguments are a JSON object: dict equality
    # takes 1 for 1.0 and True, which render differently.
    reusable = not any(map(_object_arguments, fresh))
    if not reusable:
        return Conversation(messages, keys, None)
    if request._callers_objects:
        # Copied once each: a message the agent changes in place then differs from its copy.
        kept = (state.sent_messages or [])[:known] + copy.deepcopy(sent[known:])
        return Conversation(messages, keys, kept)
    return Conversation(messages, keys, list(sent))


def _as_answered(
    state: RolloutState, messages: list[Message], keys: list[MessageKey], start: int
) -> None:
    """The gateway's answers, where the request sends them back (reasoning as sampled, moved
    into the content, or dropped), are taken as they were answered: their keys, so that the
    next prompt extends their sampled ids, and the last answer's message, so that renders of
    the conversation (a new segment's, the drift figure's) see the reasoning sampled. From
    the first message that differs from the rollout's (an edited reasoning among them) the
    conversation is the request's. ``keys[:start]`` are the rollout's already."""
    answered = state.message_keys
    for at in range(start, min(len(keys), len(answered))):
        if keys[at] != answered[at]:
            if not same_answer(keys[at], answered[at]):
                return
            keys[at] = answered[at]
    if len(keys) >= len(answered) > start:
        messages[len(answered) - 1] = state.messages[-1]


def _known_prefix(state: RolloutState, sent: Any) -> int:
    """How many leading messages of ``sent`` the rollout's last request sent, equal as sent."""
    previous = state.sent_messages
    if not previous or not isinstance(sent, list) or len(sent) < len(previous):
        return 0
    return len(previous) if sent[: len(previous)] == previous else 0


def _validated(sent: Any, start: int = 0) -> list[dict[str, Any]]:
    """``sent[start:]`` checked and dumped as ``ChatCompletionRequest.message_dicts`` does."""
    try:
        if not isinstance(sent, list) or not sent:
            raise ValueError("not a non-empty list")
        checked = _MESSAGES.validate_python(sent[start:])
    except (ValidationError, ValueError):
        parse_model(_Messages, {"messages": sent})  # raises, naming the field as for a body
        raise AssertionError("the messages failed one check and passed the other") from None
    messages = [m.model_dump(exclude_none=True) for m in checked]
    refuse_non_text(messages, start)
    return messages


def _object_arguments(message: dict[str, Any]) -> bool:
    calls = message.get("tool_calls", ())
    return any(not isinstance(call["function"]["arguments"], str) for call in calls)
