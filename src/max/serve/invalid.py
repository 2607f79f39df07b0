"""Client errors answered once.  A check on a request raises :class:`~max.interfaces.errors.InvalidRequest`
(or a subclass) where it is made, naming the Python field it is about; the app's one handler
(:func:`answer`) turns it into the 400 in OpenAI's shape (Anthropic's on ``/v1/messages``).  The field the
client sees is the route's name for it: before handing client input to a check, a route says how its body
names the fields with :func:`expect` (a :class:`FieldMap`, kept on the request's state); without one, the
Python field is the answer's ``param``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from fastapi.responses import JSONResponse

from max.interfaces.errors import InvalidRequest
from max.serve.openai_schemas import APIError

__all__ = ["FieldMap", "answer", "api_error", "expect", "shaped"]


@dataclass(frozen=True)
class FieldMap:
    """How a route names the fields of the checks it calls: ``rename`` (a Python field, or None for an error
    about no field, -> the body's field), ``known`` (the fields kept as they are; None: every field) and
    ``default`` (the body's field for any other), ``prefix`` (put before the message, e.g. which prompt of
    several) and ``code`` (replaces the error's code)."""

    rename: Mapping[Optional[str], Optional[str]] = field(default_factory=dict)
    known: Optional[frozenset] = None
    default: Optional[str] = None
    prefix: str = ""
    code: Optional[str] = None

    def param(self, p: Optional[str]) -> Optional[str]:
        if p in self.rename:
            return self.rename[p]
        if self.known is not None and p not in self.known:
            return self.default
        return p


_PLAIN = FieldMap()


def expect(request: Any, fields: Optional[FieldMap]) -> None:
    """Name the fields of the checks ``request``'s handler calls next (None: the Python names)."""
    state = getattr(request, "state", None)
    if state is not None:
        state.invalid_fields = fields


def api_error(request: Any, e: InvalidRequest) -> APIError:
    """The 400 answering ``e`` on ``request`` (its fields named as :func:`expect` last said)."""
    f = getattr(getattr(request, "state", None), "invalid_fields", None) or _PLAIN
    return APIError(400, f.prefix + e.detail, param=f.param(e.param), code=f.code or e.code)


def shaped(path: str, e: APIError) -> JSONResponse:
    """``e`` in Anthropic's shape on ``/v1/messages`` (and below), OpenAI's elsewhere."""
    body = e.anthropic_body() if path == "/v1/messages" or path.startswith("/v1/messages/") else e.body()
    return JSONResponse(body, status_code=e.status, headers=e.headers)


async def answer(request: Any, exc: InvalidRequest) -> JSONResponse:
    """The app's handler of :class:`InvalidRequest` (and its subclasses)."""
    return shaped(request.url.path, api_error(request, exc))
