"""Errors a user can act on. Each names what is wrong so the CLI can print it as one line."""


class BackfillError(Exception):
    """Base of every error the engine raises on purpose (as opposed to a bug)."""


class SourceError(BackfillError, ValueError):
    """A source cannot be found or read; the message names the file or glob and the problem. (Also a
    ValueError, as bad input is to Python callers.)"""


class MappingError(BackfillError, ValueError):
    """The source cannot be mapped; names table and source column, type, and for bad values the file, row and value."""


class DocumentError(BackfillError, ValueError):
    """A job document that is not one before any field is read; ``status`` is the HTTP answer for it."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class TableNotFound(BackfillError):
    pass


class CatalogUnsupported(BackfillError):
    """The catalog is not configured, or cannot do what a backfill needs (commit, be shared), or is not the job's."""


class JobNotFound(BackfillError):
    pass


class JobBusy(BackfillError):
    """Another process runs the job right now."""


class LeaseConflict(BackfillError):
    """Another unpublished job holds an overlapping range of the same table."""


class InvalidJob(BackfillError):
    pass


class ValidationFailed(BackfillError):
    """A check on the staged data failed: nothing was published, the branch is kept for inspection."""


class DstRefused(BackfillError):
    """Local times that do not exist or are ambiguous, with the default policy `refuse`."""


class Interrupted(BackfillError):
    """The job was stopped (Ctrl-C) between steps; it can be resumed."""


class Aborted(BackfillError):
    """The job was aborted: its branch, staged files and lease are gone; main is untouched."""


class FilesLost(BackfillError):
    """Files of written units were gone before they were staged (another engine's orphan-file removal):
    the units are pending again, and writing them once more is the way on (`resume`)."""
