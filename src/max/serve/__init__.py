"""Serving: the continuous-batching scheduler (shared with ``LLM``) and the OpenAI-compatible server."""
