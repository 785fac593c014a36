"""The one error type users see. Torch-free, imported by every layer.

A `SpectraceError` is a problem with the user's input (an option, a file, a checkpoint): the
CLI prints its message as one line on stderr and exits with code 2, never a traceback.
"""


class SpectraceError(Exception):
    """A problem with the user's input, said in one line."""
