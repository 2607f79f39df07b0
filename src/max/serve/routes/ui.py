"""The chat page at ``GET /`` and its files at ``GET /static/{name}``: plain HTML, CSS and JavaScript
shipped inside the package (``max/serve/static``), no build step and nothing fetched from elsewhere,
so it works offline.  The page streams from ``/v1/chat/completions``; see ``static/app.js``.

Answers are rendered as Markdown by two vendored libraries (``static/vendor``: marked and DOMPurify,
unchanged release files with their licenses; versions in ``static/vendor/README.md``).  The icon is
``favicon.svg`` (linked by the page) and ``favicon.ico`` (the same drawing at 16/32/48 px) for
clients that ask for ``/favicon.ico``."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from max.serve.openai_schemas import APIError

router = APIRouter()

_JS, _TEXT = "text/javascript; charset=utf-8", "text/plain; charset=utf-8"
FILES = {"index.html": "text/html; charset=utf-8", "app.js": _JS, "style.css": "text/css; charset=utf-8",
         "favicon.svg": "image/svg+xml", "favicon.ico": "image/x-icon",
         "vendor/marked.umd.js": _JS, "vendor/purify.min.js": _JS, "vendor/README.md": _TEXT,
         "vendor/LICENSE.marked": _TEXT, "vendor/LICENSE.dompurify": _TEXT, "vendor/LICENSE-MPL.dompurify": _TEXT}
# the page may talk to this server only: no CDN, no third-party requests (images: data/blob URLs); no inline
# script or event handlers either, so model output that slipped past the sanitiser still could not run
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def _file(name: str) -> Response:
    if name not in FILES:
        raise APIError(404, f"no static file '{name}'", code="not_found")
    data = resources.files("max.serve").joinpath("static", *name.split("/")).read_bytes()
    return Response(data, media_type=FILES[name], headers={"Content-Security-Policy": CSP,
                                                           "Cache-Control": "no-cache",
                                                           "X-Content-Type-Options": "nosniff"})


@router.get("/", include_in_schema=False)
async def chat_page() -> Response:
    return _file("index.html")


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> Response:
    return _file("favicon.ico")


@router.get("/static/{name:path}", include_in_schema=False)
async def static_file(name: str) -> Response:
    return _file(name)
