"""The built-in sample corpus: Python's own reference documentation, which ships inside the standard library.

``pydoc_data.topics`` holds the text of the language reference's topics (about 460 KB of real English prose
and code), so a new installation can train a tokenizer and a model with no upload and no internet.
"""

from __future__ import annotations


def sample_corpus_text() -> str:
    """The sample corpus as one string: every topic in name order, separated by blank lines (deterministic)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in sorted(topics)) + "\n"
