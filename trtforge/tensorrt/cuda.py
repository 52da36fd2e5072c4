"""The few CUDA runtime calls TensorRT execution needs, through ctypes on ``libcudart``.

One CUDA layer for the builder and the runtime, so both make the same calls the same way.
Nothing is loaded at import; :class:`CudaRuntime` opens the library.
"""

from __future__ import annotations

import ctypes

# cudaError_t values after which the CUDA context is unusable (the device cannot be trusted).
STICKY_CUDA_ERRORS = frozenset({46, 214, 220, 700, 702, 709, 710, 714, 715, 716, 717, 718, 719, 999})
H2D, D2H = 1, 2  # cudaMemcpyKind
LIBRARIES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12")


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call} failed: CUDA error {code} ({text})")
        self.code = code

    @property
    def sticky(self) -> bool:
        return self.code in STICKY_CUDA_ERRORS


class CudaRuntime:
    """cudaMalloc/Free, async copies and streams; raises CudaError naming the call."""

    def __init__(self) -> None:
        last: OSError | None = None
        for name in LIBRARIES:
            try:
                self._lib = ctypes.CDLL(name)
                break
            except OSError as e:
                last = e
        else:
            raise OSError(f"the CUDA runtime (libcudart.so) was not found: {last}")
        lib = self._lib
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpyAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
        lib.cudaGetLastError.argtypes = []
        lib.cudaRuntimeGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]

    def check(self, call: str, code: int) -> None:
        """Raise CudaError for a failed call. A failed call also leaves its error as the runtime's
        "last error" (seen on an H200: after a cudaMalloc out of memory, cudaGetLastError returns 2
        once), so it is read off here: a later :meth:`last_error` reports only newer errors."""
        if code != 0:
            self._lib.cudaGetLastError()
            text = self._lib.cudaGetErrorString(code)
            raise CudaError(call, code, text.decode() if text else "unknown")

    def version(self) -> str:
        """CUDA runtime major.minor, e.g. "13.0"."""
        v = ctypes.c_int()
        self.check("cudaRuntimeGetVersion", self._lib.cudaRuntimeGetVersion(ctypes.byref(v)))
        return f"{v.value // 1000}.{(v.value % 1000) // 10}"

    def malloc(self, size: int) -> int:
        p = ctypes.c_void_p()
        self.check("cudaMalloc", self._lib.cudaMalloc(ctypes.byref(p), max(1, size)))
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        self._lib.cudaFree(ctypes.c_void_p(ptr))

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self.check("cudaStreamCreateWithFlags", self._lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1))
        return int(s.value or 0)

    def copy_async(self, dst: int, src: int, size: int, kind: int, stream: int) -> None:
        self.check(
            "cudaMemcpyAsync",
            self._lib.cudaMemcpyAsync(
                ctypes.c_void_p(dst), ctypes.c_void_p(src), size, kind, ctypes.c_void_p(stream)
            ),
        )

    def synchronize(self, stream: int) -> None:
        self.check("cudaStreamSynchronize", self._lib.cudaStreamSynchronize(ctypes.c_void_p(stream)))

    def last_error(self) -> int:
        return int(self._lib.cudaGetLastError())

    def destroy_stream(self, stream: int) -> None:
        self._lib.cudaStreamDestroy(ctypes.c_void_p(stream))
