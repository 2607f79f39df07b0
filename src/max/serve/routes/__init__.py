"""The routes of ``max serve``, one module per family; each defines ``router`` (a FastAPI ``APIRouter``)."""

from max.serve.routes import audio, chat, completions, embeddings, health, lora, models

ROUTERS = [health.router, models.router, chat.router, completions.router, embeddings.router, lora.router, audio.router]

__all__ = ["ROUTERS"]
