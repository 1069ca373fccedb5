"""The one web module that imports the workers' code: everything the web app uses of `worker` is named here.

What crosses is torch-free at import, so the web process starts without torch (the boundary tests import
every web module with torch, transformers and safetensors blocked):

- the typed contract (`worker.contract`): jobs, trial records and states with their transitions, queue errors;
  and the engine's trial spec (`worker.engine.config`) that jobs are built from;
- `api`, the queue's operations (`worker.api`), which only `webapp.queue_client` calls, with the web app's
  configuration and errors fit for the UI;
- the scheduler's pure policy (`timetable`), which the pages replay to estimate when trials start and end;
- the workers' configuration (`worker.config`) and its ``env*`` readers, which the web app's own configuration
  composes and uses;
- the engine's torch-free pieces: the solver and byte sizes the memory preview plans with, the families'
  architectures, the size-capped, link-refusing reads of a checkpoint's files and the check of a checkpoint,
  the index of the host's shared LoRA bases, and its byte-level BPE tokenizer and the files of a saved
  tokenizer.

The engine's code that loads torch or transformers (rendering chats, encoding examples and preference pairs,
importing a GGUF file) is named here too, in `LAZY`: it is imported when first used (`__getattr__`), by the web
worker's tasks, never when the web app starts. A web module therefore imports this module itself and uses those names
as its attributes (``worker_door.render(...)``, ``except worker_door.TemplateError``), never
``from webapp.worker_door import render``, which would load transformers with the importing module. The
engine renders any chat template but its own ChatML in a child process, under the limits of
`worker.engine.template_sandbox` (torch-free, so named here directly with its error).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from worker import api
from worker.config import BASE_DIR, ConfigError, WorkerConfig, envbool, envint, envlist, envpath
from worker.config import load as load_worker_config
from worker.contract import (
    DEFAULT_CHECKPOINT_MINUTES,
    ENDED,
    MAX_CHECKPOINT_MINUTES,
    MAX_DEVICES_PER_TRIAL,
    PRUNER_METRICS,
    Budget,
    Control,
    EngineJob,
    Job,
    JobError,
    PrunerSpec,
    PruningJob,
    QueueError,
    TrialEvent,
    TrialExists,
    TrialNotFound,
    TrialRecord,
    TrialState,
    control_changes,
)
from worker.engine.base_index import bases
from worker.engine.checkpoint_files import (
    CHECKPOINT_JSON_MAX_BYTES,
    TOKENIZER_JSON_MAX_BYTES,
    checkpoint_dir,
    checkpoint_file,
    read_limited,
)
from worker.engine.checkpoints import check_checkpoint, install_smollm2, smollm2_gguf_path
from worker.engine.config import (
    DPO_LOSS_TYPES,
    DataSpec,
    DpoSpec,
    LoraSpec,
    ModelSpec,
    OptimizerSpec,
    ScheduleSpec,
    TrialSpec,
)
from worker.engine.errors import BudgetError, CheckpointError, CheckpointFileTooLarge, CheckpointLinkError, SpecError
from worker.engine.families import FAMILIES, Architecture, architecture_from_config, default_intermediate
from worker.engine.partition import AUTO_BUDGET_FRACTION, LayerCost, solve_with_head_chunks
from worker.engine.sizes import BASE_DTYPES, FP32, chunked_head_transient_bytes, optimizer_slots
from worker.engine.template_sandbox import RENDER_MEMORY_BYTES, RENDER_SECONDS, TemplateLimitError
from worker.engine.tokenizer import (
    END_OF_TEXT,
    MAX_VOCAB_SIZE,
    MIN_VOCAB_SIZE,
    TOKENIZER_CONFIG,
    TOKENIZER_FILES,
    TOKENIZER_JSON,
    text_chunks,
    train_tokenizer,
)
from worker.scheduling.policy import Slot, TrialLoad, timetable

if TYPE_CHECKING:
    from worker.engine.chat import (
        CHAT_SPECIAL_TOKENS,
        DEFAULT_CHAT_TEMPLATE,
        PROMPT,
        TemplateError,
        answer_spans,
        chat_tokenizer,
        check_template_text,
        render,
    )
    from worker.engine.examples import Encoded, ExampleSet, encode_examples
    from worker.engine.gguf_import import import_gguf
    from worker.engine.pairs import encode_pairs, save_pairs

__all__ = [
    "AUTO_BUDGET_FRACTION",
    "BASE_DIR",
    "BASE_DTYPES",
    "CHAT_SPECIAL_TOKENS",
    "CHECKPOINT_JSON_MAX_BYTES",
    "DEFAULT_CHAT_TEMPLATE",
    "DEFAULT_CHECKPOINT_MINUTES",
    "DPO_LOSS_TYPES",
    "ENDED",
    "END_OF_TEXT",
    "FAMILIES",
    "FP32",
    "MAX_CHECKPOINT_MINUTES",
    "MAX_DEVICES_PER_TRIAL",
    "MAX_VOCAB_SIZE",
    "MIN_VOCAB_SIZE",
    "PROMPT",
    "PRUNER_METRICS",
    "RENDER_MEMORY_BYTES",
    "RENDER_SECONDS",
    "TOKENIZER_CONFIG",
    "TOKENIZER_FILES",
    "TOKENIZER_JSON",
    "TOKENIZER_JSON_MAX_BYTES",
    "Architecture",
    "Budget",
    "BudgetError",
    "CheckpointError",
    "CheckpointFileTooLarge",
    "CheckpointLinkError",
    "ConfigError",
    "Control",
    "DataSpec",
    "DpoSpec",
    "Encoded",
    "EngineJob",
    "ExampleSet",
    "Job",
    "JobError",
    "LayerCost",
    "LoraSpec",
    "ModelSpec",
    "OptimizerSpec",
    "PrunerSpec",
    "PruningJob",
    "QueueError",
    "ScheduleSpec",
    "Slot",
    "SpecError",
    "TemplateError",
    "TemplateLimitError",
    "TrialEvent",
    "TrialExists",
    "TrialLoad",
    "TrialNotFound",
    "TrialRecord",
    "TrialSpec",
    "TrialState",
    "WorkerConfig",
    "answer_spans",
    "api",
    "architecture_from_config",
    "bases",
    "chat_tokenizer",
    "check_checkpoint",
    "check_template_text",
    "checkpoint_dir",
    "checkpoint_file",
    "chunked_head_transient_bytes",
    "control_changes",
    "default_intermediate",
    "encode_examples",
    "encode_pairs",
    "envbool",
    "envint",
    "envlist",
    "envpath",
    "import_gguf",
    "install_smollm2",
    "load_worker_config",
    "optimizer_slots",
    "read_limited",
    "render",
    "save_pairs",
    "smollm2_gguf_path",
    "solve_with_head_chunks",
    "text_chunks",
    "timetable",
    "train_tokenizer",
]

# The engine's names that load torch or transformers, by the module that defines them: imported on first use.
LAZY = {
    "worker.engine.chat": ("CHAT_SPECIAL_TOKENS", "DEFAULT_CHAT_TEMPLATE", "PROMPT", "TemplateError", "answer_spans",
                           "chat_tokenizer", "check_template_text", "render"),
    "worker.engine.examples": ("Encoded", "ExampleSet", "encode_examples"),
    "worker.engine.gguf_import": ("import_gguf",),
    "worker.engine.pairs": ("encode_pairs", "save_pairs"),
}


def __getattr__(name: str) -> Any:
    """One of the `LAZY` names, its module imported now (the first time, it loads torch or transformers)."""
    for module, names in LAZY.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
