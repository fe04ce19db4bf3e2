"""Agent-loop tests use `make_agent` and `send` from tests/conftest.py."""
