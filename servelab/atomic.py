"""Files written whole or not at all: the text goes to `NAME.tmp` beside the file and is renamed over it.

A reader never sees half a file (a run's summary.json read while it is written, a report cut by a full disk),
and a failed write leaves neither half a file nor the `.tmp` behind. Imports nothing from servelab, so every
layer may use it.
"""

from __future__ import annotations

from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename; on any failure the old file (if any) stays and no `.tmp` is left."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
