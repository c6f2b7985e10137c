"""The accelerator catalogue: peak rates, memory and interconnect of each chip, with sources.

Every number the cost model multiplies by comes from here, so each carries a
citation (checked on load) — "312 TFLOP/s on an A100" is only an explanation
if the reader can look the 312 up. Users add chips from a YAML file of the
same shape; a bad file is refused with one message naming the file and field.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servelab.perf.errors import PerfConfigError

BUILTIN_GPUS = Path(__file__).parent / "data" / "gpus.yaml"

ComputeDtype = Literal["bf16", "fp8", "int8", "fp4"]

_CITED_FIELDS = (
    "memory_gib",
    "memory_bandwidth_gbs",
    "bf16_tflops",
    "fp8_tflops",
    "int8_tflops",
    "interconnect_gbs",
    "pcie_gbs",
)


class Hardware(BaseModel):
    """One accelerator as the datasheet describes it (dense rates, no sparsity)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    aliases: tuple[str, ...] = ()
    vendor: Literal["nvidia", "amd", "cpu", "other"] = "other"
    memory_gib: float = Field(gt=0)
    memory_bandwidth_gbs: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0, description="also the fp16 rate and the W4A16 compute rate")
    fp8_tflops: float = Field(ge=0)
    int8_tflops: float = Field(ge=0)
    fp4_tflops: float = Field(0, ge=0, description="FP4 (NVFP4/MXFP4) tensor cores: Blackwell and later; 0 elsewhere")
    interconnect: Literal["nvlink", "pcie", "infinity-fabric", "none", "other"] = "pcie"
    interconnect_gbs: float = Field(ge=0, description="GPU-to-GPU, bidirectional, all links")
    pcie_gbs: float = Field(ge=0)
    placeholder: bool = False
    """True for rates that are guesses awaiting calibration (the generic `cpu` device)."""
    sources: dict[str, str]

    @model_validator(mode="after")
    def _every_number_is_cited(self) -> Hardware:
        if "datasheet" in self.sources:
            return self
        cited = _CITED_FIELDS + (("fp4_tflops",) if self.fp4_tflops else ())
        missing = [f for f in cited if f not in self.sources]
        if missing:
            raise ValueError(f"no source for {', '.join(missing)}: add sources.datasheet or one source per field")
        return self

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def memory_bandwidth(self) -> float:
        """Bytes per second."""
        return self.memory_bandwidth_gbs * 1e9

    @property
    def interconnect_bandwidth(self) -> float:
        """Bytes per second in one direction: what a ring all-reduce step can use."""
        return self.interconnect_gbs * 1e9 / 2

    def peak_flops(self, dtype: ComputeDtype) -> float:
        """Dense tensor-core FLOP/s (or OP/s) for `dtype`; 0 where the chip has no such path."""
        tflops = {"bf16": self.bf16_tflops, "fp8": self.fp8_tflops, "int8": self.int8_tflops, "fp4": self.fp4_tflops}[
            dtype
        ]
        return tflops * 1e12

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


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
