"""Typed request errors: raised where a check is made, mapped to HTTP once (``max.serve``).

Each carries the request field it is about (``param``, the name the Python API uses; the server
maps it to the OpenAI field), a machine-readable ``code``, and ``detail``: the message for the
client, without the internal prefix (``SamplingParams: ``, ``request <id>: ``) that ``str(e)``
shows Python callers.  They subclass ``ValueError`` (and ``TypeError`` for wrong types), so
code that catches those keeps working.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["EmptyPrompt", "InvalidRequest", "InvalidRequestType", "PromptTooLong"]


class InvalidRequest(ValueError):
    """A request's input is invalid (HTTP 400)."""

    code = "invalid_value"

    def __init__(self, detail: str, *, param: Optional[str] = None, where: Optional[str] = None,
                 code: Optional[str] = None) -> None:
        self.detail = detail
        self.param = param
        self.where = where
        if code is not None:
            self.code = code
        super().__init__(f"{where}: {detail}" if where else detail)


class InvalidRequestType(InvalidRequest, TypeError):
    """A request field has the wrong type (HTTP 400)."""


class PromptTooLong(InvalidRequest):
    """The prompt does not fit the model's maximum length (``length`` tokens, or at least that many;
    ``limit``: the maximum)."""

    code = "context_length_exceeded"

    def __init__(self, detail: str, *, length: int, limit: Optional[int], param: Optional[str] = "prompt",
                 where: Optional[str] = None) -> None:
        super().__init__(detail, param=param, where=where)
        self.length = length
        self.limit = limit


class EmptyPrompt(InvalidRequest):
    """The prompt encodes to no tokens."""
