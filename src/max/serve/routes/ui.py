"""The chat page at ``GET /`` and its files at ``GET /static/{name}``: plain HTML, CSS and JavaScript
shipped inside the package (``max/serve/static``), no build step and nothing fetched from elsewhere,
so it works offline.  The page streams from ``/v1/chat/completions``; see ``static/app.js``."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from max.serve.openai_schemas import APIError

router = APIRouter()

FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
         "style.css": "text/css; charset=utf-8"}
# the page may talk to this server only: no CDN, no third-party requests (images: data/blob URLs)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def _file(name: str) -> Response:
    if name not in FILES:
        raise APIError(404, f"no static file '{name}'", code="not_found")
    data = resources.files("max.serve").joinpath("static", name).read_bytes()
    return Response(data, media_type=FILES[name], headers={"Content-Security-Policy": CSP,
                                                           "Cache-Control": "no-cache",
                                                           "X-Content-Type-Options": "nosniff"})


@router.get("/", include_in_schema=False)
async def chat_page() -> Response:
    return _file("index.html")


@router.get("/static/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    return _file(name)
