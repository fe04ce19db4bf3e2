from apps.core.errors import DomainError, InvalidInput


class AuthenticationFailed(DomainError):
    code = "unauthorized"


class DuplicateApiKey(InvalidInput):
    code = "duplicate_api_key"
