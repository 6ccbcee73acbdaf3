"""verl's agent loop sampling through rollway: ``RollwayAgentLoop``, registered as ``rollway``.

verl (0.9.1, ``verl/experimental/agent_loop/agent_loop.py``) runs one agent loop per dataset
row: ``AgentLoopWorker._run_agent_loop`` builds the class registered under the row's
``agent_name`` (``@register`` or the YAML at ``rollout.agent.agent_loop_config_path``) with
``hydra.utils.instantiate``, awaits ``run(sampling_params, **row)``, then pads its
``AgentLoopOutput`` (``_agent_loop_postprocess``) and batches the rows into a ``DataProto``
(``_postprocess``). This loop runs the row as one rollway rollout and returns the record's
sample as it is: ``response_logprobs`` become the batch's ``rollout_log_probs`` and
``reward_score`` its ``rm_scores``.

verl pins ``transformers<5.11`` and rollway needs ``>=5.14``, so verl lives in its own venv:
``scripts/trainer_venvs.sh verl`` makes ``.venv-verl`` (``docs/trainers.md``, "verl").
"""

from __future__ import annotations

import asyncio
import atexit
import json
import threading
from collections.abc import Mapping
from typing import Any

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.errors import ConfigError
from rollway.results import AgentResult, RolloutRecord
from rollway.trajectory import Sample

try:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )
except ImportError as exc:  # the main venv: verl's transformers pin conflicts with rollway's
    raise ImportError(
        "rollway.trainers.verl needs verl 0.9.1, whose transformers<5.11 pin conflicts with "
        "rollway's; it is installed in its own venv: run `scripts/trainer_venvs.sh verl` and "
        "use .venv-verl (or `make test-verl`)"
    ) from exc

#: The row fields copied into the rollway task beside its messages (verl's RLHFDataset).
ROW_FIELDS = ("data_source", "reward_model", "extra_info", "index", "uid", "tools_kwargs")


class RowAgent(AgentLoop):
    """The default agent: one model call on the row's ``raw_prompt`` (the task's
    ``messages``), what verl's ``single_turn_agent`` does. Give the loop ``agent=`` for yours."""

    name = "verl-row"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = list(ctx.task["messages"])
        reply = await ctx.chat(messages)
        return ctx.complete([*messages, reply.message])


# -- one client per process ------------------------------------------------------------------
# verl builds a new agent loop for every row, so the client (its engine, gateway and loop
# thread) is made once per worker process and shared, keyed by what configures it.
_CLIENTS: dict[str, RolloutClient] = {}
_CLIENTS_LOCK = threading.Lock()
_INSTALLED = "installed"


def use_client(client: RolloutClient) -> None:
    """Run every ``RollwayAgentLoop`` of this process through ``client``, whatever its config
    says (a custom ``AgentLoopWorker``, or tests). The caller keeps and closes it."""
    with _CLIENTS_LOCK:
        _CLIENTS[_INSTALLED] = client


def close_clients() -> None:
    """Close the clients the loops made in this process (also run at exit); an installed one
    (``use_client``) is forgotten, not closed."""
    with _CLIENTS_LOCK:
        made = [c for key, c in _CLIENTS.items() if key != _INSTALLED]
        _CLIENTS.clear()
    for client in made:
        client.close()


atexit.register(close_clients)


def _client_for(agent: str | None, engine: str, options: dict[str, Any]) -> RolloutClient:
    key = json.dumps([agent, engine, options], sort_keys=True, default=str)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(_INSTALLED) or _CLIENTS.get(key)
        if client is None:
            client = RolloutClient(agent or RowAgent, engine, **options)
            _CLIENTS[key] = client
        return client


# -- the agent loop --------------------------------------------------------------------------


@register("rollway")
class RollwayAgentLoop(AgentLoopBase):
    """A verl agent loop whose rollouts run through a rollway ``RolloutClient``.

    Options come from the agent-loop YAML entry (hydra passes its extra keys here): ``agent``
    (a rollway agent spec such as ``"my_agents.py:Solver"``; default ``RowAgent``), ``engine``
    (default ``"embedded"``; ``"vllm://HOST:PORT"`` for one of verl's own servers) and
    ``client_options`` (more ``RolloutClient`` keywords). ``task_from_row`` maps a row to the
    task; override it in a subclass for another task shape.
    """

    def __init__(
        self,
        *args: Any,
        agent: str | None = None,
        engine: str = "embedded",
        client_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.agent_spec = agent
        self.engine_spec = engine
        self.client_options = _plain(client_options or {})
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        # Building the client loads an engine: off verl's event loop, which serves other rows.
        client = await asyncio.to_thread(
            _client_for, self.agent_spec, self.engine_spec, self.client_options
        )
        options = rollout_options(
            sampling_params, self.prompt_length, self.response_length, _client_cap(client)
        )
        record = await client.invoke_async(self.task_from_row(row), **options)
        return agent_loop_output(
            record,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            logprobs=bool(sampling_params.get("logprobs", True)),
            pad_id=pad_id_of(self.tokenizer),
        )

    def task_from_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The rollway task of a verl row: ``messages`` from ``raw_prompt``, ``answer`` from
        ``reward_model.ground_truth``, and the row's other dataset fields as metadata."""
        task: dict[str, Any] = {"messages": _plain(row["raw_prompt"])}
        task.update({key: _plain(row[key]) for key in ROW_FIELDS if key in row})
        reward_model = task.get("reward_model")
        if isinstance(reward_model, dict) and "ground_truth" in reward_model:
            task.setdefault("answer", reward_model["ground_truth"])
        return task


def rollout_options(
    sampling_params: Mapping[str, Any],
    prompt_length: int,
    response_length: int,
    client_max_tokens: int | None = None,
) -> dict[str, Any]:
    """The rollway options of verl's per-row ``sampling_params`` (``generate_sequences``):
    its temperature, top-p and top-k (verl's -1 is rollway's 0, off); each model call capped as
    verl's server client caps it (``max_tokens``, else ``response_length``) and by the client's
    own ``max_tokens`` where one was given; the whole rollout capped at ``prompt_length +
    response_length`` tokens."""
    penalty = sampling_params.get("repetition_penalty", 1.0)
    if penalty not in (None, 1.0):
        raise ConfigError(
            f"repetition_penalty={penalty!r}: rollway's engines do not sample with it, and "
            "verl would train on the samples as if they had",
            "repetition_penalty",
        )
    max_tokens = int(sampling_params.get("max_tokens") or response_length)
    if client_max_tokens is not None:
        max_tokens = min(max_tokens, client_max_tokens)
    return {
        "temperature": float(sampling_params.get("temperature", 1.0)),
        "top_p": float(sampling_params.get("top_p", 1.0)),
        "top_k": max(int(sampling_params.get("top_k", -1)), 0),
        "max_tokens": max_tokens,
        "max_seq_len": prompt_length + response_length,
    }


def _client_cap(client: RolloutClient) -> int | None:
    """The per-call ``max_tokens`` the client was given, if any (not rollway's default)."""
    settings = client.settings
    return settings.sampling.max_tokens if "max_tokens" in settings.sampling_fixed else None


def agent_loop_output(
    record: RolloutRecord,
    *,
    prompt_length: int,
    response_length: int,
    logprobs: bool = True,
    pad_id: int = 0,
) -> AgentLoopOutput:
    """verl's ``AgentLoopOutput`` of one rollway record: its sample's ids, loss mask (as
    ``response_mask``) and logprobs unchanged, cut to ``response_length`` as verl's own loops
    cut theirs; the record's reward as ``reward_score``. A record with nothing to train on
    becomes one masked placeholder token with reward 0.0 (``rollway_status`` says why)."""
    sample = only_sample(record)
    if sample is None:
        return _placeholder(record, pad_id)
    if len(sample.prompt_ids) > prompt_length:
        # verl would left-truncate it: the kept tokens would then not be the context the
        # engine sampled from, and the logprobs would be wrong for it.
        raise ConfigError(
            f"rollout {record.rollout_id}: its prompt has {len(sample.prompt_ids)} tokens, more "
            f"than rollout.prompt_length={prompt_length}; raise it or filter long prompts "
            "(data.filter_overlong_prompts)",
            "prompt_length",
        )
    cut = len(sample.response_ids) > response_length
    return AgentLoopOutput(
        prompt_ids=list(sample.prompt_ids),
        response_ids=list(sample.response_ids[:response_length]),
        response_mask=list(sample.loss_mask[:response_length]),
        response_logprobs=list(sample.logprobs[:response_length]) if logprobs else None,
        reward_score=record.reward,
        num_turns=count_turns(record.messages),
        metrics=_metrics(record),
        extra_fields=_extra_fields(record, cut),
    )


def only_sample(record: RolloutRecord) -> Sample | None:
    """The record's one sample; None when it failed or sampled nothing. A rollout in several
    segments (its agent rewrote the conversation) is refused: verl's worker takes exactly one
    ``AgentLoopOutput`` per row and pads it as one sequence."""
    trajectory = record.trajectory
    samples = trajectory.samples if record.success and trajectory is not None else []
    if len(samples) > 1:
        raise ConfigError(
            f"rollout {record.rollout_id} has {len(samples)} segments (its agent rewrote the "
            "conversation); verl takes one sequence per row: export the segments "
            "(`rollway export`) and train on them as rows instead",
            "agent",
        )
    if not samples or not samples[0].response_ids:
        return None
    return samples[0]


def count_turns(messages: list[dict[str, Any]]) -> int:
    """verl's ``num_turns``: the prompt, each assistant turn and each run of tool or user
    messages between them (its ``ToolAgentLoop``: user_turns + assistant_turns + 1)."""
    sides = [m.get("role") == "assistant" for m in messages if m.get("role") != "system"]
    return sum(1 for i, side in enumerate(sides) if i == 0 or side != sides[i - 1])


def _metrics(record: RolloutRecord) -> AgentLoopMetrics:
    # verl times these in seconds (simple_timer); rollway counts milliseconds.
    return AgentLoopMetrics(
        generate_sequences=record.metrics.llm_latency_ms / 1000.0,
        tool_calls=record.metrics.tool_latency_ms / 1000.0,
    )


def _extra_fields(record: RolloutRecord, cut: bool) -> dict[str, Any]:
    # turn_scores and tool_rewards: the keys verl's own loops always set (its _postprocess
    # keeps one set of keys across loops).
    return {
        "turn_scores": [],
        "tool_rewards": [],
        "rollway_rollout_id": record.rollout_id,
        "rollway_rollout_key": record.rollout_key,
        "rollway_status": record.status,
        "rollway_policy_version": record.policy_version,
        "rollway_truncated": cut,
        "rollway_reward_info": dict(record.reward_info),
    }


def _placeholder(record: RolloutRecord, pad_id: int) -> AgentLoopOutput:
    return AgentLoopOutput(
        prompt_ids=[pad_id],
        response_ids=[pad_id],
        response_mask=[0],
        response_logprobs=[0.0],
        reward_score=0.0,
        num_turns=count_turns(record.messages),
        metrics=_metrics(record),
        extra_fields=_extra_fields(record, False),
    )


def pad_id_of(tokenizer: Any) -> int:
    """The id a placeholder row holds: the tokenizer's pad, else its end of sequence."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad if pad is not None else getattr(tokenizer, "eos_token_id", 0) or 0)


def _plain(value: Any) -> Any:
    """Plain Python of a verl row value (numpy arrays and scalars, OmegaConf containers): the
    task is JSON in the store."""
    if hasattr(value, "_content"):  # an OmegaConf DictConfig / ListConfig
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist())
    return value


__all__ = [
    "ROW_FIELDS",
    "RollwayAgentLoop",
    "RowAgent",
    "agent_loop_output",
    "close_clients",
    "rollout_options",
    "use_client",
]
