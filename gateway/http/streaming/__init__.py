"""Streaming responses: the SSE response and its framings, the send watch, the open-stream
registry, producer liveness."""
