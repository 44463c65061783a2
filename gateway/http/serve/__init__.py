"""The server under the app: uvicorn with drain on exit, and the HTTP/1.1 connection limits."""
