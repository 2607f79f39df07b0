"""The routes of ``max serve``, one module per family; each defines ``router`` (a FastAPI ``APIRouter``)."""

from max.serve.routes import chat, completions, embeddings, health, lora, models, responses, scoring, tokenize, ui
from max.serve.routes import version

ROUTERS = [health.router, models.router, chat.router, completions.router, embeddings.router, lora.router,
           responses.router, scoring.router, tokenize.router, version.router, ui.router]

__all__ = ["ROUTERS"]
