"""Gemma 4's tokenizer for text-only serving: the folder's tokenizer and chat template
(:class:`~max.pipelines.lib.tokenizer.TextTokenizer`), refusing images, video and audio with an error that
names the input (``InvalidRequest``: HTTP 400) before anything is tokenised."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from max.interfaces.errors import InvalidRequest
from max.pipelines.architectures.gemma4multimodal.config import REFUSAL
from max.pipelines.lib.tokenizer import TextTokenizer

_MEDIA_PARTS = {"image_url": "image", "image": "image", "video_url": "video", "video": "video",
                "input_audio": "audio", "audio_url": "audio", "audio": "audio"}
"""Content part types that carry media -> the input they are, for the error."""


def media_in_messages(messages: Optional[Sequence[Any]]) -> list[str]:
    """The media inputs (``image``, ``video``, ``audio``) of chat messages' content parts, in order."""
    found = []
    for m in messages or ():
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        if isinstance(content, list):
            found += [_MEDIA_PARTS[p.get("type")] for p in content
                      if isinstance(p, dict) and p.get("type") in _MEDIA_PARTS]
    return found


def _refuse(what: str, param: str, where: Optional[str] = None) -> None:
    raise InvalidRequest(f"{REFUSAL} (the request has {what})", param=param, where=where)


class Gemma4TextOnlyTokenizer(TextTokenizer):
    """``TextTokenizer`` that refuses a request's images (``images`` or content parts), video and audio."""

    def apply_chat_template(self, messages: list[Any], tools: Any = None,
                            chat_template_options: Optional[dict[str, Any]] = None) -> str:
        media = media_in_messages(messages)
        if media:
            _refuse(f"{len(media)} {'/'.join(dict.fromkeys(media))} part(s) in its messages", "messages")
        return super().apply_chat_template(messages, tools, chat_template_options)

    def _new_context(self, request: Any, cls: type, ids: Any = None, **extra: Any) -> Any:
        if request.images:
            _refuse(f"{len(request.images)} image(s)", "images", f"request {request.request_id}")
        media = media_in_messages(request.messages)
        if media:
            _refuse(f"{len(media)} {'/'.join(dict.fromkeys(media))} part(s) in its messages", "messages",
                    f"request {request.request_id}")
        return super()._new_context(request, cls, ids, **extra)
