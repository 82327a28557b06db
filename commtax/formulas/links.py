"""Link presets (alpha, bandwidth) with their sources, and measured links from Lab 03.

Convention: ``bandwidth`` is bytes per second **per GPU, per direction**.
Vendors often quote the sum of both directions: NVIDIA's "900 GB/s NVLink"
for the H100 SXM is 18 links x 25 GB/s x 2 directions, i.e. 450 GB/s each
way, and 450e9 is what the formulas need. Network ports are quoted in bits:
400 Gb/s InfiniBand NDR is 50 GB/s each way.

``alpha`` is the fixed cost of one message (one step of an algorithm):
hardware latency plus the software that launches and completes the transfer.
It depends on the library and the message path far more than bandwidth does,
so the presets are orders of magnitude to reason with. Measure your own link
with Lab 03, which writes a JSON file that every calculator offers as a
"measured" preset. This module reads measured links from the folder it is
given (:func:`measured_links`); it knows no course folder. The course's
calculators pass Lab 03's ``calibrations/`` (:mod:`commtax.ui.calibrations`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from commtax.checks import require_nonnegative, require_positive


@dataclass(frozen=True)
class Link:
    """A link in the alpha-beta model. alpha in seconds, bandwidth in bytes/s per direction."""

    name: str
    alpha: float
    bandwidth: float
    source: str = ""

    def __post_init__(self):
        require_nonnegative("alpha", self.alpha, "s")
        require_positive("bandwidth", self.bandwidth, "bytes/s")

    @property
    def crossover_bytes(self) -> float:
        """n* = alpha * bandwidth: below it latency dominates a message, above it bandwidth."""
        # BEGIN GRADED lab-01 crossover_bytes
        return self.alpha * self.bandwidth
        # END GRADED: return learner.lab("01").crossover_bytes(self.alpha, self.bandwidth)


NVLINK4 = Link(
    "NVLink 4 (H100 SXM)",
    alpha=3e-6,
    bandwidth=450e9,
    source="bandwidth: NVIDIA H100 datasheet, 900 GB/s NVLink = 450 GB/s per direction; "
    "alpha: ~3 µs per hop, an assumed order of magnitude with the collective library's software "
    "overhead included (Lab 03 measures yours)",
)
INFINIBAND_NDR = Link(
    "InfiniBand NDR (400 Gb/s per GPU)",
    alpha=5e-6,
    bandwidth=50e9,
    source="bandwidth: NVIDIA ConnectX-7 / IBTA NDR, 400 Gb/s per port = 50 GB/s per direction, one "
    "NIC per GPU as in a DGX H100; alpha: 2-5 µs per message through NIC and switch (an assumed range; Lab 03 measures yours), "
    "upper end taken to include the collective library",
)
ROCE_100G = Link(
    "100GbE RoCE",
    alpha=5e-6,
    bandwidth=12.5e9,
    source="bandwidth: 100 Gb/s = 12.5 GB/s per direction; alpha: ~5 µs (assumed, as for InfiniBand; Lab 03 measures yours)",
)
TCP_10G = Link(
    "TCP over 10 GbE",
    alpha=50e-6,
    bandwidth=1.25e9,
    source="bandwidth: 10 Gb/s = 1.25 GB/s per direction; alpha: ~50 µs through the kernel's TCP "
    "stack (an assumed order of magnitude; Lab 03 measures yours)",
)

# What NCCL's rings reach, measured, beside the line rates above (the ceiling). A ring all-reduce's bus
# bandwidth (nccl-tests' busbw) inside an 8-GPU NVSwitch node stays ~20% under the NVLink line rate:
# NCCL's protocol moves 128-byte payloads per SM transaction, and other limits in the GPU cap it.
NVLINK4_RING = Link(
    "NVLink 4 ring, measured (H100 SXM)",
    alpha=3e-6,
    bandwidth=370e9,
    source="NVIDIA/nccl-tests issue 212 (S. Jeaugey, NVIDIA, 2024): '450GB/s is the line rate. With the "
    "protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s' (busbw with "
    "NCCL_ALGO=RING and for non-all-reduce collectives; NVLink SHARP all-reduce reaches ~480 GB/s); "
    "NVIDIA/nccl issue 1455: 365-370 GB/s ring busbw on 2-8 H100s",
)
NVLINK3_RING = Link(
    "NVLink 3 ring, measured (A100 SXM)",
    alpha=3e-6,
    bandwidth=230e9,
    source="NVIDIA/nccl-tests issue 149 (S. Jeaugey, NVIDIA, 2023): 12 NVLinks x 25 GB/s line rate, ~20 GB/s "
    "each effective with 128-byte payloads, 'some other bottlenecks on the GPUs limits it to ~230GB/s'",
)
INFINIBAND_NDR_MEASURED = Link(
    "InfiniBand NDR, measured (400 Gb/s per GPU)",
    alpha=5e-6,
    bandwidth=47e9,
    source="NVIDIA/nccl-tests issue 290 (NVIDIA engineer, 2025): 'for NDR @ 400Gbps you should see 46-48GB/s "
    "per NIC' (line rate 50 GB/s)",
)
INFINIBAND_HDR_MEASURED = Link(
    "InfiniBand HDR, measured (200 Gb/s per GPU)",
    alpha=5e-6,
    bandwidth=24e9,
    source="NVIDIA/nccl issue 812 (NVIDIA engineer): 'On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards "
    "and we measure 192GB/s AllReduce BusBW', 24 GB/s per NIC (line rate 25 GB/s)",
)

PRESETS: dict[str, Link] = {
    link.name: link
    for link in (
        NVLINK4,
        INFINIBAND_NDR,
        ROCE_100G,
        TCP_10G,
        NVLINK4_RING,
        NVLINK3_RING,
        INFINIBAND_NDR_MEASURED,
        INFINIBAND_HDR_MEASURED,
    )
}


def save_calibration(path, *, alpha: float, bandwidth: float, name: str, **details) -> Path:
    """Write a measured link as JSON (what Lab 03's benchmark does with ``--out``)."""
    link = Link(name, float(alpha), float(bandwidth), source=details.pop("source", "measured"))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "name": link.name,
        "alpha_s": link.alpha,
        "bandwidth_bytes_per_s": link.bandwidth,
        "source": link.source,
        **details,
    }
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def load_calibration(path) -> Link:
    """Read a measured link written by :func:`save_calibration`; ValueError if it is malformed."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
        alpha = float(record["alpha_s"])
        bandwidth = float(record["bandwidth_bytes_per_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"path {path} is not a link calibration file: {exc}") from exc
    name = str(record.get("name") or path.stem)
    return Link(f"measured: {name}", alpha, bandwidth, source=str(record.get("source", f"measured ({path.name})")))


def measured_links(folder) -> dict[str, Link]:
    """Every readable calibration file (``*.json``) in ``folder`` (unreadable ones are skipped; none if the
    folder does not exist). The course's folder is :func:`commtax.ui.calibrations.calibration_folder`."""
    links = {}
    folder = Path(folder)
    if folder.is_dir():
        for path in sorted(folder.glob("*.json")):
            try:
                link = load_calibration(path)
            except ValueError:
                continue
            links[link.name] = link
    return links


def available_links(folder=None) -> dict[str, Link]:
    """The presets plus the measured links in ``folder`` (the presets alone when it is None)."""
    return {**PRESETS, **(measured_links(folder) if folder is not None else {})}
