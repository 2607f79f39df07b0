"""Image inputs of vision-language requests: bytes, ``data:`` URIs and local files -> decoded RGB images.

Remote ``http(s)://`` URLs are refused with a clear error unless the caller allows fetching them
(``PipelineConfig.allow_image_urls``, ``--allow-image-urls``): then they are fetched with a timeout and a
size limit.  Every failure is an :class:`ImageInputError` (a ``ValueError``, so the server answers 400)
naming the image and what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from typing import Any
from urllib.parse import unquote, urlparse

from max.interfaces.errors import InvalidRequest

__all__ = ["ImageInputError", "decode_image", "image_bytes_of"]

SUPPORTED_FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF")
MAX_IMAGE_BYTES = 32 << 20
"""The largest image a URL may deliver."""
FETCH_TIMEOUT_S = 10.0


class ImageInputError(InvalidRequest):
    """An image reference or image file that cannot be used."""


def image_bytes_of(ref: Any, what: str = "image", allow_urls: bool = False, media: str = "image") -> bytes:
    """The encoded bytes of an image reference: raw bytes, a ``data:image/...;base64,`` URI, a local path
    or ``file://`` URL; an ``http(s)`` URL only with ``allow_urls`` (else :class:`ImageInputError`).
    ``media``: the data: URI's media type family (``video`` for video files)."""
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return bytes(ref)
    if isinstance(ref, os.PathLike):
        ref = os.fspath(ref)
    if not isinstance(ref, str) or not ref:
        raise ImageInputError(f"{what}: expected bytes, a data: URI or a local file path, got {type(ref).__name__}")
    if ref.startswith("data:"):
        head, sep, payload = ref.partition(",")
        if not sep:
            raise ImageInputError(f"{what}: a data: URI needs a ',' before its payload")
        if not head[5:].startswith(f"{media}/"):
            raise ImageInputError(f"{what}: a data: URI must have an {media}/* media type, got {head[5:] or 'none'!r}")
        if not head.endswith(";base64"):
            raise ImageInputError(f"{what}: only base64 data: URIs are supported (';base64,' is missing)")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ImageInputError(f"{what}: the data: URI's base64 payload is invalid ({e})") from None
    scheme = urlparse(ref).scheme.lower()
    if scheme in ("http", "https"):
        if not allow_urls:
            raise ImageInputError(f"{what}: fetching remote {media}s ({scheme}:// URLs) is not enabled on this server "
                                  f"(--allow-image-urls); send the {media} as a base64 data: URI or a local file path")
        return _fetch(ref, what)
    path = unquote(urlparse(ref).path) if scheme == "file" else ref
    if scheme not in ("", "file") and len(scheme) > 1:  # (a one-letter scheme is a Windows drive)
        raise ImageInputError(f"{what}: unsupported URL scheme {scheme!r} (use a data: URI or a local path)")
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise ImageInputError(f"{what}: no such file {path!r}")
    with open(path, "rb") as f:
        return f.read()


def _fetch(url: str, what: str) -> bytes:
    import httpx

    try:
        with httpx.stream("GET", url, timeout=FETCH_TIMEOUT_S, follow_redirects=True) as r:
            if r.status_code != 200:
                raise ImageInputError(f"{what}: fetching {url} gave HTTP {r.status_code}")
            buf = bytearray()
            for chunk in r.iter_bytes():
                buf += chunk
                if len(buf) > MAX_IMAGE_BYTES:
                    raise ImageInputError(f"{what}: {url} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
            return bytes(buf)
    except httpx.HTTPError as e:
        raise ImageInputError(f"{what}: cannot fetch {url}: {e}") from None


def decode_image(ref: Any, what: str = "image", allow_urls: bool = False) -> Any:
    """A fully decoded RGB ``PIL.Image`` of an image reference (see :func:`image_bytes_of`; a PIL image is
    taken as it is).  Corrupt data and formats other than :data:`SUPPORTED_FORMATS` raise
    :class:`ImageInputError`."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # pragma: no cover - Pillow is a dependency of the vision extra
        raise ImageInputError("image inputs need Pillow: pip install 'libremax[vision]'") from None
    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    data = image_bytes_of(ref, what, allow_urls)
    try:
        img = Image.open(io.BytesIO(data))
        fmt = img.format
        if fmt not in SUPPORTED_FORMATS:
            raise ImageInputError(f"{what}: unsupported image format {fmt!r} "
                                  f"(supported: {', '.join(SUPPORTED_FORMATS)})")
        img.load()  # decodes the whole image: truncated or corrupt data fails here, not inside the model
        return img.convert("RGB")
    except UnidentifiedImageError:
        raise ImageInputError(f"{what}: not a readable image ({len(data)} bytes; supported formats: "
                              f"{', '.join(SUPPORTED_FORMATS)})") from None
    except ImageInputError:
        raise
    except (OSError, ValueError, SyntaxError) as e:
        raise ImageInputError(f"{what}: the image data is corrupt ({e})") from None
