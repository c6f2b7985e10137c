"""Prompt lengths counted in characters, turned into tokens by the script they are written in.

A user who logs prompt sizes logs characters. English runs about four
characters per token in these models' BPE vocabularies, but Chinese,
Japanese and Korean run one to two: 1,500 Chinese characters are ~1,000
tokens, not the ~375 that four characters per token gives, so a CJK
deployment priced at the English ratio is priced at a third of its prefill.
The ratio used is always said, with its range, since it is an assumption.
"""

from __future__ import annotations

from enum import StrEnum


class Script(StrEnum):
    LATIN = "latin"
    CJK = "cjk"


CHARS_PER_TOKEN = {Script.LATIN: 4.0, Script.CJK: 1.5}
"""Characters per token. Latin: English prose in BPE vocabularies of 32K-150K entries (OpenAI's and Hugging Face's
rule of thumb, ~4). CJK: 1.3-1.8 Chinese characters per token in Qwen's 151K vocabulary (Qwen's tokenizer notes,
mintlify.com/QwenLM/Qwen/resources/tokenization and published measurements), ~1 in Llama 3's 128K vocabulary, less
in 32K ones (Llama 2: a character is often 2 byte tokens); 1.5 is the middle of the modern vocabularies."""
CJK_RANGE = (1.0, 1.8)
"""Characters per token of CJK text across the vocabularies of the catalogue's models (Llama 3 to Qwen)."""


def tokens_from_characters(characters: int, script: Script | None) -> int:
    """Tokens of a prompt of `characters` characters in `script` (None: Latin, the assumption said)."""
    return max(1, round(characters / CHARS_PER_TOKEN[script or Script.LATIN]))


def ratio_said(characters: int, script: Script | None) -> str:
    """The assumption in words, with what the other script would give."""
    chosen = script or Script.LATIN
    tokens = tokens_from_characters(characters, chosen)
    if chosen is Script.CJK:
        low, high = (round(characters / r) for r in (CJK_RANGE[1], CJK_RANGE[0]))
        return (
            f"{characters:,} CJK characters at ~{CHARS_PER_TOKEN[chosen]:g} per token = ~{tokens:,} tokens "
            f"({low:,}-{high:,} across tokenizers; check one prompt with the model's tokenizer)"
        )
    cjk = tokens_from_characters(characters, Script.CJK)
    return (
        f"{characters:,} characters at ~{CHARS_PER_TOKEN[chosen]:g} per token (English or another Latin script"
        f"{'' if script else ', not given'}) = ~{tokens:,} tokens; were they Chinese, Japanese or Korean, "
        f"~{cjk:,} (--script cjk)"
    )
