from apps.core.errors import Conflict, InvalidInput, NotFound


class BlockNotFound(NotFound):
    code = "block_not_found"


class BlockTooLong(InvalidInput):
    code = "block_too_long"


class BlockReadOnly(InvalidInput):
    code = "block_read_only"


class BlockConcurrentUpdate(Conflict):
    code = "block_concurrent_update"


class DuplicateBlockLabel(InvalidInput):
    code = "duplicate_block_label"


class EmbeddingModelMissing(InvalidInput):
    """Archival memory was used without a usable embedding handle (empty, unknown or unconfigured)."""

    code = "embedding_model_missing"


class PassageNotFound(NotFound):
    code = "passage_not_found"


class ArchiveNotFound(NotFound):
    code = "archive_not_found"
