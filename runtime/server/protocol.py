"""The OpenAI wire format: pydantic models of the requests we accept and the responses we send.

Requests ignore unknown fields (clients send things like `store` or `metadata`), but every
field we read is typed and range-checked here or by SamplingParams.validate, so a bad
value is a 400 naming the field. Types are strict (`true` is not 1, `"7"` is not 7; an
integer is still a number). Non-finite floats (NaN, Infinity) are refused.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class RequestModel(BaseModel):
    """The base of every request model (OpenAI, Responses, Anthropic Messages): unknown fields are
    ignored, wrong JSON types and non-finite floats refused, and fields may be given by name or by
    alias."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True, strict=True)


class StreamOptions(RequestModel):
    include_usage: bool = False


class JsonSchemaFormat(RequestModel):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(RequestModel):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI names, plus vLLM's extras)."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (vLLM): 0 or -1 = off
    min_p: float | None = None  # extension
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None  # extension
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # extension
    ignore_eos: bool = False  # extension
    min_tokens: int = 0  # extension
    # extension (graphc): "off" | "prompt_lookup" | {"method": ..., "num_draft_tokens": k}; docs/speculative.md
    speculative: str | dict | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None

    @property
    def stop_list(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Sampling):
    # str | list[int] | list[str | list[int]], checked by prompts.completion_prompts for a clear message
    prompt: Any
    max_tokens: int | None = None
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(BaseModel):
    # Message objects carry role-specific extras (name, tool_call_id, ...): keep them for the template.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None  # legacy spelling of tools
    function_call: Any = None  # legacy spelling of tool_choice ("none", "auto" or {"name": ...})
    add_generation_prompt: bool = True  # extension: template flag
    continue_final_message: bool = False  # extension: template flag
    # reasoning models (server/reasoning.py): Qwen3's switch, OpenAI's effort, vLLM's template kwargs
    enable_thinking: bool | None = None  # extension
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # extension (vLLM)


# -- responses -------------------------------------------------------------------------
class _Resp(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptTokensDetails(_Resp):
    cached_tokens: int = 0


class Usage(_Resp):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


class CompletionLogprobs(_Resp):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(_Resp):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(_Resp):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class TopLogprob(_Resp):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(_Resp):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(_Resp):
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


class ToolCallFunction(_Resp):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Resp):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ToolCallFunctionDelta(_Resp):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Resp):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunctionDelta | None = None


class ChatResponseMessage(_Resp):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # the <think> text, apart (vLLM's and DeepSeek's field)
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Resp):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(_Resp):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ChatDelta(_Resp):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Resp):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Resp):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(_Resp):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "graphc"
    max_model_len: int | None = None


class ModelList(_Resp):
    object: Literal["list"] = "list"
    data: list[ModelCard]
