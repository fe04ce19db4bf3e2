"""Errors of folders and files; apps/api/errors.py maps them to HTTP statuses (413, 415)."""

from apps.core.errors import Conflict, DomainError, InvalidInput, NotFound


class FolderNotFound(NotFound):
    code = "folder_not_found"


class FileNotFound(NotFound):
    code = "file_not_found"


class DuplicateFolderName(Conflict):
    """Another folder of the organisation has this name (Letta answers 409)."""

    code = "duplicate_folder_name"


class DuplicateFile(InvalidInput):
    """duplicate_handling=error and the folder has a file of this name (Letta's 400)."""

    code = "duplicate_file"


class FileTooLarge(DomainError):
    """A file past FOLDER_FILE_MAX_BYTES, or one that would take the organisation past
    FOLDER_STORAGE_QUOTA_BYTES (413)."""

    code = "file_too_large"


class UnsupportedFileType(DomainError):
    """A file type this server cannot parse (415, as Letta)."""

    code = "unsupported_file_type"
