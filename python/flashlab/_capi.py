"""ctypes declarations of flashlab's C ABI (capi/include/flashlab.h) and the library loader.

Everything the package does goes through the functions declared here: one call into
``libflashlab.so`` per operation, no algorithm in Python. The structs mirror the header field by
field (the header only ever appends fields, and every struct starts with its own size, so a
library newer than this file still reads these structs correctly).

The library is looked for, in order:

1. ``FLASHLAB_LIBRARY``: a path to ``libflashlab.so`` or to the folder that holds it;
2. beside the package (``flashlab/libflashlab.so``, where an install copies it);
3. the build folders of the checkout this package sits in: ``build/cuda`` (the CUDA kernels and
   the CPU reference), then ``build/cpu`` (the CPU reference only), each in the folders where
   CMake puts the library.

It is loaded on first use, not at ``import flashlab``, so the package imports without it; the
first call that needs it raises FlashlabLibraryError listing every place it looked and how to
build it.
"""

import ctypes
import os
import threading
from pathlib import Path
from typing import List, Optional

from .errors import (
    FlashlabError,
    FlashlabLibraryError,
    error_for_status,
)

#: The ABI this file declares (FLASHLAB_ABI_VERSION of the header it mirrors).
ABI_VERSION = 1
#: The additions within it this file declares (FLASHLAB_ABI_MINOR): the attention problem's window
#: and packed-sequence fields, the STREAM trace's workspace query (1); the attention call struct
#: and its two entries (2); the context-parallel ring, flashlab_ring_* (3).
ABI_MINOR = 3

# flashlab_status
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_UNSUPPORTED = 2
ERROR_CUDA = 3
ERROR_OUT_OF_MEMORY = 4
ERROR_INTERNAL = 5

# flashlab_device
DEVICE_CPU = 0
DEVICE_CUDA = 1

# flashlab_dtype
DTYPE_F32 = 0
DTYPE_F64 = 1
DTYPE_BF16 = 2
DTYPE_F16 = 3

_c_int64_3 = ctypes.c_int64 * 3


class Tensor(ctypes.Structure):
    """flashlab_tensor: a pointer and the element strides of the three leading dimensions."""

    _fields_ = [("data", ctypes.c_void_p), ("stride", _c_int64_3)]


class AttentionProblem(ctypes.Structure):
    """flashlab_attention_problem."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("batch", ctypes.c_int64),
        ("seq_q", ctypes.c_int64),
        ("seq_k", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("scale", ctypes.c_double),
        ("causal", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("deterministic", ctypes.c_int),
        # ABI minor 1
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
    ]


def _tensor_fields(name: str):
    """flashlab_tensor `name` spelled out as two fields, `name` (the data pointer) and
    `name_stride`: the same bytes as the nested struct (a pointer and three int64, alignment 8), but
    a pointer is then set with one attribute store instead of fetching the nested struct first."""
    return [(name, ctypes.c_void_p), (name + "_stride", _c_int64_3)]


class AttentionCall(ctypes.Structure):
    """flashlab_attention_call (ABI minor 2), its flashlab_tensor members spelled out."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("problem", ctypes.c_void_p),
        ("device", ctypes.c_int),
        *_tensor_fields("q"),
        *_tensor_fields("k"),
        *_tensor_fields("v"),
        *_tensor_fields("o"),
        ("lse", ctypes.c_void_p),
        *_tensor_fields("d_o"),
        *_tensor_fields("dq"),
        *_tensor_fields("dk"),
        *_tensor_fields("dv"),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("stream", ctypes.c_void_p),
    ]

    def __init__(self, device: int = 0):
        super().__init__()
        self.struct_size = ctypes.sizeof(AttentionCall)
        self.device = device


class MtaProblem(ctypes.Structure):
    """flashlab_mta_problem."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("batch", ctypes.c_int64),
        ("seq", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("cq", ctypes.c_int64),
        ("ck", ctypes.c_int64),
        ("scale", ctypes.c_double),
        ("dtype", ctypes.c_int),
    ]


class StreamProblem(ctypes.Structure):
    """flashlab_stream_problem."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("tokens", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("block_q", ctypes.c_int64),
        ("block_k", ctypes.c_int64),
        ("k_blocks", ctypes.c_int64),
        ("dtype", ctypes.c_int),
        ("mask", ctypes.c_void_p),
    ]


class StreamEdge(ctypes.Structure):
    """flashlab_stream_edge: 24 bytes, three int32 then three float."""

    _fields_ = [
        ("q", ctypes.c_int32),
        ("r", ctypes.c_int32),
        ("slot", ctypes.c_int32),
        ("score", ctypes.c_float),
        ("mass", ctypes.c_float),
        ("value_norm", ctypes.c_float),
    ]


_P = ctypes.c_void_p
_I = ctypes.c_int
_SZ = ctypes.c_size_t
_SZP = ctypes.POINTER(ctypes.c_size_t)
_T = Tensor

# name: (restype, argtypes). Enums travel as int; pointers the package owns as void*.
_SIGNATURES = {
    "flashlab_abi_version": (_I, []),
    "flashlab_version": (ctypes.c_char_p, []),
    "flashlab_has_cuda": (_I, []),
    "flashlab_last_error": (ctypes.c_char_p, []),
    "flashlab_status_name": (ctypes.c_char_p, [_I]),
    "flashlab_attention_defaults": (AttentionProblem, []),
    "flashlab_attention_check": (_I, [_P, _I]),
    "flashlab_attention_forward_workspace_size": (_I, [_P, _I, _SZP]),
    "flashlab_attention_forward": (_I, [_P, _I, _T, _T, _T, _T, _P, _P, _SZ, _P]),
    "flashlab_attention_backward_workspace_size": (_I, [_P, _I, _SZP]),
    "flashlab_attention_backward": (_I, [_P, _I, _T, _T, _T, _T, _P, _T, _T, _T, _T, _P, _SZ, _P]),
    # The struct itself is passed (ctypes passes its address): no conversion of an integer.
    "flashlab_attention_forward_call": (_I, [ctypes.POINTER(AttentionCall)]),
    "flashlab_attention_backward_call": (_I, [ctypes.POINTER(AttentionCall)]),
    "flashlab_has_ring": (_I, []),
    "flashlab_ring_unique_id": (_I, [_P]),
    "flashlab_ring_create": (_I, [_P, _I, _I, ctypes.POINTER(ctypes.c_void_p)]),
    "flashlab_ring_destroy": (_I, [_P]),
    "flashlab_ring_workspace_size": (_I, [_P, _I, _I, _I, _SZP]),
    "flashlab_ring_forward": (_I, [_P, _I, _P, _P, _P, _P, _P, _P, _P, _SZ, _P]),
    "flashlab_ring_backward": (_I, [_P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _SZ, _P]),
    "flashlab_mta_defaults": (MtaProblem, []),
    "flashlab_mta_forward_workspace_size": (_I, [_P, _I, _SZP]),
    "flashlab_mta_forward": (_I, [_P, _I, _T, _T, _T, _P, _T, _P, _P, _SZ, _P]),
    "flashlab_mta_backward_workspace_size": (_I, [_P, _I, _SZP]),
    "flashlab_mta_backward": (_I, [_P, _I, _T, _T, _T, _P, _T, _P, _T, _T, _T, _T, _P, _P, _SZ, _P]),
    "flashlab_mta_decode_workspace_size": (_I, [_P, _I, _SZP]),
    "flashlab_mta_decode": (_I, [_P, _I, _T, _T, _T, _P, _T, _P, _SZ, _P]),
    "flashlab_stream_defaults": (StreamProblem, []),
    "flashlab_stream_query_blocks": (_I, [_P, ctypes.POINTER(ctypes.c_int64)]),
    "flashlab_stream_estimate_workspace_size": (_I, [_P, _I, _SZP]),
    "flashlab_stream_estimate": (_I, [_P, _I, _T, _T, _P, _P, _SZ, _P]),
    "flashlab_stream_apply_workspace_size": (_I, [_P, _I, _SZP]),
    "flashlab_stream_apply": (_I, [_P, _I, _T, _T, _T, _P, _T, _P, _SZ, _P]),
    "flashlab_stream_trace_workspace_size": (_I, [_P, _I, _SZP]),
    "flashlab_stream_trace": (_I, [_P, _I, _T, _T, _T, _P, _T, _P, _P, _SZ, _P]),
}

LIBRARY_NAME = "libflashlab.so"
_BUILD_PRESETS = ("cuda", "cpu")
# Where CMake may put the library inside one build folder.
_BUILD_SUBDIRS = ("capi",)


def candidate_paths() -> List[Path]:
    """Every path the loader tries, in order (FLASHLAB_LIBRARY first when it is set)."""
    paths: List[Path] = []
    env = os.environ.get("FLASHLAB_LIBRARY")
    if env:
        p = Path(env)
        paths.append(p / LIBRARY_NAME if p.is_dir() else p)
        return paths  # an explicit choice is never second-guessed
    here = Path(__file__).resolve().parent
    paths.append(here / LIBRARY_NAME)
    checkout = here.parent.parent  # python/flashlab -> the repository root
    for preset in _BUILD_PRESETS:
        for sub in _BUILD_SUBDIRS:
            paths.append((checkout / "build" / preset / sub / LIBRARY_NAME).resolve())
    return paths


class Library:
    """The loaded library with its functions declared; one per process (see lib())."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._dll = ctypes.CDLL(str(path))
        except OSError as e:
            raise FlashlabLibraryError(
                f"{path}: cannot be loaded: {e}",
                hint="rebuild it (`cmake --build --preset cpu --target flashlab_capi`) or point "
                "FLASHLAB_LIBRARY at a working libflashlab.so",
            ) from None
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(self._dll, name)
            except AttributeError:
                raise FlashlabLibraryError(
                    f"{path}: does not export {name}",
                    hint="the library is older than this package: rebuild it from the same checkout",
                ) from None
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name[len("flashlab_"):], fn)
        abi = self.abi_version()
        if abi != ABI_VERSION:
            raise FlashlabLibraryError(
                f"{path}: ABI version {abi}, this package speaks ABI version {ABI_VERSION}",
                hint="use the package and the library of the same checkout",
            )
        self.version_string = self.version().decode()
        self.cuda = bool(self.has_cuda())

    def fail(self, status: int, call: str) -> FlashlabError:
        """The exception for a failed call: its status and the library's message."""
        message = (self.last_error() or b"").decode(errors="replace")
        name = (self.status_name(status) or b"").decode(errors="replace")
        return error_for_status(status, name, call, message)


_lock = threading.Lock()
_library: Optional[Library] = None


def lib() -> Library:
    """The library, loaded on first use; FlashlabLibraryError when it cannot be found."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            tried = candidate_paths()
            for path in tried:
                if path.is_file():
                    _library = Library(path)
                    break
            else:
                raise FlashlabLibraryError(
                    "libflashlab.so not found; looked in:\n"
                    + "\n".join(f"  {p}" for p in tried),
                    hint="build it in the checkout (`cmake --preset cpu && cmake --build --preset cpu "
                    "--target flashlab_capi`, or `make test`; `make cuda` for the GPU kernels) or set "
                    "FLASHLAB_LIBRARY to the path of libflashlab.so",
                )
    return _library


def reset_for_tests() -> None:
    """Forget the loaded library so that the next lib() looks again (tests only)."""
    global _library
    with _lock:
        _library = None
