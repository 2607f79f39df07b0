"""``GET /version`` (and ``/v1/version``): ``{"version": <libremax's version>}``, as vLLM answers it."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

router = APIRouter()


def server_version() -> str:
    """The installed libremax distribution's version (the package's own when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("libremax")
    except metadata.PackageNotFoundError:  # run from a source tree
        import max

        return str(max.__version__)


@router.get("/version")
@router.get("/v1/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": server_version()})
