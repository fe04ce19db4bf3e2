"""The browser Agent Development Environment (HTMX + Channels). No business logic: forms check input's
shape, views call the other apps' services, selectors, models and errors (plus apps.agents.wire and, for
the run relay, apps.streams.events / redis_client), never their internal modules."""
