"""Routers of the HTTP API, one module per resource; the app factory includes each with one line."""
