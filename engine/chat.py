"""Prompts as token ids: raw text or ids (`encode_prompt`), and a conversation (system / user / assistant messages)
through the model's chat template, ending where the assistant's reply starts. Needs only the tokenizer, not the
model."""

from __future__ import annotations

from engine.errors import EngineError, InvalidParameterError


def check_messages(messages: list[dict[str, str]]) -> None:
    if not messages:
        raise InvalidParameterError("the conversation is empty: add a user message")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise InvalidParameterError("each message needs a role of system, user or assistant")
        if not isinstance(m.get("content"), str):
            raise InvalidParameterError("each message needs a text content")
        check_text(m["content"])


def check_text(text: str) -> None:
    """Refuse text the tokenizer cannot take: lone surrogates, which is how Python reads bytes that are not UTF-8
    from a pipe or an argument."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidParameterError(f"the text is not valid UTF-8 (at character {err.start}): give UTF-8 text") \
            from None


def encode_prompt(tokenizer, prompt: str | list[int]) -> list[int]:
    """A raw prompt's token ids: text tokenized as is (no chat template), or a list of token ids as given."""
    if isinstance(prompt, str):
        check_text(prompt)
        return tokenizer.encode(prompt)
    if not (is_token_ids(prompt) or (isinstance(prompt, list | tuple) and not prompt)):  # []: see below
        raise InvalidParameterError("a prompt must be a string or a list of token ids")
    return list(prompt)  # ([]: engine.request.check_prompt says "the prompt is empty"; it said "must be ... token ids")


def is_token_ids(prompt: object) -> bool:
    return isinstance(prompt, list | tuple) and len(prompt) > 0 and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt)


def encode_chat(tokenizer, messages: list[dict[str, str]], *, model: str, continue_reply: bool = False) -> list[int]:
    """The token ids of `messages` under `tokenizer`'s chat template, with the assistant's turn opened; or, with
    `continue_reply`, up to the end of the last message, an assistant reply, left open (no end of turn), so that
    what the model generates continues it (a reply the length limit cut)."""
    check_messages(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise EngineError(f"{model} has no chat template: send raw prompts instead")
    if continue_reply and messages[-1]["role"] != "assistant":
        raise InvalidParameterError("continue_reply needs a conversation that ends with an assistant message")
    if continue_reply:
        try:
            text = tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)
        except ValueError as err:  # (a template that rewrites the last message: transformers cannot find it)
            raise InvalidParameterError(f"{model}'s chat template cannot continue this reply ({err})") from None
    else:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def turn_prefix(tokenizer, messages: list[dict[str, str]], *, model: str) -> list[int]:
    """The token ids every next user turn after `messages` starts with: the template's opening (with its default
    system prompt, where it has one: SmolLM2's 26 tokens) and the turn's header. Two turns' ids, up to where they part
    (a tokenizer may merge the turn's first character with what precedes it: never past that)."""
    a, b = (encode_chat(tokenizer, [*messages, {"role": "user", "content": c}], model=model) for c in ("a", "b"))
    return a[:next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))]
