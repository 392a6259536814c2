"""Prompts as token ids: /v1/completions' four prompt shapes, and chat messages through the
model's chat template (tokenizer.apply_chat_template). Runs on the server's tokenization
thread (ServerState.run_cpu) with its own tokenizer copy, never on the event loop; text
longer than any prompt that fits (ServerState.max_prompt_chars) is refused before it is
tokenized."""

from __future__ import annotations

from .errors import bad_request
from .message_bounds import render_with_boundaries
from .protocol import ChatCompletionRequest
from .reasoning import opens_reasoning, request_template_kwargs
from .tool_prompt import check_tool_calls, render_messages
from .tools import HERMES, ToolPlan


def completion_prompts(state, prompt) -> tuple[list[list[int]], list[str]]:
    """(token ids, text) per prompt for str | list[str] | list[int] | list[list[int]]."""
    shape = "prompt must be a string, a list of token ids, or a list of those"
    if isinstance(prompt, str):
        raw = [prompt]
    elif not isinstance(prompt, list):
        raise bad_request(f"{shape}, got {type(prompt).__name__}", "prompt")
    elif not prompt:
        raise bad_request("prompt is empty: give a string, a list of strings, or token ids", "prompt")
    elif all(_is_id(p) for p in prompt):
        raw = [prompt]
    elif all(isinstance(p, str) or (isinstance(p, list) and all(_is_id(t) for t in p)) for p in prompt):
        raw = list(prompt)
    else:
        raise bad_request(shape, "prompt")
    if len(raw) > state.config.max_prompts:
        raise bad_request(f"at most {state.config.max_prompts} prompts per request, got {len(raw)}", "prompt")
    ids_list, texts = [], []
    for i, p in enumerate(raw):
        where = "prompt" if len(raw) == 1 else f"prompt[{i}]"
        if isinstance(p, str):
            check_text_length(state, len(p), where, "prompt")
            ids = _encode(state, p)
            text = p
        else:
            ids = [int(t) for t in p]
            check_token_ids(state, ids, where, "prompt")
            text = None
        if not ids:
            raise bad_request(f"{where} is empty: give at least one token", "prompt")
        ids_list.append(ids)
        texts.append(text)
    return ids_list, texts


def check_token_ids(state, ids: list[int], where: str, param: str) -> None:
    """A client's token ids must index the model's vocabulary: else a 400 naming the first that does not."""
    bad = next((t for t in ids if not 0 <= t < state.vocab_size), None)
    if bad is not None:
        raise bad_request(f"{where}: token id {bad} is out of range for a vocabulary of {state.vocab_size}",
                          param, code="invalid_value")


def check_text_length(state, n_chars: int, where: str, param: str) -> None:
    limit = state.max_prompt_chars
    if limit and n_chars > limit:
        raise bad_request(f"{where} has {n_chars} characters: more than the {state.max_prompt_tokens} tokens this "
                          f"server accepts in a prompt could hold (at most {limit} characters); shorten it",
                          param, code="context_length_exceeded")


def _encode(state, text: str) -> list[int]:
    """`tokenizer.encode(text)`, reusing a recent prompt's tokens where this text extends it."""
    pt = getattr(state, "prompt_tokens", None)
    if pt is None or not pt.enabled:
        return list(state.tokenizer.encode(text))
    return pt.encode(text, add_special_tokens=True)[0]


def _is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def prompt_text(state, ids: list[int], text: str | None) -> str:
    return text if text is not None else state.tokenizer.decode(ids)


def chat_prompt(state, req: ChatCompletionRequest, plan: ToolPlan | None = None) -> list[int]:
    return chat_prompt_boundaries(state, req, plan)[0]


def chat_prompt_boundaries(state, req: ChatCompletionRequest,
                           plan: ToolPlan | None = None) -> tuple[list[int], tuple[int, ...]]:
    """(the chat-templated prompt, the prompt offsets where the template ended each of the last
    messages): the boundaries go to the prefix cache (SamplingParams.prefix_boundaries), which keeps
    recurrent / sliding state there, so the next turn of this chat resumes at the last message it
    shares with this one (message_bounds.py)."""
    tok = state.tokenizer
    if not getattr(tok, "chat_template", None):
        raise bad_request(f"the model '{state.model_name}' has no chat template; use /v1/completions, or start "
                          "the server with --chat-template (e.g. chatml)", "messages", code="no_chat_template")
    if len(req.messages) > state.max_prompt_tokens:  # every message is at least one token of the prompt
        raise bad_request(f"{len(req.messages)} messages cannot fit a prompt of at most {state.max_prompt_tokens} "
                          "tokens", "messages", code="context_length_exceeded")
    check_turns(req.messages)
    messages, total_chars = [], 0
    for i, m in enumerate(req.messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text":
                    raise bad_request(f"messages[{i}].content[{j}]: only text parts are supported, got "
                                      f"{part.get('type')!r}", "messages")
                if not isinstance(part.get("text"), str):
                    raise bad_request(f"messages[{i}].content[{j}]: a text part needs a string 'text'", "messages")
                texts.append(part["text"])
            content = "\n".join(texts)
        total_chars += len(content or "")
        check_text_length(state, total_chars, "messages", "messages")
        msg = dict(m.model_extra or {})
        if "tool_calls" in msg:
            check_tool_calls(msg["tool_calls"], f"messages[{i}].tool_calls")
        msg.update(role="system" if m.role == "developer" else m.role, content=content or "")
        if m.name is not None:
            msg["name"] = m.name
        messages.append(msg)
    messages, tools = render_messages(messages, plan, tok.chat_template, plan.fmt if plan else HERMES)
    extra = request_template_kwargs(req, tok.chat_template, state.config.chat_template_args)
    if tools:
        extra["tools"] = tools
    flags = dict(add_generation_prompt=req.add_generation_prompt, continue_final_message=req.continue_final_message)
    try:
        # a full-attention cache resumes at any token: no boundaries to find for it
        rendered = render_with_boundaries(tok, messages, flags, extra, encode=getattr(state, "prompt_tokens", None),
                                          boundaries=state.wants_boundaries)
        if rendered is None:
            ids = tok.apply_chat_template(messages, tokenize=True, **flags, **extra)
    except Exception as e:  # template errors (raise_exception in jinja, bad role order) are the client's
        raise bad_request(f"the chat template rejected these messages: {e}", "messages") from None
    ids, bounds = rendered if rendered is not None else (ids, ())
    if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    ids = [int(t) for t in ids]
    if not ids:
        raise bad_request("the chat template produced an empty prompt", "messages")
    return ids, bounds


def check_turns(messages) -> None:
    """The conversation's shape, as OpenAI checks it: a system, user or tool message has content
    (an assistant's may be null: its tool_calls are the turn), and a tool message answers the
    assistant tool calls just before it. A template would otherwise render a null as "" or a lone
    tool result as if it answered something, and the model would reply to a conversation the
    client did not send."""
    for i, m in enumerate(messages):
        if m.content is None and m.role != "assistant":
            raise bad_request(f"messages[{i}].content is required for a {m.role} message", "messages")
        if m.role == "tool":
            prev = messages[i - 1] if i else None
            if prev is None or not (prev.role == "tool" or (prev.role == "assistant"
                                                            and (prev.model_extra or {}).get("tool_calls"))):
                raise bad_request(f"messages[{i}]: a tool message must answer the tool_calls of the assistant "
                                  "message just before it (or follow another tool message)", "messages")


def prompt_opens_reasoning(state, ids: list[int]) -> bool:
    """Whether the chat prompt `ids` ends inside an open `<think>` (DeepSeek-R1-style templates):
    the generation prefix is in the last few tokens, so only those are decoded."""
    fmt = getattr(state, "reasoning", None)
    return fmt is not None and opens_reasoning(state.tokenizer.decode(ids[-16:]), fmt)
