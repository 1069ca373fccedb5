"""Whether a checkpoint's tokenizer carries a chat template of its own, read from its files as AutoTokenizer would
load it: the engine then renders with it, and a trial's export needs no other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.webapp.catalog.checkpoints import TEXT
from webapp.experiments.chat_template import has_own_template
from worker.engine.tokenizer import train_tokenizer

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def tokenizer_dir(path: Path, **config: object) -> Path:
    path.mkdir()
    train_tokenizer(TEXT, vocab_size=300).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))
    return path


@pytest.mark.parametrize(("config", "files", "carries"), [
    ({}, {}, False),
    ({"chat_template": TEMPLATE}, {}, True),
    ({"chat_template": ""}, {}, False),
    ({}, {"chat_template.jinja": TEMPLATE}, True),
    ({"chat_template": [{"name": "default", "template": TEMPLATE}, {"name": "tool_use", "template": TEMPLATE}]},
     {}, True),
    ({"chat_template": [{"name": "tool_use", "template": TEMPLATE}]}, {}, False),
    ({}, {"additional_chat_templates/default.jinja": TEMPLATE}, True),
])
def test_it_reads_whether_the_tokenizer_carries_a_template_as_auto_tokenizer_loads_it(
        tmp_path: Path, config: dict[str, object], files: dict[str, str], carries: bool) -> None:
    directory = tokenizer_dir(tmp_path / "model", **config)
    for name, content in files.items():
        (directory / name).parent.mkdir(exist_ok=True)
        (directory / name).write_text(content)
    assert has_own_template(directory) is carries
    loaded = AutoTokenizer.from_pretrained(directory, local_files_only=True).chat_template
    own = loaded.get("default") if isinstance(loaded, dict) else loaded
    assert bool(own) is carries


def test_a_template_file_that_leads_out_of_the_directory_counts_as_none(tmp_path: Path) -> None:
    directory = tokenizer_dir(tmp_path / "model")
    (tmp_path / "elsewhere.jinja").write_text(TEMPLATE)
    (directory / "chat_template.jinja").symlink_to(tmp_path / "elsewhere.jinja")
    assert has_own_template(directory) is False
