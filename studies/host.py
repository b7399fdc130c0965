"""What the studies print about the machine they ran on (imported by the scripts beside it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def machine() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else the architecture), its cores and torch's version."""
    cpu = Path("/proc/cpuinfo")
    lines = cpu.read_text().splitlines() if cpu.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
