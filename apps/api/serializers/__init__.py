"""Wire shapes of the Letta API, one module per resource (common.py: blocks, health)."""
