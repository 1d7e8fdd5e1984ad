"""`picasso doctor`: what this machine offers (torch build, backends, GPUs, native kernels)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "doctor", parents=[common], help="report torch build, backends, GPUs and native kernels"
    )
    p.add_argument(
        "--no-build",
        action="store_true",
        help="do not build/load the native kernels, only report whether they are already cached",
    )
    p.set_defaults(func=run)


def _collect(load_native: bool = True) -> dict[str, Any]:
    """Everything doctor reports, as a JSON-ready dict."""
    import os
    import platform
    import shutil

    import torch
    import torch.distributed as dist

    from csrc import build
    from executor.sparse import kernels

    cuda_available = torch.cuda.is_available()
    gpus = []
    if cuda_available:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append(
                {
                    "index": i,
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    backends = {"distributed": dist.is_available()}
    if dist.is_available():
        backends.update(
            gloo=dist.is_gloo_available(),
            nccl=dist.is_nccl_available(),
            mpi=dist.is_mpi_available(),
        )
    if load_native:
        kernels.load_native(warn=False)
    native = kernels.native_status()
    native["build_dir"] = str(build.build_dir())
    native["cached"] = any(build.build_dir().glob("*.so"))
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": {
            "version": torch.__version__,
            "build": f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU",
            "threads": torch.get_num_threads(),
            "cuda_available": cuda_available,
        },
        "backends": backends,
        "gpus": gpus,
        "toolchain": {
            "c++": shutil.which("c++") or shutil.which("g++"),
            "ninja": shutil.which("ninja"),
            "triton": _version("triton"),  # the GPU's embedding kernels (executor/sparse)
        },
        "native": native,
    }


def _version(package: str) -> str | None:
    """An installed package's version, without importing it (a broken install cannot crash doctor)."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _render(info: dict[str, Any]) -> str:
    t = info["torch"]
    lines = [
        f"python    {info['python']} on {info['platform']} ({info['cpu_count']} CPUs)",
        f"torch     {t['version']} ({t['build']} build, {t['threads']} threads)",
    ]
    b = info["backends"]
    if b.get("distributed"):
        names = [n for n in ("gloo", "nccl", "mpi") if b.get(n)]
        lines.append(f"backends  {', '.join(names) or 'none'}")
    else:
        lines.append("backends  torch.distributed not available")
    if info["gpus"]:
        for g in info["gpus"]:
            lines.append(f"gpu {g['index']}     {g['name']} ({g['memory_gib']} GiB, sm {g['capability']})")
    else:
        lines.append("gpus      none")
    tools = info["toolchain"]
    lines.append("toolchain " + ", ".join(f"{k}: {v or 'missing'}" for k, v in tools.items()))
    n = info["native"]
    if n["active"]:
        lines.append(f"native    loaded (CPU kernels) from {n['path']}")
    elif n["loaded"]:
        lines.append(f"native    loaded but not active (reference path selected) from {n['path']}")
    else:
        cached = "cached build present" if n["cached"] else "no cached build"
        lines.append(f"native    not loaded: {n['reason']} ({cached} in {n['build_dir']})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    info = _collect(load_native=not args.no_build)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(_render(info))
    return 0
