"""Prompts and stop tokens for a model without a chat template (a base model such as
``gemma-3-270m``): ``encode_prompt`` renders ``"{system}\\n\\n{user}\\n"`` and ``stop_token_ids``
adds the newline tokens; a tokenizer with a template is prompted through it as before.

The character tokenizer of ``tiny-random-llama`` stands in for both (its template removed for
the plain case), so no weights are needed.
"""

from __future__ import annotations

import pytest

from streamrl.models import build_char_tokenizer, encode_prompt, plain_prompt, stop_token_ids
from streamrl.tasks.base import Prompt

SYSTEM = {"role": "system", "content": "Answer with the number only."}
USER = {"role": "user", "content": "12 + 8 = ?"}


def prompt(*messages: dict[str, str]) -> Prompt:
    return Prompt("p-0", list(messages), "20", "arithmetic")


@pytest.fixture
def plain_tokenizer():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    return tokenizer


def test_plain_prompt_is_system_blank_line_user_newline() -> None:
    assert plain_prompt([SYSTEM, USER]) == "Answer with the number only.\n\n12 + 8 = ?\n"
    assert plain_prompt([USER]) == "12 + 8 = ?\n"
    two_turns = [SYSTEM, USER, {"role": "assistant", "content": "20"}, USER]
    assert plain_prompt(two_turns) == (
        "Answer with the number only.\n\n12 + 8 = ?\n20\n12 + 8 = ?\n"
    )


def test_encode_prompt_without_template_tokenizes_the_plain_text(plain_tokenizer) -> None:
    ids = encode_prompt(plain_tokenizer, prompt(SYSTEM, USER), max_tokens=1000)
    assert plain_tokenizer.decode(ids) == "Answer with the number only.\n\n12 + 8 = ?\n"
    assert ids == plain_tokenizer("Answer with the number only.\n\n12 + 8 = ?\n")["input_ids"]
    # Cut to the last max_tokens, as a templated prompt is.
    assert encode_prompt(plain_tokenizer, prompt(SYSTEM, USER), max_tokens=5) == ids[-5:]


def test_encode_prompt_with_a_template_applies_it() -> None:
    tokenizer = build_char_tokenizer()
    ids = encode_prompt(tokenizer, prompt(SYSTEM, USER), max_tokens=1000)
    expected = tokenizer.apply_chat_template(
        [SYSTEM, USER], add_generation_prompt=True, tokenize=True
    )
    expected = expected if isinstance(expected, list) else expected["input_ids"]
    assert ids == list(expected)
    assert tokenizer.decode(ids).endswith("<bos>assistant\n")


def test_stop_tokens_add_the_newline_only_without_a_template(plain_tokenizer) -> None:
    templated = build_char_tokenizer()
    newline = templated.convert_tokens_to_ids("\n")
    assert stop_token_ids(templated) == (templated.eos_token_id,)
    assert stop_token_ids(plain_tokenizer) == tuple(sorted({plain_tokenizer.eos_token_id, newline}))


def test_stop_tokens_include_end_of_turn_and_every_newline_run() -> None:
    """A Gemma-like vocabulary: ``<end_of_turn>`` and tokens of 1-3 newlines (not the
    character tokenizer's two newline characters, which are two tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<end_of_turn>": 4}
    vocab.update({"\n": 5, "\n\n": 6, "\n\n\n": 7, "1": 8, "+": 9, " ": 10, "=": 11})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="\n+|.", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<end_of_turn>"]})
    assert tokenizer.encode("\n\n", add_special_tokens=False) == [6]
    assert stop_token_ids(tokenizer) == (1, 4, 5, 6, 7)
    tokenizer.chat_template = "{{ messages }}"
    assert stop_token_ids(tokenizer) == (1, 4)
