"""Which device a Translator runs on: CUDA where onnxruntime can run its provider here, else the CPU, and the
providers that device gets."""

from __future__ import annotations

import ctypes
import os

from .ort_install import import_onnxruntime

ort = import_onnxruntime()  # names a missing or doubly installed onnxruntime, with the fix

DEVICES = ("auto", "cuda", "cpu")


def cuda_usable() -> tuple[bool, str]:
    """Tells whether onnxruntime can run its CUDA provider here (a CUDA build and an NVIDIA driver).

    Returns:
        (usable, why not): why is "" when usable.
    """
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, f"this onnxruntime ({ort.__version__}) has no CUDA provider; install onnxruntime-gpu"
    try:
        ctypes.CDLL("libcuda.so.1" if os.name != "nt" else "nvcuda.dll")
    except OSError:
        return False, "no NVIDIA driver found (libcuda could not be loaded): this machine has no usable GPU"
    return True, ""


def pick_device(device: str) -> tuple[str, str]:
    """Picks the device a Translator asked for `device` runs on, and why.

    Args:
        device: "auto" (CUDA where onnxruntime can run it, else the CPU), "cuda" or "cpu".

    Returns:
        ("cuda" or "cpu", the reason in words).

    Raises:
        ValueError: device is none of DEVICES.
        RuntimeError: device="cuda" where CUDA cannot run (the message says why).
    """
    if device not in DEVICES:
        raise ValueError(f"device={device!r}; choose 'auto', 'cuda' or 'cpu'")
    if device == "cpu":
        return "cpu", "asked for the CPU"
    usable, why = cuda_usable()
    if usable:
        if hasattr(ort, "preload_dlls"):
            try:
                ort.preload_dlls()
            except Exception:  # older wheels or CUDA libraries found another way
                pass
        return "cuda", "onnxruntime's CUDA provider"
    if device == "cuda":
        raise RuntimeError(f"device='cuda' cannot run: {why}; use device='cpu' or 'auto'")
    return "cpu", why


def providers_for(device: str, tf32: bool = False) -> list:
    """Returns onnxruntime's providers for a device picked by pick_device, in order of preference.

    onnxruntime's CUDA provider lets cuBLAS use TF32 for float32 products on Ampere and later unless told
    otherwise: a 10-bit mantissa, 3e-3 off the CPU in the Tatoeba model's encoder outputs on an H100 and
    one greedy sentence in 500 different from PyTorch (PyTorch's own default is full float32 products).
    A float32 bundle is meant to compute what was trained, so TF32 is off unless asked for.

    Args:
        device: "cuda" (CUDA, then the CPU) or "cpu".
        tf32: allow TF32 products on CUDA (SessionTuning.tf32).
    """
    if device != "cuda":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0"}), "CPUExecutionProvider"]
