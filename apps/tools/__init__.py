"""Tool definitions, JSON-schema generation, tool rules and their solver, attachment to agents.

Imports apps.memory, apps.sandbox, apps.llm and lower; never apps.agents.
"""
