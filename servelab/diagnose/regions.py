"""Which GPUs a team can buy or rent where it is, so that "a bigger chip" names one it can get.

US export rules (October 2022, tightened October 2023) keep the H100, H200,
A100, L40S, RTX 4090 and MI300X out of China; the parts sold there instead
are the H20 and L20 (and, until the 2023 rule, the A800 and H800, which
Chinese clouds still rent). An alternative that names an H100 to a team in
Shanghai is no alternative. The rules change; the region's list says when it
was read.
"""

from __future__ import annotations

from enum import StrEnum


class Region(StrEnum):
    GLOBAL = "global"
    CHINA = "china"


UPGRADES: dict[Region, dict[str, tuple[str, ...]]] = {
    Region.GLOBAL: {
        "A100-40GB-SXM": ("h100",),
        "A100-80GB-SXM": ("h100",),
        "A100-80GB-PCIe": ("h100",),
        "H100-SXM": ("h200",),
        "H100-PCIe": ("h100",),
        "L4": ("l40s",),
        "A10G": ("l40s",),
        "L40S": ("h100",),
        "RTX-4090": ("l40s",),
        "H20": ("h200",),
        "A800-80GB-SXM": ("h100",),
        "A800-80GB-PCIe": ("h100",),
        "H800-SXM": ("h200",),
        "H800-PCIe": ("h100",),
        "L20": ("l40s",),
    },
    Region.CHINA: {
        "A100-40GB-SXM": ("h20", "h800"),
        "A100-80GB-SXM": ("h20", "h800"),
        "A100-80GB-PCIe": ("h20", "h800-pcie"),
        "A800-80GB-SXM": ("h20", "h800"),
        "A800-80GB-PCIe": ("h20", "h800-pcie"),
        "L4": ("l20",),
        "A10G": ("l20",),
        "L20": ("h20",),
        "H800-PCIe": ("h20", "h800"),
        "RTX-4090": ("l20",),
        "L40S": ("h20",),
        "H100-PCIe": ("h20",),
        "H100-SXM": ("h20",),
    },
}
"""The next chips up a user would get for each common one, per region (China: as of the October 2023 US rules;
H800s and A800s only as rented or second-hand capacity)."""
REGION_NOTE = {
    Region.GLOBAL: "anywhere H100s and H200s can be bought or rented (not China: --region china offers H20, H800, L20)",
    Region.CHINA: (
        "China: H20 and L20 are sold new, H800 and A800 rented from Chinese clouds (US export rules of "
        "October 2023; check the current ones before buying)"
    ),
}


def upgrades(gpu: str, region: Region | None) -> tuple[str, ...]:
    """Catalogue names of the chips to price instead of `gpu` where the user is (None: global, assumed and said)."""
    return UPGRADES[region or Region.GLOBAL].get(gpu, ())
