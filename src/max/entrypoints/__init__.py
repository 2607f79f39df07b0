"""Entry points: ``LLM`` (offline generation) and the ``max`` command line."""
