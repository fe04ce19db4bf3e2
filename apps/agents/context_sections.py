"""Sections of an agent's compiled context that apps above this one build: the folders app's `<directories>`
(the agent's attached folders and open files). This app must not import them, so they register a loader
here when Django starts (their AppConfig.ready), and the loop calls it.

A loader is keyed by the tool type that comes with it (the file tools come with every attached folder): the
loop calls it only for an agent that has such a tool, so other agents' runs cost no query, and again after
one of those tools ran (it may have opened or closed files).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from apps.core.actor import Actor

SectionLoader = Callable[[Actor, Any], str]
"""(the run's actor, the Agent) -> the section's text, "" for none."""

_DIRECTORIES: dict[str, SectionLoader] = {}


def register_directories(tool_type: str, loader: SectionLoader) -> None:
    _DIRECTORIES[tool_type] = loader


def refreshes_directories(tool_type: str) -> bool:
    """Does a call of a tool of this type change the `<directories>` section?"""
    return tool_type in _DIRECTORIES


def load_directories(actor: Actor, agent: Any, tool_types: Iterable[str]) -> str:
    """The `<directories>` section for an agent with tools of these types ("" without a file tool)."""
    for tool_type in dict.fromkeys(tool_types):
        loader = _DIRECTORIES.get(tool_type)
        if loader is not None:
            return loader(actor, agent)
    return ""
