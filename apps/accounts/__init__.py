"""Organisations, users, memberships with roles, API keys; turning a request or key into an Actor.

Imports only apps.core.
"""
