"""Tiny local checkpoints for the catalog's tests: built from a config and a tokenizer trained here, no hub."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser, Permission

TEXT = "The quick brown fox jumps over the lazy dog. A hydra has many heads, and each head trains a model.\n" * 20


def tiny_llama(directory: Path, *, vocab: int = 320) -> Path:
    """A 2-layer Llama checkpoint as ``save_pretrained`` writes it, with a byte-level BPE trained on TEXT."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from worker.engine.tokenizer import train_tokenizer

    config = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=32, vocab_size=vocab, max_position_embeddings=64,
                         tie_word_embeddings=True)
    directory.mkdir(parents=True)
    LlamaForCausalLM(config).save_pretrained(directory)
    corpus = directory.parent / f".{directory.name}-corpus.txt"
    corpus.write_text(TEXT)
    train_tokenizer(corpus, 300).save(str(directory / "tokenizer.json"))
    corpus.unlink()
    return directory


def catalog_manager(user: AbstractBaseUser) -> AbstractBaseUser:
    """`user`, granted the permission to add to the catalog and remove what they added, as an administrator
    would. Call it before anything asks this user object about permissions: Django caches them on it."""
    user.user_permissions.add(Permission.objects.get(content_type__app_label="catalog", codename="manage_catalog"))
    return user
