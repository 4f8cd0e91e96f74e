"""ctypes binding of a `kvpc build --shared` library (docs/shared_abi.md)."""
import ctypes
import os

import numpy as np

ABI_VERSION = 1
STATUS = {0: "ok", 1: "bad argument", 2: "unknown policy", 3: "bad parameter",
          4: "unsupported policy", 5: "window too short", 6: "infeasible budget",
          7: "out of memory"}

_f32p = ctypes.POINTER(ctypes.c_float)
_i32p = ctypes.POINTER(ctypes.c_int32)


class KvpcError(ValueError):
    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


class Library:
    """One loaded library. path: the .so (default $KVPC_VLLM_LIB)."""

    def __init__(self, path=None):
        path = path or os.environ.get("KVPC_VLLM_LIB")
        if not path:
            raise KvpcError(1, "kvpc-vllm: no policy library: set KVPC_VLLM_LIB to a "
                               "library built with `kvpc build --shared`")
        self.path = path
        self.so = ctypes.CDLL(path)
        self.so.kvpc_abi_version.restype = ctypes.c_int
        got = self.so.kvpc_abi_version()
        if got != ABI_VERSION:
            raise KvpcError(1, f"{path}: shared ABI {got}, kvpc-vllm expects {ABI_VERSION}")
        self.so.kvpc_policies.restype = ctypes.c_char_p
        self.so.kvpc_window.argtypes = [
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_double, ctypes.c_int, ctypes.c_int,
            ctypes.c_int32, _i32p, ctypes.c_char_p, ctypes.c_size_t]
        self.so.kvpc_select.argtypes = [
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_double, ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_int, ctypes.c_int32, _f32p, _f32p,
            ctypes.POINTER(ctypes.c_uint16), ctypes.c_int32, _f32p, _i32p, _i32p,
            ctypes.c_char_p, ctypes.c_size_t]

    def policies(self):
        return self.so.kvpc_policies().decode().split(",")

    def window(self, policy, set_, ratio, group, head_dim, n):
        """Window rows the policy observes for a prompt of n tokens."""
        w = ctypes.c_int32(0)
        err = ctypes.create_string_buffer(512)
        rc = self.so.kvpc_window(policy.encode(), (set_ or "").encode(), float(ratio or 0),
                                 group, head_dim, n, ctypes.byref(w), err, 512)
        if rc:
            raise KvpcError(rc, err.value.decode())
        return w.value

    def select(self, policy, set_, ratio, keys, queries, values=None):
        """keys: float32 [L, H, n, d]; queries: float32 [L, W, H*G, d] (W may be 0).
        Returns a list over (layer, head) of int32 arrays of kept positions."""
        keys = np.ascontiguousarray(keys, dtype=np.float32)
        L, H, n, d = keys.shape
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        W = queries.shape[1]
        G = queries.shape[2] // H
        if queries.shape[0] != L or queries.shape[2] != H * G or queries.shape[3] != d:
            raise KvpcError(1, f"queries shape {queries.shape} does not fit keys {keys.shape}")
        keep = np.zeros((L, H, n), dtype=np.int32)
        n_keep = np.zeros((L, H), dtype=np.int32)
        err = ctypes.create_string_buffer(512)
        vp = None
        if values is not None:
            values = np.ascontiguousarray(values, dtype=np.float32)
            vp = values.ctypes.data_as(_f32p)
        rc = self.so.kvpc_select(
            policy.encode(), (set_ or "").encode(), float(ratio or 0), L, H, G, d, n,
            keys.ctypes.data_as(_f32p), vp, None, W,
            queries.ctypes.data_as(_f32p) if W else None,
            keep.ctypes.data_as(_i32p), n_keep.ctypes.data_as(_i32p), err, 512)
        if rc:
            raise KvpcError(rc, err.value.decode())
        return [[keep[l, h, :n_keep[l, h]].copy() for h in range(H)] for l in range(L)]


_lib = None


def get():
    """The process's library (loaded once)."""
    global _lib
    if _lib is None:
        _lib = Library()
    return _lib
