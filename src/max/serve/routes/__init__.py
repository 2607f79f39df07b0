"""The routes of ``max serve``, one module per family; each defines ``router`` (a FastAPI ``APIRouter``)."""

from max.serve.routes import anthropic, audio, chat, completions, embeddings, health, lora, models, responses, scoring
from max.serve.routes import infill, speech, tokenize, ui, version

ROUTERS = [health.router, models.router, chat.router, completions.router, embeddings.router, lora.router,
           responses.router, scoring.router, tokenize.router, version.router, audio.router, speech.router,
           ui.router, anthropic.router, infill.router]

__all__ = ["ROUTERS"]
