"""Model handles -> litellm calls, token counting, embeddings, provider credentials (encrypted).

Knows nothing about agents. Imports only apps.core and apps.accounts.
"""
