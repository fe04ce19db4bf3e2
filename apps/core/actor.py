"""The Actor: who is acting, for which organisation. Resolved once per request or task."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    SYSTEM = "system"


@dataclass(frozen=True, slots=True)
class Actor:
    organization_id: str
    user_id: str | None
    role: Role

    @classmethod
    def system(cls, organization_id: str) -> Actor:
        """For Celery tasks and bootstrap code acting on behalf of an organisation."""
        return cls(organization_id=organization_id, user_id=None, role=Role.SYSTEM)

    @property
    def can_manage(self) -> bool:
        """Owners, admins and the system may change org-wide settings (keys, providers, tools)."""
        return self.role in (Role.OWNER, Role.ADMIN, Role.SYSTEM)
