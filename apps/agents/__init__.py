"""Agents, conversations, messages, runs, steps; the agent loop and its Celery entry points.

Imports apps.tools, apps.memory, apps.llm and lower; never apps.api or apps.ade.
"""
