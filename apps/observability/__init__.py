"""Observability: each run's trace spans (OpenTelemetry, kept per run in Postgres and exported over OTLP
when configured) and the platform's Prometheus metrics (counted in Redis, so every process is visible).

Sits just above apps.core: the agent loop, the tools and the adapters import it; it imports only core.
"""
