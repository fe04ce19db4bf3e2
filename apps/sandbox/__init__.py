"""Running untrusted tool code: sandbox configs (image, limits, network), encrypted env vars, executors.

Knows nothing about agents or what tools mean. Imports only apps.core and apps.accounts.
"""
