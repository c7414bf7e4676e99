"""How a model is prompted and where its answer ends: the chat template where the tokenizer
has one, else plain text (``plain_prompt``) answered in one line (``stop_token_ids``).
Training, evaluation and the reward models prompt alike through it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamrl.data import Prompt

log = logging.getLogger(__name__)


def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer has a chat template (else it is prompted in plain text)."""
    return bool(getattr(tokenizer, "chat_template", None))


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """EOS plus the chat end-of-turn tokens the tokenizer has (``<|im_end|>``, ``<|eot_id|>``,
    ``<|endoftext|>``, Gemma's ``<end_of_turn>``). A tokenizer without a chat template is
    prompted in plain text (``encode_prompt``) and answers in one line: every token that is a
    run of newlines only (``"\n"``, ``"\n\n"``, ...; Gemma has 31) stops it too, kept as the
    response's last token as any stop token is. A base model would otherwise write on, the
    next question and its answer, to ``max_new_tokens``."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    if not has_chat_template(tokenizer):
        ids.update(_line_end_ids(tokenizer))
    return tuple(sorted(i for i in ids if i is not None))


def _line_end_ids(tokenizer, longest: int = 32) -> set[int]:
    """The tokens that are one to ``longest`` newlines and nothing else (tokens that join a
    newline to other text, as some byte-level vocabularies have, are left out)."""
    ids = set()
    for n in range(1, longest + 1):
        encoded = tokenizer.encode("\n" * n, add_special_tokens=False)
        if len(encoded) == 1 and encoded[0] != tokenizer.unk_token_id:
            ids.add(int(encoded[0]))
    return ids


def plain_prompt(messages: list[dict[str, str]]) -> str:
    """A conversation as plain text for a model without a chat template: the system prompt,
    a blank line, then the user's message and a newline, which the model continues on the
    next line: ``"{system}\n\n{user}\n"``, or ``"{user}\n"`` with no system prompt. Several
    system messages join with a blank line, the other messages (any role) with a newline."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = "\n".join(m["content"] for m in messages if m["role"] != "system")
    return f"{system}\n\n{rest}\n" if system else f"{rest}\n"


def encode_prompt(tokenizer, prompt: Prompt, max_tokens: int) -> list[int]:
    """The token ids a model is prompted with, cut to the last ``max_tokens``: the chat
    template applied with the generation prompt where the tokenizer has one, else
    ``plain_prompt`` tokenized with the tokenizer's own special tokens (Gemma's ``<bos>``).
    Training and evaluation prompt alike through it."""
    if has_chat_template(tokenizer):
        ids = tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, tokenize=True
        )
    else:
        ids = tokenizer(plain_prompt(prompt.messages))["input_ids"]
    if not isinstance(ids, list):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    if len(ids) > max_tokens and not _cut_prompts:
        # Once per process: a cut prompt loses its start (the system prompt first).
        _cut_prompts.append(prompt.prompt_id)
        log.warning(
            "prompt %s has %d tokens: cut to its last %d (data.max_prompt_tokens); "
            "further cut prompts are not logged",
            prompt.prompt_id,
            len(ids),
            max_tokens,
        )
    return list(ids)[-max_tokens:]


_cut_prompts: list[str] = []  # the first prompt cut by ``encode_prompt`` in this process
