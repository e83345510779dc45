"""Serving: the continuous-batching engine, the OpenAI-compatible HTTP layer, and the live page."""
