"""The exceptions of the flashlab package.

Every failure is a FlashlabError. The kinds a caller can fix are also the built-in exceptions
Python code expects: a bad argument is a ValueError (FlashlabValueError; UNSUPPORTED, a valid
problem this device, dtype or build cannot run, is one too) or a TypeError (FlashlabTypeError);
a failed allocation is a MemoryError; a CUDA failure or a library bug is a RuntimeError. The
message names the argument or field, its value and the limit, and ends with a hint; for an error
of the C library it is the library's own message, prefixed with the call that failed.
"""

from typing import Optional


class FlashlabError(Exception):
    """Base of every flashlab exception.

    Attributes:
        status: the C library's status name (e.g. ``"FLASHLAB_ERROR_UNSUPPORTED"``), or None for
            an error found in Python before any call.
        hint: what to do about it, or None.
    """

    def __init__(self, message: str, *, hint: Optional[str] = None, status: Optional[str] = None):
        text = message if hint is None or "hint:" in message else f"{message}\nhint: {hint}"
        super().__init__(text)
        self.hint = hint
        self.status = status


class FlashlabValueError(FlashlabError, ValueError):
    """A bad shape, size, value or layout (also: valid but unsupported on this device or build)."""


class FlashlabUnsupportedError(FlashlabValueError):
    """A valid problem that this device, dtype or build does not run (FLASHLAB_ERROR_UNSUPPORTED)."""


class FlashlabTypeError(FlashlabError, TypeError):
    """An argument of the wrong type or dtype, or arrays of mixed kinds or devices."""


class FlashlabCudaError(FlashlabError, RuntimeError):
    """A CUDA runtime call failed (FLASHLAB_ERROR_CUDA)."""


class FlashlabOutOfMemoryError(FlashlabError, MemoryError):
    """An allocation failed (FLASHLAB_ERROR_OUT_OF_MEMORY)."""


class FlashlabInternalError(FlashlabError, RuntimeError):
    """A bug in flashlab (FLASHLAB_ERROR_INTERNAL): please report the message."""


class FlashlabLibraryError(FlashlabError, RuntimeError):
    """libflashlab.so could not be found or loaded, or is of another ABI version."""


_BY_STATUS = {
    1: FlashlabValueError,
    2: FlashlabUnsupportedError,
    3: FlashlabCudaError,
    4: FlashlabOutOfMemoryError,
    5: FlashlabInternalError,
}


def error_for_status(status: int, name: str, call: str, message: str) -> FlashlabError:
    """The exception for a failed C call: `call` is the function, `message` flashlab_last_error()."""
    cls = _BY_STATUS.get(status, FlashlabInternalError)
    text = message.strip() or f"{name or status} without a message"
    if not text.startswith(call + ":"):  # the library names the function itself; older messages may not
        text = f"{call}: {text}"
    return cls(text, status=name or str(status))
