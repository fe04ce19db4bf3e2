from apps.core.errors import Conflict, NotFound


class IdentityNotFound(NotFound):
    code = "identity_not_found"


class DuplicateIdentity(Conflict):
    """Another identity of the organisation has this identifier_key (Letta answers 409)."""

    code = "duplicate_identity"
