"""The routes of ``max serve``, one module per family; each defines ``router`` (a FastAPI ``APIRouter``)."""

from max.serve.routes import chat, completions, embeddings, health, lora, models
from max.serve.routes import tokenize, version

ROUTERS = [health.router, models.router, chat.router, completions.router, embeddings.router, lora.router]
ROUTERS += [tokenize.router, version.router]

__all__ = ["ROUTERS"]
