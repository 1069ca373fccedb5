"""The engine's error hierarchy: user errors are ``ValueError`` subclasses, everything is an ``EngineError``."""

from pathlib import Path


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class BudgetError(EngineError, ValueError):
    """A layer (or the double buffer) cannot fit the device memory budget; the message names the numbers.

    When one layer is the reason, `layer`, `needed_bytes` and `budget_bytes` say which and by how much.
    """

    def __init__(self, message: str, *, layer: str | None = None, needed_bytes: int | None = None,
                 budget_bytes: int | None = None) -> None:
        super().__init__(message)
        self.layer, self.needed_bytes, self.budget_bytes = layer, needed_bytes, budget_bytes


class SpecError(EngineError, ValueError):
    """A trial specification is inconsistent (e.g. a batch that does not split into its micro-batches)."""


class SpillStoreError(EngineError):
    """The spill directory is missing, foreign or inconsistent with its manifest."""


class StaleWriterError(SpillStoreError):
    """A writer whose hold on the trial is no longer current tried to take or commit its store: a writer
    with a newer fencing token took the trial, or another commit landed since this writer read the store.
    Nothing was written; the caller drops the unit's result (the newer writer owns the trial now)."""


class LaneNotReady(EngineError):
    """A lane of a wavefront has no unit that can run now: its next unit needs a unit not yet committed (another
    device runs it), or the lane is through. Nothing was written; the caller gives the unit back."""


class CheckpointError(SpecError):
    """A checkpoint directory or model file cannot be used; the message names the file and what is wrong."""


class CheckpointFileTooLarge(CheckpointError):
    """A checkpoint's file is over the size the engine reads of such a file; ``path``, ``size_bytes`` and
    ``limit_bytes`` say which and by how much."""

    def __init__(self, path: Path, *, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"{path} is {size_bytes:,} bytes, over the {limit_bytes:,} bytes read of a checkpoint's "
                         f"{path.name}; a real one is far smaller, so this is not one")
        self.path, self.size_bytes, self.limit_bytes = path, size_bytes, limit_bytes


class CheckpointLinkError(CheckpointError):
    """A checkpoint directory, or a file of it (``path``), leads elsewhere than where it was checked (a symbolic
    link)."""

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


class GgufFormatError(CheckpointError):
    """A GGUF file's structure is inconsistent with itself or with its size (counts, lengths or offsets that
    point past its end); the message names what and where."""
