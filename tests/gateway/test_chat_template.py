from __future__ import annotations

import random

from rollway.gateway.render.chat_template import ChatRenderer
from tests.conftest import ADD_TOOL, FEW_SHOT, tool_call


def test_continuation_equals_a_fresh_render_when_the_model_tokenized_canonically(
    renderer: ChatRenderer,
) -> None:
    first = [*FEW_SHOT, {"role": "user", "content": "What is 17 + 25?"}]
    reply = {"role": "assistant", "content": None, "tool_calls": [tool_call("c2", 17, 25)]}
    appended = [{"role": "tool", "tool_call_id": "c2", "content": "42"}]
    prompt = renderer.prompt_ids(first, [ADD_TOOL])
    # Stand in for what the model sampled: the reply's canonical ids plus end-of-turn.
    whole = renderer.transcript_ids([*first, reply], [ADD_TOOL])
    completion = whole[len(prompt) :]
    completion = completion[: completion.index(renderer.tokenizer.eos_token_id) + 1]
    tail = renderer.continuation_ids(completion, appended, [ADD_TOOL])
    fresh = renderer.prompt_ids([*first, reply, *appended], [ADD_TOOL])
    assert prompt + completion + tail == fresh


def test_a_completion_cut_before_end_of_turn_gets_the_end_of_turn_as_glue(
    renderer: ChatRenderer,
) -> None:
    cut = renderer.encode("partial answer")
    glue = renderer.closing_glue(cut)
    assert glue.startswith(renderer.eos_text)
    closed = renderer.closing_glue([*cut, renderer.tokenizer.eos_token_id])
    assert not closed.startswith(renderer.eos_text)
    assert glue == renderer.eos_text + closed


def test_tools_are_rendered_into_the_system_prompt_for_templates_without_tool_support(
    renderer: ChatRenderer,
) -> None:
    assert not renderer.native_tools
    text = renderer.render(
        [{"role": "user", "content": "hi"}], [ADD_TOOL], add_generation_prompt=True
    )
    assert "<tools>" in text and '"name": "add"' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_encode_gives_the_tokenizers_own_ids_and_decode_its_own_text(
    renderer: ChatRenderer,
) -> None:
    """The renderer calls the Rust tokenizer directly (its batch call without offsets, the
    decoder without transformers' wrapper): the ids and texts must be transformers' own."""
    rng = random.Random(11)
    alphabet = ["a", "Z", " ", "  ", "\n", "\t", "é", "✓", "中", "🙂", "'s", "1", ".", "<"]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    texts = ["", " ", "x" * 9000, "word " * 2000, *specials]
    for _ in range(300):
        pieces = rng.choices(alphabet + specials, k=rng.randint(1, 40))
        texts.append("".join(pieces))
    tokenizer = renderer.tokenizer
    for text in texts:
        assert renderer.encode(text) == tokenizer.encode(text, add_special_tokens=False), text
    vocab = len(tokenizer)
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        assert renderer.decode(ids) == tokenizer.decode(ids, skip_special_tokens=False), ids
