"""The accelerator catalogue: peak rates, memory and interconnect of each chip, with sources.

Every number the cost model multiplies by comes from here, so each carries a
citation (checked on load) — "312 TFLOP/s on an A100" is only an explanation
if the reader can look the 312 up. Users add chips from a YAML file of the
same shape; a bad file is refused with one message naming the file and field.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import ValidationError

from servelab.perf.errors import PerfConfigError
from servelab.schemas.hardware import ComputeDtype, Hardware

__all__ = ["BUILTIN_GPUS", "ComputeDtype", "Hardware", "builtin_gpus", "get_gpu", "gpu_catalogue", "load_gpu_file"]
"""The chip type lives in servelab.schemas (a profile saves one); the catalogue re-exports it for its readers."""

BUILTIN_GPUS = Path(__file__).parent / "data" / "gpus.yaml"


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _parse_catalogue(path: Path) -> tuple[Hardware, ...]:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise PerfConfigError(f"cannot read GPU file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise PerfConfigError(f"GPU file {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, list):
        raise PerfConfigError(f"GPU file {path} must be a YAML list of GPU entries")
    gpus = []
    for index, entry in enumerate(raw):
        label = entry.get("name", f"entry {index}") if isinstance(entry, dict) else f"entry {index}"
        try:
            gpus.append(Hardware.model_validate(entry))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'entry'}: {err['msg']}" for err in exc.errors()
            )
            raise PerfConfigError(f"GPU file {path}, {label}: {problems}") from exc
    return tuple(gpus)


@cache
def builtin_gpus() -> tuple[Hardware, ...]:
    return _parse_catalogue(BUILTIN_GPUS)


def load_gpu_file(path: str | Path) -> tuple[Hardware, ...]:
    """Chips a user defines in their own YAML file (same schema as data/gpus.yaml)."""
    return _parse_catalogue(Path(path))


def gpu_catalogue(extra_file: str | Path | None = None) -> dict[str, Hardware]:
    """Every known chip keyed by each normalised name and alias; user entries win over built-ins."""
    gpus = builtin_gpus() + (load_gpu_file(extra_file) if extra_file else ())
    return {_normalise(n): gpu for gpu in gpus for n in gpu.names()}


def get_gpu(name: str, extra_file: str | Path | None = None) -> Hardware:
    """Look a chip up by name or alias, case-insensitively (`a100`, `H100-SXM`, `mi300x`)."""
    catalogue = gpu_catalogue(extra_file)
    try:
        return catalogue[_normalise(name)]
    except KeyError:
        known = ", ".join(sorted({gpu.name for gpu in catalogue.values()}))
        raise PerfConfigError(f"unknown GPU {name!r}; known: {known} (add your own with a GPU YAML file)") from None
