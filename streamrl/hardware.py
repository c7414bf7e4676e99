"""What this machine computes fast: the compute dtype by capability (docs/design.md §5b).

CPUs differ: one with AVX512-BF16/AMX runs bf16 matmuls through oneDNN as fast as fp32 or
faster; an AVX2-only CPU (``torch.backends.cpu.get_cpu_capability() == "AVX2"``, oneDNN bf16
unsupported) falls to ATen's reference GEMM, where SmolLM2's forward + backward took 170 s in
bf16 against 10 s in fp32. So ``compute_dtype: auto`` asks instead of assuming.

Example: ``resolve_compute_dtype("auto", "cpu", bf16_fast=False) == "float32"``;
``resolve_compute_dtype("auto", "cuda:0") == "bfloat16"``.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_bf16_is_fast() -> bool:
    """True if oneDNN runs bf16 matmuls on this CPU (AVX512-BF16, AMX or newer)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def resolve_compute_dtype(requested: str, device: str, *, bf16_fast: bool | None = None) -> str:
    """``auto`` -> ``bfloat16`` on CUDA and on CPUs where bf16 is fast, else ``float32``;
    an explicit ``float32``/``bfloat16`` is kept. ``bf16_fast`` overrides the CPU probe."""
    if requested != "auto":
        return requested
    if torch.device(device).type == "cuda":
        return "bfloat16"
    fast = cpu_bf16_is_fast() if bf16_fast is None else bf16_fast
    return "bfloat16" if fast else "float32"


def cpu_description() -> str:
    """``"AMD EPYC (AVX512, oneDNN bf16: yes)"``: what to quote next to a CPU figure."""
    model = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{model} ({capability}, oneDNN bf16: {'yes' if cpu_bf16_is_fast() else 'no'})"


def describe_choice(chosen: str, requested: str, device: str) -> str:
    """One log line: the dtype ``chosen`` (``resolve_compute_dtype``'s answer, resolved once
    per role) and why."""
    where = torch.device(device).type
    reason = "CUDA" if where == "cuda" else cpu_description()
    return f"compute dtype {chosen} ({requested}; {reason})"
