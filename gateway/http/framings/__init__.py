"""One module per kind of SSE stream, each a `streaming.framing.Framing`: what that
stream writes for each of its items and how it ends (`run`, `langgraph`,
`ui_messages`, `session_feed`)."""
