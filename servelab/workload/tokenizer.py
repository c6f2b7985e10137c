"""Prompt token ids, real or synthetic, made in bulk.

Without a tokenizer, ids are drawn uniformly from SYNTHETIC_ID_RANGE,
[1000, 4000): above the block of control tokens that some vocabularies keep
at the bottom (Mistral's Tekken reserves 0-999; most others keep a handful),
and below the size of the smallest vocabulary we serve (the 4,096-token test
model), so any model accepts them. There is no text then: such prompts are
sent as token ids to /v1/completions, and the simulator only needs ids.

With a tokenizer, prompts are real text whose token count is exact: draw
ids, decode, re-encode, and truncate or top up until the round trip is
stable at the target length, as vLLM's random dataset does. The loop runs
over the whole batch at once through the `tokenizers` batch calls, so the
per-token work stays in Rust.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from servelab.workload.errors import WorkloadError

SYNTHETIC_ID_RANGE = (1000, 4000)
CHARS_PER_TOKEN = 4.0
"""Length estimate for text when no tokenizer is given (English prose with a BPE vocabulary)."""
_MAX_ROUNDS = 10


def _printable(text: str) -> bool:
    return all(c.isprintable() or c in "\n\t" for c in text)


def synthetic_ids(total: int, rng: np.random.Generator) -> np.ndarray:
    """`total` ids in SYNTHETIC_ID_RANGE as one int32 array; callers slice it into prompts."""
    low, high = SYNTHETIC_ID_RANGE
    return rng.integers(low, high, size=total, dtype=np.int32)


def estimate_tokens(text: str) -> int:
    return max(1, round(len(text) / CHARS_PER_TOKEN))


class PromptTokenizer:
    """A local Hugging Face tokenizer (a directory with tokenizer.json, or the file itself)."""

    def __init__(self, path: Path) -> None:
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise WorkloadError(f"--tokenizer {path}: no tokenizer.json there (a local directory or file is needed)")
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises a bare Exception for a bad file
            raise WorkloadError(f"--tokenizer {file}: cannot load it: {exc}") from exc
        self.path = path
        self._drawable = self._stable_ids()
        if self._drawable.size == 0:
            raise WorkloadError(f"--tokenizer {file}: its vocabulary has no ordinary tokens")

    def _stable_ids(self) -> np.ndarray:
        """Ordinary tokens that survive a decode/encode round trip on their own.

        Special tokens would change the request's meaning, and byte tokens
        that are half a UTF-8 character decode to U+FFFD and re-encode to
        something else: excluding both makes the length fix-up converge.
        Control characters are dropped too, so prompts stay plain text.
        """
        special = set(self._tok.get_added_tokens_decoder())
        candidates = [i for i in range(self._tok.get_vocab_size(with_added_tokens=True)) if i not in special]
        texts = self._tok.decode_batch([[i] for i in candidates], skip_special_tokens=False)
        encoded = self._tok.encode_batch(texts, add_special_tokens=False)
        return np.asarray(
            [i for i, t, e in zip(candidates, texts, encoded) if e.ids == [i] and _printable(t)], dtype=np.int32
        )

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: np.ndarray) -> str:
        return self._tok.decode(np.asarray(ids).tolist(), skip_special_tokens=False)

    def random_ids(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self._drawable[rng.integers(0, self._drawable.size, size=n)]

    def exact_prompts(self, lengths: np.ndarray, rng: np.random.Generator) -> tuple[list[np.ndarray], list[str], int]:
        """Texts of exactly `lengths[i]` tokens and their ids; also the count that did not converge.

        A prompt that is still off after the last round keeps its nearest
        round trip (ids re-encoded from its text, so ids and text agree).
        """
        targets = np.asarray(lengths, dtype=np.int64)
        flat = self.random_ids(int(targets.sum()), rng)
        ids = np.split(flat, np.cumsum(targets)[:-1]) if len(targets) else []
        texts = [""] * len(ids)
        pending = list(range(len(ids)))
        for _ in range(_MAX_ROUNDS):
            if not pending:
                break
            decoded = self._tok.decode_batch([ids[i].tolist() for i in pending], skip_special_tokens=False)
            encoded = self.encode_batch(decoded)
            still = []
            for i, text, again in zip(pending, decoded, encoded):
                texts[i] = text
                target = int(targets[i])
                if len(again) > target:
                    again = again[:target]
                elif len(again) < target:
                    again = np.concatenate([again, self.random_ids(target - len(again), rng)])
                else:
                    ids[i] = again
                    continue
                ids[i] = again
                still.append(i)
            pending = still
        if pending:
            for i in pending:
                texts[i] = self.decode(ids[i])
            for i, again in zip(pending, self.encode_batch([texts[i] for i in pending])):
                ids[i] = again
        return ids, texts, len(pending)
