"""Docstring sentences in the package are at most 25 words, split as the README's sentences are."""

from __future__ import annotations

import ast
import re

from tests import ROOT
from tests.product.test_readme import prose_sentences

PACKAGES = ("harness", "experiments", "optimizers")


def docstrings(source: str) -> list[tuple[int, str]]:
    """``(line, docstring)`` of the module, each class and each function in ``source``."""
    nodes = ast.walk(ast.parse(source))
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [
        (getattr(n, "lineno", 1), doc)
        for n in nodes
        if isinstance(n, kinds) and (doc := ast.get_docstring(n))
    ]


def long_sentences(source: str, name: str) -> list[str]:
    found = []
    for line, doc in docstrings(source):
        prose = re.sub(r"^\s*(>>>|\.\.\.).*$", "", doc, flags=re.M)  # doctest lines are code
        for sentence in prose_sentences(prose):
            if len(sentence.split()) > 25:
                found.append(f"{name}:{line}: ({len(sentence.split())}) {sentence}")
    return found


def test_the_check_finds_a_sentence_of_26_words_and_passes_one_of_25() -> None:
    source = '"""' + " ".join(["word"] * 26) + ". " + " ".join(["Word"] * 25) + '."""\n'
    assert len(long_sentences(source, "example.py")) == 1


def test_every_docstring_sentence_is_at_most_25_words() -> None:
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    found = [s for path in files for s in long_sentences(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []
