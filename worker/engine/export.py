"""A trial's committed weights as a transformers ``save_pretrained`` directory (safetensors), with its tokenizer.

What is written loads with ``AutoModelForCausalLM.from_pretrained`` to the model the store holds (the
family's own class): every owned parameter under its transformers name, tied weights once (transformers
re-ties them). One safetensors file per shard plus an index, so only one shard's parameters are in memory
at a time. The config keeps ``use_cache`` off, as the engine trains (a transformers model that trains with
a key/value cache builds its attention mask another way, with other float sums); ``generation_config.json``
turns the cache on, so that generating from the export is fast.

With the trial's tokenizer directory, the export also loads with ``AutoTokenizer.from_pretrained``: a
``save_pretrained`` tokenizer's files (`worker.engine.tokenizer.TOKENIZER_FILES`) are copied as they are; a bare
``tokenizer.json`` (what the web app's datasets and the engine's own BPE training keep) is written through
``PreTrainedTokenizerFast``. A trial on chat examples rendered with a template its tokenizer does not carry
(``DataSpec.chat_template``) exports a tokenizer that carries it, so that ``apply_chat_template`` on the
download gives the prompts it trained on; with the default ChatML template, its end-of-turn token also ends
generation.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

from worker.engine import lora, shared_base
from worker.engine.chat import CHAT_SPECIAL_TOKENS, DEFAULT_CHAT_TEMPLATE
from worker.engine.checkpoint_files import checkpoint_file
from worker.engine.config import LoraSpec
from worker.engine.errors import SpecError
from worker.engine.layers import LayerStack
from worker.engine.layout import Layout
from worker.engine.sizes import FP32
from worker.engine.spill_store import SpillStore
from worker.engine.tokenizer import END_OF_TEXT, SENTENCEPIECE_MODEL, TOKENIZER_CONFIG, TOKENIZER_FILES, TOKENIZER_JSON


def export_tokenizer(tokenizer_dir: Path, out_dir: Path, *, chat_template: str | None = None) -> None:
    """Put the tokenizer of ``tokenizer_dir`` into ``out_dir`` so that ``AutoTokenizer`` loads it from there,
    rendering chats with ``chat_template`` when given.

    Only the directory's own files go into the export: ``CheckpointLinkError`` when a symbolic link leads one
    out of it (the export is downloadable, and would carry whatever the link reaches)."""
    files = {name: checkpoint_file(Path(tokenizer_dir), name) for name in TOKENIZER_FILES}
    if not files[TOKENIZER_JSON].is_file() and not files[SENTENCEPIECE_MODEL].is_file():
        raise SpecError(f"{tokenizer_dir} holds no {TOKENIZER_JSON} (or {SENTENCEPIECE_MODEL}) to export")
    if files[TOKENIZER_CONFIG].is_file():
        for name, path in files.items():
            if path.is_file():
                shutil.copyfile(path, out_dir / name)
        if chat_template is None:
            return
        tokenizer = AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(files[TOKENIZER_JSON]))
        if END_OF_TEXT in tokenizer.get_vocab():  # the BPE trained on a corpus marks each document's end with it
            tokenizer.eos_token = END_OF_TEXT  # so that generate() stops there wherever the export is used
    if chat_template is not None:
        tokenizer.chat_template = chat_template
        end_of_turn = CHAT_SPECIAL_TOKENS[1]
        if chat_template == DEFAULT_CHAT_TEMPLATE and end_of_turn in tokenizer.get_vocab():
            tokenizer.eos_token = end_of_turn  # an answer ends its turn, and generation stops there
    tokenizer.save_pretrained(out_dir)


def _write_configs(out_dir: Path, stack: LayerStack, tokenizer_dir: Path | None, chat_template: str | None) -> None:
    """The model's config, a generation config with the cache on, and the tokenizer when given."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stack.config.save_pretrained(out_dir)
    generation = GenerationConfig.from_model_config(stack.config)
    generation.use_cache = True
    generation.save_pretrained(out_dir)
    if tokenizer_dir is not None:
        export_tokenizer(Path(tokenizer_dir), out_dir, chat_template=chat_template)


def export_pretrained(out_dir: Path, *, store: SpillStore, stack: LayerStack, layout: Layout,
                      tokenizer_dir: Path | None = None, chat_template: str | None = None,
                      after_file: Callable[[], None] = lambda: None) -> None:
    """Write the parameters committed in ``store`` (laid out as ``layout``), ``stack``'s config and the
    tokenizer of ``tokenizer_dir`` (when given) to ``out_dir``; ``after_file`` is called after each shard's
    file is written (a fault point)."""
    out_dir = Path(out_dir)
    _write_configs(out_dir, stack, tokenizer_dir, chat_template)
    n = len(layout.slots)
    weight_map: dict[str, str] = {}
    total = 0
    for shard in range(n):
        filename = "model.safetensors" if n == 1 else f"model-{shard + 1:05d}-of-{n:05d}.safetensors"
        flat = store.read_new(f"p{shard}", layout.numel[shard], torch.float32)
        tensors = {}
        names = stack.hf_names([slot.ref for slot in layout.slots[shard]])
        for slot, name in zip(layout.slots[shard], names, strict=True):
            tensors[name] = slot.view(flat).clone()
            weight_map[name] = filename
        total += flat.numel() * FP32
        save_file(tensors, out_dir / filename, metadata={"format": "pt"})
        after_file()
    if n > 1:
        (out_dir / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def export_lora(out_dir: Path, *, store: SpillStore, stack: LayerStack, layout: Layout, spec: LoraSpec,
                base_dir: str | None, base_root: Path, tokenizer_dir: Path | None = None,
                chat_template: str | None = None, after_file: Callable[[], None] = lambda: None) -> None:
    """A LoRA trial's export: the PEFT adapter directory in ``out_dir/adapter`` and, in ``out_dir`` itself,
    the merged model (the shared base's weights, dequantized to fp32 from a low-bit base: the values the adapters
    trained on, with each adapter merged in, :func:`worker.engine.lora.merged`)
    as a ``save_pretrained`` directory that loads and generates like a fully trained trial's export."""
    out_dir = Path(out_dir)
    adapters: dict[str, torch.Tensor] = {}
    for shard in range(len(layout.slots)):
        flat = store.read_new(f"p{shard}", layout.numel[shard], torch.float32)
        names = stack.hf_names([slot.ref for slot in layout.slots[shard]])
        for slot, name in zip(layout.slots[shard], names, strict=True):
            adapters[name] = slot.view(flat).clone()
    family = stack.config.model_type
    lora.write_adapter(out_dir / lora.ADAPTER_DIR, spec=spec, family=family, base_dir=base_dir, adapters=adapters)
    after_file()
    _write_configs(out_dir, stack, tokenizer_dir, chat_template)
    pairs = {lora.base_name(lora.target_of(name)) + ".weight": (a, adapters[name.replace(".lora_A.", ".lora_B.")])
             for name, a in adapters.items() if ".lora_A." in name}
    index = json.loads((base_root / shared_base.INDEX).read_text())
    files = list(dict.fromkeys(index["files"].values()))  # layer files in layer order, as the base wrote them
    weight_map: dict[str, str] = {}
    total = 0
    for number, filename in enumerate(files):
        target = "model.safetensors" if len(files) == 1 else f"model-{number + 1:05d}-of-{len(files):05d}.safetensors"
        tensors = shared_base.read_dequantized(base_root, filename)
        for key, (a, b) in pairs.items():
            if key in tensors:
                tensors[key] = lora.merged(tensors[key], a, b, scaling=spec.alpha / spec.r,
                                           fan_in_fan_out=family == "gpt2")
        save_file(tensors, out_dir / target, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, target)
        total += sum(t.nbytes for t in tensors.values())
    if len(files) > 1:
        (out_dir / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
