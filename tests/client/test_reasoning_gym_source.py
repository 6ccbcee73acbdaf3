"""reasoning-gym's datasets as tasks (``reasoning-gym:NAME?...``), with the real package: a spec
makes the same rows every time, a bad spec is refused naming what is wrong, and a row is scored
by its dataset's own ``score_answer`` through rollway's reward path (the built-in question
agent asking, the scripted engine answering)."""

from __future__ import annotations

import sys
from typing import Any

import orjson
import pytest

from rollway.agents import RolloutContext
from rollway.agents.question import QuestionAgent, task_messages
from rollway.client import RolloutClient
from rollway.client.reasoning_gym_source import reasoning_gym_tasks
from rollway.client.task_sources import read_tasks, tasks_name
from rollway.engines.scripted import ScriptedEngine
from rollway.errors import ConfigError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult, RolloutRecord

LEGS = "reasoning-gym:leg_counting?size=3&seed=7"
MIXED = "reasoning-gym:composite?datasets=leg_counting,basic_arithmetic&size=8&seed=2"


def test_a_spec_makes_its_size_of_rows_each_with_question_answer_and_scorer() -> None:
    rows = reasoning_gym_tasks(LEGS)
    assert len(rows) == 3 and len({r["task_id"] for r in rows}) == 3
    for row in rows:
        system, user = row["messages"]
        assert system["role"] == "system" and "<answer>" in system["content"]
        assert user == {"role": "user", "content": row["question"]}
        assert row["answer"].isdigit() and row["metadata"]["source_dataset"] == "leg_counting"
        assert row["scorer"] == {
            "kind": "reasoning_gym",
            "dataset": "leg_counting",
            "config": {"size": 3, "seed": 7},
        }
        assert orjson.loads(orjson.dumps(row)) == row  # as a record stores it
    assert reasoning_gym_tasks(f"{LEGS}&system=none")[0]["messages"] == [rows[0]["messages"][1]]


def test_the_same_seed_makes_the_same_tasks_and_another_seed_others() -> None:
    first, again = reasoning_gym_tasks(LEGS), reasoning_gym_tasks(LEGS)
    assert first == again
    other = reasoning_gym_tasks("reasoning-gym:leg_counting?size=3&seed=8")
    assert [r["question"] for r in other] != [r["question"] for r in first]
    assert not {r["task_id"] for r in other} & {r["task_id"] for r in first}
    # No seed given: seed 0, not reasoning-gym's fresh one each time.
    unseeded = "reasoning-gym:leg_counting?size=2"
    assert reasoning_gym_tasks(unseeded) == reasoning_gym_tasks(unseeded)


def test_options_are_read_by_their_defaults_types() -> None:
    spec = "reasoning-gym:basic_arithmetic?size=4&max_terms=2&operators=+&allow_negation=false"
    rows = reasoning_gym_tasks(spec)
    assert rows[0]["scorer"]["config"] == {
        "size": 4, "max_terms": 2, "operators": ["+"], "allow_negation": False,
        "seed": 0,
    }  # fmt: skip
    # '+' is the operator (a query string's '+' is no space here), the only one drawn.
    assert all(not {"-", "*", "/"} & set(r["metadata"]["expression"].split()) for r in rows)


def test_a_composite_mixes_its_datasets_with_their_own_options() -> None:
    rows = reasoning_gym_tasks(f"{MIXED}&leg_counting.max_animals=3&basic_arithmetic.weight=2")
    sources = {r["metadata"]["source_dataset"] for r in rows}
    assert sources == {"leg_counting", "basic_arithmetic"} and len(rows) == 8
    specs = rows[0]["scorer"]["config"]["datasets"]
    assert specs == [
        {"name": "leg_counting", "weight": 1.0, "config": {"max_animals": 3}},
        {"name": "basic_arithmetic", "weight": 2.0, "config": {}},
    ]
    legs = [r for r in rows if r["metadata"]["source_dataset"] == "leg_counting"]
    assert all(len(r["metadata"]["animals"]) <= 3 for r in legs)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("reasoning-gym:leg_countin", "no dataset 'leg_countin'; close names: leg_counting"),
        ("reasoning-gym:", "name a dataset (reasoning-gym:NAME)"),
        ("reasoning-gym:leg_counting?legs=4", "leg_counting has no option 'legs'; its options "
         "are: max_animals, max_instances, min_animals, min_instances, seed, size, system"),
        ("reasoning-gym:leg_counting?size=many", "size='many': must be a whole number"),
        ("reasoning-gym:leg_counting?size=2&size=3", "option 'size' is given twice"),
        ("reasoning-gym:leg_counting?size", "option 'size' needs the form OPTION=VALUE"),
        ("reasoning-gym:basic_arithmetic?allow_negation=maybe",
         "allow_negation='maybe': must be true or false"),
        ("reasoning-gym:leg_counting?min_animals=20",
         "reasoning-gym refuses this leg_counting: max_animals must be >= min_animals"),
        ("reasoning-gym:leg_counting?system=chatty", "system='chatty': reasoning-gym's prompts"),
        ("reasoning-gym:composite?size=3", "composite needs datasets=NAME,NAME"),
        ("reasoning-gym:composite?datasets=leg_counting,basic_arithmetc",
         "no dataset 'basic_arithmetc'; close names: basic_arithmetic"),
        (f"{MIXED}&chain_sum.min_terms=2", "'chain_sum' is not among datasets="),
        (f"{MIXED}&leg_counting.legs=2", "leg_counting.leg_counting has no option 'legs'"),
    ],
)  # fmt: skip
def test_a_bad_spec_is_refused_naming_what_is_wrong(spec: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        read_tasks(spec)
    assert said in refused.value.message and refused.value.param == "tasks"


def test_without_the_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` fails
    with pytest.raises(ConfigError, match=r"pip install 'rollway\[reasoning-gym\]'"):
        read_tasks(LEGS)


def test_task_sources_read_rows_files_and_specs_one_way(tmp_path: Any) -> None:
    rows = [{"question": "q"}]
    assert read_tasks(rows) is rows
    file = tmp_path / "mine.jsonl"
    file.write_text('{"question": "q"}\n')
    assert read_tasks(str(file)) == rows == read_tasks(file)
    assert (tasks_name(file), tasks_name(MIXED), tasks_name(rows)) == ("mine", "composite", "tasks")
    with pytest.raises(ConfigError, match=r"no task file nowhere.jsonl \(or a task source: "):
        read_tasks("nowhere.jsonl")


def _run(
    renderer: ChatRenderer, tmp_path: Any, tasks: Any, replies: list[str], **options: Any
) -> list[RolloutRecord]:
    """Each rollout of ``tasks`` by the question agent, answered ``replies`` in turn."""
    gateway = Gateway(ScriptedEngine(replies, renderer.tokenizer), renderer, model_name="smol")
    # One at a time: the scripted engine answers in call order.
    with RolloutClient(
        QuestionAgent(), gateway, store=str(tmp_path), max_concurrent=1, **options
    ) as client:
        items = sorted(client.run_batch(tasks), key=lambda item: item.index)
    return [item.result for item in items]


def test_the_stored_answer_scores_one_and_a_wrong_answer_less(
    renderer: ChatRenderer, tmp_path: Any
) -> None:
    rows = reasoning_gym_tasks(LEGS)
    rambling = "I think the legs add up to " * 10 + "12345"  # untagged: all of it is the answer
    replies = [f"Counting.\n<answer>{rows[0]['answer']}</answer>", rows[1]["answer"], rambling]
    right, bare, wrong = _run(renderer, tmp_path, LEGS, replies)
    for record in (right, bare):
        assert (record.status, record.reward) == ("completed", 1.0), record.reason
    assert right.reward_info == {
        "scorer": "reasoning_gym:leg_counting",
        "given_answer": rows[0]["answer"],
        "source": "task_scorer",
    }
    assert wrong.status == "completed" and wrong.reward is not None and wrong.reward < 1.0
    assert wrong.reward_info["given_answer"] == rambling[:200] + "..."  # shown, not all kept
    assert right.trajectory is not None and right.trajectory.messages[:2] == rows[0]["messages"]


def test_a_composite_rows_score_by_their_own_dataset(renderer: ChatRenderer, tmp_path: Any) -> None:
    rows = reasoning_gym_tasks(MIXED)[:4]
    records = _run(renderer, tmp_path, rows, [row["answer"] for row in rows])
    assert [r.reward for r in records] == [1.0] * 4, [r.reason for r in records]
    scorers = {r.reward_info["scorer"] for r in records}
    assert scorers == {f"reasoning_gym:{row['metadata']['source_dataset']}" for row in rows}


def test_a_reward_given_wins_over_the_tasks_scorer(renderer: ChatRenderer, tmp_path: Any) -> None:
    def length(task: dict[str, Any], trajectory: Any) -> float:
        return 0.25

    rows = reasoning_gym_tasks(LEGS)[:1]
    (record,) = _run(renderer, tmp_path, rows, [rows[0]["answer"]], reward=length)
    assert record.reward == 0.25 and record.reward_info == {"source": "reward_fn"}


def test_a_task_naming_an_unknown_scorer_fails_its_reward_saying_so(
    renderer: ChatRenderer, tmp_path: Any
) -> None:
    task = {"question": "2+2?", "scorer": {"kind": "nope"}}
    (record,) = _run(renderer, tmp_path, [task], ["4"])
    assert (record.status, record.error_kind) == ("error", "reward")
    assert "names no known scorer: a scorer is {'kind': one of reasoning_gym" in str(record.reason)


def test_the_step_source_takes_the_spec(renderer: ChatRenderer, tmp_path: Any) -> None:
    spec = "reasoning-gym:leg_counting?size=2&seed=7"
    rows = reasoning_gym_tasks(spec)
    gateway = Gateway(
        ScriptedEngine([r["answer"] for r in rows], renderer.tokenizer), renderer, model_name="smol"
    )
    with RolloutClient(QuestionAgent(), gateway, store=str(tmp_path), max_concurrent=1) as client:
        steps = client.step_source(spec, group_size=1, groups_per_step=2, dynamic_sampling=False)
        with steps as source:
            batch = source.next_batch()
            batch.done()
    records = [r for group in batch.groups for r in group]
    assert sorted(r.reward for r in records) == [1.0, 1.0]
    assert {r.task["task_id"] for r in records} == {r["task_id"] for r in rows}


class _OwnRewardAgent(QuestionAgent):
    """An agent of one's own on the rows (it reads ``question``) that sets a reward itself."""

    name = "own-reward"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [{"role": "user", "content": ctx.task["question"]}]
        answer = await ctx.chat(messages)
        return ctx.complete([*messages, answer.message], reward=0.5)


def test_an_agent_given_is_scored_by_the_task_its_own_reward_kept_beside(
    renderer: ChatRenderer, tmp_path: Any
) -> None:
    rows = reasoning_gym_tasks(LEGS)[:1]
    engine = ScriptedEngine([rows[0]["answer"]], renderer.tokenizer)
    gateway = Gateway(engine, renderer, model_name="smol")
    with RolloutClient(_OwnRewardAgent(), gateway, store=str(tmp_path)) as client:
        (item,) = client.run_batch(rows)
    assert item.result.reward == 1.0
    assert item.result.reward_info["agent_reward"] == 0.5
    assert item.result.reward_info["source"] == "task_scorer"


def test_the_question_agent_asks_messages_else_prompt_else_question() -> None:
    messages = [{"role": "user", "content": "m"}]
    assert task_messages({"messages": messages, "prompt": "p"}) == messages
    assert task_messages({"prompt": "p", "question": "q"}) == [{"role": "user", "content": "p"}]
    assert task_messages({"prompt": messages}) == messages
    assert task_messages({"question": "q"}) == [{"role": "user", "content": "q"}]
    assert task_messages({"answer": 4}) is None
