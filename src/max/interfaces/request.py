"""Requests: ``Request``, ``RequestID``, ``TextGenerationRequest`` (+ message, tool and
response-format dicts) and ``AudioGenerationRequest``.

The message/tool/response-format types are ``TypedDict``s in OpenAI's JSON shape, so a
chat-completions body's ``messages`` / ``tools`` / ``response_format`` can be passed
through unchanged.  Requests check their shape at construction and raise
``ValueError`` / ``TypeError`` naming the field.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import numpy as np
import numpy.typing as npt

from typing_extensions import NotRequired, TypedDict

from max.interfaces.errors import InvalidRequest, InvalidRequestType
from max.interfaces.sampling import SamplingParams

W = "TextGenerationRequest"  # the prefix of its errors' messages

RequestID = str
"""Alias of ``str``: the unique identifier of a request."""

MESSAGE_ROLES = ("system", "user", "assistant", "tool", "function")


def new_request_id() -> RequestID:
    """A fresh random request id (a uuid4 hex string)."""
    return uuid.uuid4().hex


@dataclass
class Request:
    """Base class of requests: carries the unique ``request_id``."""

    request_id: RequestID

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str):
            raise TypeError(f"{type(self).__name__}: request_id must be a str, got {type(self.request_id).__name__}")


class TextGenerationRequestFunction(TypedDict):
    """A function definition for a text generation request (OpenAI ``tools[].function``)."""

    name: str
    """The name of the function to be invoked."""
    description: NotRequired[Optional[str]]
    """A human-readable description of the function's purpose."""
    parameters: NotRequired[dict[str, Any]]
    """The function's parameters, typically a JSON schema."""


class TextGenerationRequestTool(TypedDict):
    """A tool definition for a text generation request (OpenAI ``tools[]``)."""

    type: str
    """The type of the tool (``"function"``)."""
    function: TextGenerationRequestFunction
    """The function definition associated with the tool."""


class TextGenerationResponseFormat(TypedDict):
    """The response format of a request (OpenAI ``response_format``)."""

    type: str
    """The type of response format, e.g. ``"json_object"`` or ``"json_schema"``."""
    json_schema: NotRequired[dict[str, Any]]
    """A JSON schema that the generated response must follow."""


class TextGenerationRequestMessage(TypedDict):
    """A chat message (OpenAI ``messages[]``)."""

    role: Literal["system", "user", "assistant", "tool", "function"]
    """The role of the message sender."""
    content: Union[str, list[dict[str, Any]]]
    """A string, or a list of OpenAI content parts (``{"type": "text", "text": ...}``,
    ``{"type": "image_url", "image_url": {"url": ...}}``, ...)."""


def _check_messages(messages: Any) -> list:
    if not isinstance(messages, list):
        raise InvalidRequestType(f"messages must be a list of dicts, got {type(messages).__name__}",
                                 param="messages", where=W)
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequestType(f"messages[{i}] must be a dict, got {type(m).__name__}",
                                     param="messages", where=W)
        role = m.get("role")
        if role not in MESSAGE_ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {MESSAGE_ROLES}, got {role!r}",
                                 param="messages", where=W)
        content = m.get("content")
        # ``None`` content is allowed for assistant messages that only carry tool calls.
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidRequestType(f"messages[{i}].content must be a str or a list of parts, got "
                                     f"{type(content).__name__}", param="messages", where=W)
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise InvalidRequest(f"messages[{i}].content[{j}] must be a dict with a 'type' string",
                                         param="messages", where=W)
    return messages


def _check_tools(tools: Any) -> list:
    if not isinstance(tools, list):
        raise InvalidRequestType(f"tools must be a list, got {type(tools).__name__}", param="tools", where=W)
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("type"), str):
            raise InvalidRequest(f"tools[{i}] must be a dict with a 'type' string", param="tools", where=W)
        fn = t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest(f"tools[{i}].function must be a dict with a non-empty 'name'",
                                 param="tools", where=W)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidRequestType(f"tools[{i}].function.parameters must be a dict (JSON schema)",
                                     param="tools", where=W)
    return tools


def _check_response_format(rf: Any) -> dict:
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise InvalidRequest("response_format must be a dict with a 'type' string", param="response_format", where=W)
    schema = rf.get("json_schema")
    if schema is not None and not isinstance(schema, dict):
        raise InvalidRequestType("response_format.json_schema must be a dict", param="response_format", where=W)
    if rf["type"] == "json_schema" and schema is None:
        raise InvalidRequest("response_format of type 'json_schema' needs a json_schema",
                             param="response_format", where=W)
    return rf


@dataclass
class TextGenerationRequest(Request):
    """A text generation request (completions or chat completions)."""

    model_name: str
    """The name of the model to be used for generating tokens."""
    prompt: Union[str, Sequence[int], None] = None
    """A prompt string or a sequence of token ids (legacy completions)."""
    messages: Optional[list[TextGenerationRequestMessage]] = None
    """Chat messages (chat completions)."""
    images: Optional[list[bytes]] = None
    """Image byte arrays for multimodal inputs."""
    tools: Optional[list[TextGenerationRequestTool]] = None
    """Tools the model may call."""
    response_format: Optional[TextGenerationResponseFormat] = None
    """Structured-output specification."""
    timestamp_ns: int = 0
    """When the request was received by the server, in nanoseconds."""
    request_path: str = "/"
    """The endpoint path of the request."""
    logprobs: int = 0
    """Number of top log probabilities to return per generated token; 0 disables them."""
    echo: bool = False
    """Include the prompt in the response."""
    stop: Optional[Union[str, list[str]]] = None
    """Optional stop expression(s) (OpenAI ``stop``)."""
    chat_template_options: Optional[dict[str, Any]] = None
    """Options passed when applying the chat template."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    """Token sampling configuration."""
    target_endpoint: Optional[str] = None
    """Target endpoint for routing in disaggregated serving."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.model_name, str):
            raise InvalidRequestType(f"model_name must be a str, got {type(self.model_name).__name__}",
                                     param="model_name", where=W)
        if self.prompt is None and self.messages is None:
            raise InvalidRequest("one of prompt or messages must be provided", param="prompt", where=W)
        if self.prompt is not None and not isinstance(self.prompt, str):
            if isinstance(self.prompt, np.ndarray):
                self.prompt = self.prompt.tolist()
            if not isinstance(self.prompt, Sequence) or not all(
                isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in self.prompt
            ):
                raise InvalidRequestType("prompt must be a str or a sequence of token ids", param="prompt", where=W)
            neg = next((i for i, t in enumerate(self.prompt) if int(t) < 0), None)
            if neg is not None:
                raise InvalidRequest(f"prompt token id {int(self.prompt[neg])} at index {neg} is negative: token ids "
                                     "are non-negative", param="prompt", where=W)
        if self.messages is not None:
            _check_messages(self.messages)
        if self.images is not None:
            if not isinstance(self.images, list) or not all(isinstance(b, (bytes, bytearray)) for b in self.images):
                raise InvalidRequestType("images must be a list of bytes", param="images", where=W)
        if self.tools is not None:
            _check_tools(self.tools)
        if self.response_format is not None:
            _check_response_format(self.response_format)
        if isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int):
            raise InvalidRequestType(f"logprobs must be an int, got {self.logprobs!r}", param="logprobs", where=W)
        if self.logprobs < 0:
            raise InvalidRequest(f"logprobs must be >= 0, got {self.logprobs}", param="logprobs", where=W)
        if self.timestamp_ns < 0:
            raise InvalidRequest(f"timestamp_ns must be >= 0, got {self.timestamp_ns}", param="timestamp_ns", where=W)
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise InvalidRequestType("stop must be a str or a list of str", param="stop", where=W)
        if not isinstance(self.sampling_params, SamplingParams):
            raise InvalidRequestType(f"sampling_params must be a SamplingParams, got "
                                     f"{type(self.sampling_params).__name__}", param="sampling_params", where=W)

    @property
    def stop_sequences(self) -> list[str]:
        """``stop`` (request) and ``sampling_params.stop`` merged, in order, without duplicates."""
        out: list[str] = []
        req = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        for s in [*req, *(self.sampling_params.stop or [])]:
            if s not in out:
                out.append(s)
        return out


AUDIO_INPUT_MAX_CHARS = 4096


@dataclass
class AudioGenerationRequest(Request):
    """A text-to-speech request."""

    model: str
    """The name of the model used for generating audio chunks."""
    input: Optional[str] = None
    """The text to generate audio for (at most 4096 characters)."""
    audio_prompt_tokens: list[int] = field(default_factory=list)
    """The prompt speech ids to use for audio generation."""
    audio_prompt_transcription: str = ""
    """The audio prompt transcription."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    """Request sampling configuration options."""
    _assistant_message_override: Optional[str] = None
    prompt: Optional[Union[list[int], str]] = None
    """Preprocessed token ids or prompt string passed to the model directly."""
    streaming: bool = True
    """Whether to stream the audio generation."""
    buffer_speech_tokens: Optional[npt.NDArray[np.integer[Any]]] = None
    """The last N speech tokens generated by a previous request, used to buffer the decoder."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.input is not None and len(self.input) > AUDIO_INPUT_MAX_CHARS:
            raise ValueError(
                f"AudioGenerationRequest: input is {len(self.input)} characters; the maximum is {AUDIO_INPUT_MAX_CHARS}"
            )
        if self.input is None and self.prompt is None:
            raise ValueError("AudioGenerationRequest: one of input or prompt must be provided")
