"""Serving: the OpenAI-compatible server over the pipelines' continuous-batching scheduler."""
