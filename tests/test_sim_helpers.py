"""Shared toy hardware for simulator tests: round numbers so known answers are easy to write."""

from __future__ import annotations

from simulator.hardware import HardwareSpec


def toy_hw(nodes: int = 1, gpus_per_node: int = 8, launch_us: float = 0.0, nic_per: str = "gpu",
           **over) -> HardwareSpec:
    """Rates in bytes (or FLOPs) per microsecond: compute 1e6, hbm 1e6, pcie 1e4, intra 1e5, nic 1e4."""
    d = {
        "name": "toy", "kind": "gpu", "nodes": nodes, "gpus_per_node": gpus_per_node,
        "gpu": {"hbm_bytes": 1e12, "hbm_bw": 1e12, "flops": {"fp32": 1e12, "fp16": 4e12},
                "launch_us": launch_us, "streams": 4},
        "host": {"dram_bytes": 1e12, "dram_bw": 1e10 * gpus_per_node},
        "pcie_bw": 1e10, "nvlink_bw": 1e11, "nic_bw": 1e10 if nic_per == "gpu" else 1e10 * gpus_per_node,
        "nic_per": nic_per, "nic_latency_us": 5.0, "intra_latency_us": 2.0, "efficiency": {},
    }
    d.update(over)
    return HardwareSpec.from_dict(d)
