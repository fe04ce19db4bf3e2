"""The agent loop: pure context compilation, budgeting and steps, with I/O behind ports."""
