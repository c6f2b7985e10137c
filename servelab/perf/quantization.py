"""What a weight format and a KV-cache dtype change: bytes moved, and which tensor-core rate applies.

The rules follow what vLLM does on each chip rather than what the format's
name suggests: FP8 weights on a chip without FP8 tensor cores (Ampere) still
load, as weight-only FP8 through the Marlin kernel, computing in bf16; W4A16
(AWQ/GPTQ) always computes in fp16. INT8 W8A8 has no such fallback in vLLM,
so it is refused on a chip without INT8 tensor cores. FP4 weights (MXFP4 as
gpt-oss ships them, NVFP4) run on Blackwell's block-scaled tensor cores (NVFP4 at
the FP4 rate, MXFP4 with MXFP8 activations at the FP8 rate); elsewhere vLLM
dequantizes them in its W4A16 kernels (Marlin, Triton), computing in bf16: the
bytes are saved, the compute is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import ComputeDtype, Hardware
from servelab.perf.models import ModelSpec

# 4-bit weights with one fp16 scale (and a packed 4-bit zero point) per group of 128.
_W4_GROUP_BYTES_PER_PARAM = 0.5 + (2 + 0.5) / 128
# FP4 (E2M1) weights with one scale per block: MXFP4 an 8-bit power of two per 32 (OCP MX spec), NVFP4 an FP8 E4M3
# per 16 (plus one FP32 per tensor, negligible).
_FP4_BYTES_PER_PARAM = {"mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16}
# The tensor-core rate each runs at on Blackwell: NVFP4 checkpoints quantize activations to FP4 too (W4A4, the FP4
# rate); vLLM runs MXFP4 experts (gpt-oss) as MXFP4 weights x MXFP8 activations in FlashInfer's block-scaled MoE
# kernels, whose mixed-width MMA runs at the FP8 rate.
_FP4_COMPUTE: dict[str, ComputeDtype] = {"mxfp4": "fp8", "nvfp4": "fp4"}


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How the linear layers' weights are stored and multiplied."""

    name: str
    bytes_per_param: float
    compute_dtype: ComputeDtype
    note: str = ""
    """Set when vLLM falls back to another kernel than the name implies."""

    @property
    def weight_only(self) -> bool:
        """Weights stored narrower than the bf16 they are multiplied in: dequantized inside the kernel (Marlin)."""
        return self.compute_dtype == "bf16" and self.bytes_per_param < 2


def weight_format(quantization: str | None, model: ModelSpec, hardware: Hardware) -> WeightFormat:
    """The format vLLM would run `quantization` in on `hardware` (None: the model's own dtype)."""
    method = (quantization or model.quantization or "none").lower()
    if method in ("none", "bf16", "bfloat16", "fp16", "float16", "half"):
        return WeightFormat("bf16" if model.dtype != "float16" else "fp16", model.dtype_bytes, "bf16")
    if method == "fp8":
        if hardware.fp8_tflops > 0:
            return WeightFormat("fp8", 1.0, "fp8")
        return WeightFormat(
            "fp8-weight-only",
            1.0,
            "bf16",
            note=f"{hardware.name} has no FP8 tensor cores: vLLM runs FP8 weights weight-only (Marlin), computing in "
            f"bf16",
        )
    if method in ("int8", "w8a8", "int8-w8a8", "compressed-tensors"):  # vLLM loads a W8A8 checkpoint as the latter
        if hardware.int8_tflops <= 0:
            raise PerfConfigError(
                f"INT8 W8A8 needs INT8 tensor cores, which {hardware.name} does not have "
                "(vLLM has no fallback for it); use fp8, awq/gptq, or no quantization"
            )
        return WeightFormat("int8-w8a8", 1.0, "int8")
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "w4a16"):
        return WeightFormat("w4a16", _W4_GROUP_BYTES_PER_PARAM, "bf16")
    if method in _FP4_BYTES_PER_PARAM:
        if hardware.fp4_tflops > 0:
            note = (
                "" if method == "nvfp4" else "MXFP4 weights x MXFP8 activations on Blackwell tensor cores: the FP8 rate"
            )
            return WeightFormat(method, _FP4_BYTES_PER_PARAM[method], _FP4_COMPUTE[method], note=note)
        return WeightFormat(
            f"{method}-weight-only",
            _FP4_BYTES_PER_PARAM[method],
            "bf16",
            note=f"{hardware.name} has no FP4 tensor cores: vLLM dequantizes {method} weights in a W4A16 kernel, "
            f"computing in bf16",
        )
    raise PerfConfigError(
        f"quantization {quantization!r} is not modelled; supported: none (bf16/fp16), fp8, int8 (W8A8), awq, gptq "
        f"(W4A16), "
        "mxfp4, nvfp4"
    )


def non_expert_weight_format(quantization: str | None, model: ModelSpec, hardware: Hardware) -> WeightFormat:
    """The format of the weights outside the routed experts: the model dtype when the checkpoint quantizes only its
    experts (gpt-oss), whether `--quantization` is left out or names the checkpoint's own method (vLLM then loads the
    same checkpoint the same way), else the same as `weight_format`."""
    if model.quantized_experts_only and quantization in (None, model.quantization):
        return weight_format("none", model, hardware)
    return weight_format(quantization, model, hardware)


_KV_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2}


def kv_bytes_per_element(kv_cache_dtype: str, model: ModelSpec) -> int:
    """Bytes per cached K or V element: `auto` keeps the model dtype, fp8 halves bf16."""
    if kv_cache_dtype == "auto":
        return model.dtype_bytes
    try:
        return _KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        raise PerfConfigError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not modelled; supported: auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16, "
            f"float16"
        ) from None
