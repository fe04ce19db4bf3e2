"""Folders and files (Letta's folders, formerly sources): documents an agent can open, grep and search.

Owns Folder, FileMetadata with its parsed content, the embedded chunks, the agent <-> folder links and each
agent's open files; ingestion (parse, chunk, embed) as a Celery job, and the file tools. May import agents,
tools, memory, llm, accounts and core; only the api and ade apps import it. `parsing` imports nothing of
Django: it also runs as the bounded child process that parses an upload.
"""
