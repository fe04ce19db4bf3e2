"""Identities: Letta's way to map an app's end users (or organisations) to the agents and blocks that serve
them. Owns the Identity model and its links to agents and blocks. May import agents, memory, accounts and core;
only the api and ade apps import it."""
