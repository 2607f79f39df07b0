"""Llama 2/3 and SmolLM: config translation, weight adapters, graph builder, registration."""
