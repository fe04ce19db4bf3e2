"""The Letta-compatible /v1 REST API: auth, views, serializers, error mapping. No business logic."""
