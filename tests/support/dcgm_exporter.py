"""A stand-in for dcgm-exporter: its /metrics exposition for two A100s, served over HTTP on loopback.

No GPU and no DCGM can exist where the tests run; the exporter's output
(its default counters plus the profiling fields, with the labels
dcgm-exporter 3.x/4.x puts on every sample) is the library boundary.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_LABELS = (
    'gpu="{i}",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e5{i}",pci_bus_id="00000000:0{i}:00.0",'
    'device="nvidia{i}",modelName="NVIDIA A100-SXM4-80GB",Hostname="gpu-node-1",'
    'DCGM_FI_DRIVER_VERSION="535.104.05"'
)


def _family(name: str, kind: str, help_text: str, values: tuple[str, str]) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{{{_LABELS.format(i=i)}}} {v}" for i, v in enumerate(values)]
    return "\n".join(lines)


DCGM_EXPOSITION = (
    "\n".join(
        [
            _family("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", ("1410", "210")),
            _family("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", ("1593", "1593")),
            _family("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", ("9223372036854775794", "41")),
            _family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", ("67", "33")),
            _family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", ("312.507", "61.2")),
            _family(
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "counter",
                "Total energy consumption since boot (in mJ).",
                ("1218290373", "93482911"),
            ),
            _family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", ("0", "0")),
            _family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", ("97", "0")),
            _family("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", ("38", "0")),
            _family("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", ("0", "0")),
            _family("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", ("0", "0")),
            _family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", ("0", "0")),
            _family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", ("1043", "80627")),
            _family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", ("79584", "0")),
            _family(
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                "counter",
                "Total number of NVLink bandwidth counters for all lanes.",
                ("0", "0"),
            ),
            _family("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", ("0", "0")),
            _family(
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "counter",
                "Number of remapped rows for uncorrectable errors",
                ("0", "0"),
            ),
            _family(
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                "gauge",
                "Ratio of time the graphics engine is active (in %).",
                ("0.953105", "0.000000"),
            ),
            _family(
                "DCGM_FI_PROF_SM_ACTIVE",
                "gauge",
                "The ratio of cycles an SM has at least 1 warp assigned (in %).",
                ("0.412000", "0.000000"),
            ),
            _family(
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                "gauge",
                "Ratio of cycles the tensor (HMMA) pipe is active (in %).",
                ("0.187330", "0.000000"),
            ),
            _family(
                "DCGM_FI_PROF_DRAM_ACTIVE",
                "gauge",
                "Ratio of cycles the device memory interface is active sending or receiving data (in %).",
                ("0.641200", "0.000000"),
            ),
        ]
    )
    + "\n"
)
"""dcgm-exporter's /metrics for two A100s, one serving and one idle; GPU 0's memory temperature is DCGM's blank."""


class _Exporter(BaseHTTPRequestHandler):
    """Serves DCGM_EXPOSITION at /metrics and 404 elsewhere, as a stand-in for dcgm-exporter on :9400."""

    def do_GET(self) -> None:
        body = DCGM_EXPOSITION.encode() if self.path == "/metrics" else b"not found"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def dcgm_exporter() -> Iterator[str]:
    """The exporter's root URL (its metrics at /metrics) while the context is open."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
