"""Checkpoint -> bundle (two ONNX graphs + bundle.json), parity checks, and the `seq2onnx` CLI.

Kept free of top-level torch imports so that `seq2onnx translate` works on a runtime-only install;
the torch-side modules are imported by the commands that need them.
"""


def needs_torch(command: str) -> None:
    """Raises seq2onnx.runtime.cli.CommandError naming the install command when torch is missing (or
    cannot load: a broken install is as missing as an absent one, and the command imports it next)."""
    from seq2onnx.runtime.cli import CommandError

    try:
        import torch  # noqa: F401
    except ImportError:
        raise CommandError(
            f"`seq2onnx {command}` needs PyTorch, which this install lacks: pip install 'seq2onnx[train,cpu]' "
            "(or 'seq2onnx[train,gpu]' on a CUDA machine)"
        ) from None
