"""Errors meant for the user and the `seq2onnx` command's exit codes, in one leaf module.

Any layer may raise CommandError (the commands print it as one line with exit status 1) without
importing a command: this module imports nothing of the package.
"""

from __future__ import annotations

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CommandError(Exception):
    """An error meant for the user: printed as one line, exit status EXIT_FAIL."""


def needs_torch(command: str) -> None:
    """Raises CommandError naming the install command when torch is missing.

    A broken install is as missing as an absent one, and the command imports torch next.

    Args:
        command: the `seq2onnx` command that needs torch, for the message.

    Raises:
        CommandError: torch cannot be imported.
    """
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CommandError(
            f"`seq2onnx {command}` needs PyTorch, which this install lacks: pip install "
            "'seq2onnx[train,cpu]' "
            "(or 'seq2onnx[train,gpu]' on a CUDA machine)"
        ) from None
