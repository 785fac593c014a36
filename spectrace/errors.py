"""The one error type users see. Torch-free, imported by every layer.

A `SpectraceError` is a problem with the user's input (an option, a file, a checkpoint): the
CLI prints its message as one line on stderr and exits with code 2, never a traceback. So does
torch's out-of-memory error (a model or a batch too large for the device), whose own message is
one line; a trace keeps every step finished before it.
"""
import sys


class SpectraceError(Exception):
    """A problem with the user's input, said in one line."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C after a run's trace was begun: `trace_path` holds every step finished so far."""

    def __init__(self, trace_path):
        super().__init__(str(trace_path))
        self.trace_path = trace_path


def device_memory_errors() -> tuple[type, ...]:
    """torch's out-of-memory error, where torch is loaded (read when an error is being matched, so
    the CLI need not import torch to catch it)."""
    torch = sys.modules.get("torch")
    return (torch.OutOfMemoryError,) if torch is not None and hasattr(torch, "OutOfMemoryError") else ()


def first_line(e: Exception) -> str:
    """An exception's message in one line (its repr where it has none), for a one-line error."""
    return str(e).splitlines()[0] if str(e) else repr(e)
