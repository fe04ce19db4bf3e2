"""The browser Agent Development Environment (HTMX + Channels). No business logic."""
