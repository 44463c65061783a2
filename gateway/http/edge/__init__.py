"""What every request passes first: guards, CORS, auth and access, bounded bodies, request
logs, the short-path routing, the one error boundary."""
