"""``rollway demo``: a two-turn tool conversation through the gateway with the openai SDK."""

from __future__ import annotations

import json
import secrets
from typing import Annotated, Any

import httpx
import typer
from openai import OpenAI
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
    ChatCompletionToolParam,
)
from rich.console import Console
from rich.table import Table

from rollway.cli.options import EngineOption, ModelOption
from rollway.gateway import build_gateway, create_app
from rollway.web.background_server import BackgroundServer

ADD_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def tool_call(call_id: str, a: int, b: int) -> ChatCompletionMessageToolCallParam:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


# Two worked examples teach the 135M model the tool-call format.
FEW_SHOT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", 3, 4)]},
    {"role": "user", "content": "What is 10 + 5?"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("call_1", 10, 5)]},
]


def run(
    engine: EngineOption = "embedded",
    model: ModelOption = None,
    question: Annotated[str, typer.Option(help="The user's question.")] = "What is 17 + 25?",
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 1,
) -> None:
    """Start a gateway on loopback, hold a two-turn tool conversation, print the trajectory."""
    console = Console()
    admin_key = f"ak-{secrets.token_urlsafe(16)}"
    with console.status("loading the model and starting the gateway"):
        app = create_app(build_gateway(engine, model=model), admin_key=admin_key)
    headers = {"Authorization": f"Bearer {admin_key}"}
    with BackgroundServer(app) as url, httpx.Client(base_url=url, headers=headers) as admin:
        registered = admin.post(
            "/v1/rollouts/demo-1/register",
            json={"temperature": 0.7, "seed": seed, "max_tokens": 64, "max_turns": 4},
        ).json()
        console.print(f"gateway {url}; rollout base URL {registered['base_url']}")
        with OpenAI(base_url=registered["base_url"], api_key=registered["api_key"]) as client:
            _converse(console, client, question)
        trajectory = admin.get("/v1/rollouts/demo-1/trajectory?samples=true").json()
        admin.post("/v1/rollouts/demo-1/unregister")
    _print_summary(console, trajectory)


def _converse(console: Console, client: OpenAI, question: str) -> None:
    """Two turns: the question, then the tool's answer (or a nudge to call it)."""
    messages: list[ChatCompletionMessageParam] = [*FEW_SHOT, {"role": "user", "content": question}]
    for turn in (1, 2):
        reply = client.chat.completions.create(model="default", messages=messages, tools=[ADD_TOOL])
        message = reply.choices[0].message
        console.print(f"[bold]turn {turn}[/] ({reply.choices[0].finish_reason}): {_show(message)}")
        messages.append(_sent_back(message))
        messages.extend(_answer(message))


def _sent_back(message: Any) -> ChatCompletionAssistantMessageParam:
    """The model's reply as the next request carries it."""
    sent: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        sent["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    return sent


def _answer(message: Any) -> list[ChatCompletionMessageParam]:
    """Tool results for the model's calls, or a nudge when it called none."""
    if not message.tool_calls:
        return [{"role": "user", "content": "Check that with the add tool."}]
    results: list[ChatCompletionMessageParam] = []
    for call in message.tool_calls:
        try:
            args = json.loads(call.function.arguments)
            output = str(int(args["a"]) + int(args["b"]))
        except (ValueError, KeyError, TypeError) as exc:
            output = f"error: {exc}"
        results.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return results


def _show(message: Any) -> str:
    calls = [f"{c.function.name}({c.function.arguments})" for c in message.tool_calls or []]
    return " ".join(filter(None, [message.content, *calls])) or "(empty)"


def _print_summary(console: Console, trajectory: dict[str, Any]) -> None:
    turns = Table(title=f"rollout {trajectory['rollout_id']}: turns")
    for column in ("turn", "segment", "prompt ids", "completion ids", "finish", "tool calls"):
        turns.add_column(column)
    for t in trajectory["turns"]:
        calls = ", ".join(c["function"]["name"] for c in t["tool_calls"]) or "-"
        turns.add_row(
            str(t["index"]),
            str(t["segment"]),
            str(t["prompt_len"]),
            str(len(t["completion_ids"])),
            t["finish_reason"],
            calls,
        )
    console.print(turns)
    for s in trajectory["samples"]:
        sampled = sum(s["loss_mask"])
        mean_lp = sum(s["logprobs"]) / max(sampled, 1)
        console.print(
            f"sample {s['segment']}: {len(s['prompt_ids'])} prompt ids, "
            f"{len(s['response_ids'])} response ids, {sampled} with loss mask 1, "
            f"mean logprob {mean_lp:.3f}"
        )
    drift = trajectory["drift"]
    console.print(
        f"segments {trajectory['segment_count']}, truncated {trajectory['is_truncated']}, "
        f"drift: {drift['differing_tokens']} of {drift['recorded_tokens']} tokens differ "
        "from a fresh render of the final messages"
    )
