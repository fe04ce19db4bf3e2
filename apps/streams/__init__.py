"""The per-run event log (a Redis Stream read from a cursor), shared by SSE and the ADE WebSocket."""
