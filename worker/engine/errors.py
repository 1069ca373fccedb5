"""The engine's error hierarchy: user errors are ``ValueError`` subclasses, everything is an ``EngineError``."""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class BudgetError(EngineError, ValueError):
    """A layer (or the double buffer) cannot fit the device memory budget; the message names the numbers."""


class SpecError(EngineError, ValueError):
    """A trial specification is inconsistent (e.g. a batch that does not split into its micro-batches)."""


class SpillStoreError(EngineError):
    """The spill directory is missing, foreign or inconsistent with its manifest."""


class StaleWriterError(SpillStoreError):
    """A writer whose hold on the trial is no longer current tried to take or commit its store: a writer
    with a newer fencing token took the trial, or another commit landed since this writer read the store.
    Nothing was written; the caller drops the unit's result (the newer writer owns the trial now)."""
