"""One accelerator as its datasheet describes it: the chip type the GPU catalogue (servelab/perf/hardware.py)
holds and a calibration profile saves.

Here, in the bottom package, so a profile's schema is read without the catalogue or the cost model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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
    compute_capability: str | None = Field(None, pattern=r"^\d+\.\d+$")
    """CUDA compute capability ("8.0" for an A100, "9.0" for Hopper): the key vLLM picks kernels by (which MoE and
    attention kernels exist for a chip); None for other vendors."""
    memory_gib: float = Field(gt=0)
    driver_memory_mib: float | None = Field(None, gt=0)
    """The device total nvidia-smi reports, where it differs from CUDA's `memory_gib` (a few hundred MiB the driver
    keeps): SGLang sizes its defaults from it (server_args.py, get_device_memory_capacity). None: memory_gib."""
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
        for optional in ("compute_capability", "driver_memory_mib"):
            if getattr(self, optional) is not None and optional not in self.sources:
                raise ValueError(f"no source for {optional}: add sources.{optional}")
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
    def nvidia_smi_memory_mib(self) -> float:
        """MiB as nvidia-smi reports the device (what SGLang's defaults read): driver_memory_mib, else memory_gib."""
        return self.driver_memory_mib if self.driver_memory_mib is not None else self.memory_bytes / 2**20

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

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability as (major, minor), comparable the way vLLM compares it; None where not CUDA."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)
