"""Zero-copy views of caller arrays: numpy (CPU), torch (CPU or CUDA), any
`__cuda_array_interface__` or DLPack producer. Validation helpers raise
ValueError/TypeError before anything reaches C."""
import ctypes
import sys

# kva_dtype values
F32, F16, BF16, FP8 = 0, 1, 2, 3
DTYPE_NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16", FP8: "float8_e4m3fn",
               "i32": "int32", "i64": "int64", "u8": "uint8"}

_NP = {"float32": F32, "float16": F16, "int32": "i32", "int64": "i64", "uint8": "u8"}
_TORCH = {"torch.float32": F32, "torch.float16": F16, "torch.bfloat16": BF16,
          "torch.float8_e4m3fn": FP8, "torch.int32": "i32", "torch.int64": "i64",
          "torch.uint8": "u8"}
_CAI = {"<f4": F32, "<f2": F16, "<i4": "i32", "<i8": "i64", "|u1": "u8"}
_DLPACK = {(2, 32): F32, (2, 16): F16, (4, 16): BF16, (0, 32): "i32", (0, 64): "i64",
           (1, 8): "u8"}  # (DLDataTypeCode, bits); 4 = kDLBfloat


class Arr:
    """A view: ptr, shape, strides (elements), dtype (kva_dtype or 'i32'...), device
    ('cpu' or ('cuda', index)), kind ('numpy' | 'torch' | 'cai' | 'dlpack'), obj (kept alive)."""
    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "kind", "obj", "keep")

    def __init__(self, ptr, shape, strides, dtype, device, kind, obj, keep=None):
        self.ptr, self.shape, self.strides = ptr, tuple(shape), tuple(strides)
        self.dtype, self.device, self.kind, self.obj, self.keep = dtype, device, kind, obj, keep

    @property
    def ndim(self):
        return len(self.shape)

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def contiguous(self):
        expect = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expect:
                return False
            expect *= size
        return True


def reshape(a, shape):
    """A contiguous view with another shape (same memory); -1 allowed once."""
    if not a.contiguous():
        raise ValueError(f"cannot view a non-contiguous array of shape {list(a.shape)} as {shape}")
    shape = list(shape)
    if -1 in shape:
        rest = 1
        for s in shape:
            rest *= s if s != -1 else 1
        shape[shape.index(-1)] = a.numel() // rest if rest else 0
    n = 1
    for s in shape:
        n *= s
    if n != a.numel():
        raise ValueError(f"cannot view shape {list(a.shape)} as {shape}")
    strides, acc = [], 1
    for s in reversed(shape):
        strides.insert(0, acc)
        acc *= s
    return Arr(a.ptr, shape, strides, a.dtype, a.device, a.kind, a.obj, a.keep)


def head_rows(a, total):
    """The first `total` rows of a contiguous array viewed as [rows, ...]."""
    return Arr(a.ptr, (total,) + tuple(a.shape[1:]), a.strides, a.dtype, a.device, a.kind, a.obj,
               a.keep)


def is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _dtype_name(d):
    return DTYPE_NAMES.get(d, str(d))


def view(x, name):
    """An Arr over x without copying; TypeError for anything that is not an array."""
    if isinstance(x, Arr):
        return x
    if is_torch(x):
        dt = _TORCH.get(str(x.dtype))
        if dt is None:
            raise TypeError(f"{name}: unsupported dtype {x.dtype}")
        dev = "cpu" if x.device.type == "cpu" else (
            ("cuda", x.device.index if x.device.index is not None else 0)
            if x.device.type == "cuda" else x.device.type)
        return Arr(x.data_ptr(), x.shape, x.stride(), dt, dev, "torch", x)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        dt = _NP.get(x.dtype.name)
        if dt is None:
            raise TypeError(f"{name}: unsupported numpy dtype {x.dtype} (float32/float16 data, "
                            "int32 indices; bfloat16 and fp8 need torch)")
        item = x.dtype.itemsize
        if any(s % item for s in x.strides):
            raise ValueError(f"{name}: strides not a multiple of the item size")
        return Arr(x.ctypes.data, x.shape, [s // item for s in x.strides], dt, "cpu", "numpy", x)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        dt = _CAI.get(cai["typestr"])
        if dt is None:
            raise TypeError(f"{name}: unsupported __cuda_array_interface__ typestr {cai['typestr']}")
        shape = tuple(cai["shape"])
        item = int(cai["typestr"][2:])
        if cai.get("strides") is None:
            strides, acc = [], 1
            for s in reversed(shape):
                strides.insert(0, acc)
                acc *= s
        else:
            strides = [s // item for s in cai["strides"]]
        return Arr(cai["data"][0], shape, strides, dt, ("cuda", _current_cuda_device()), "cai", x)
    if hasattr(x, "__dlpack__"):
        return _from_dlpack(x, name)
    raise TypeError(f"{name}: expected a numpy array, a torch tensor or a CUDA/DLPack array, "
                    f"got {type(x).__name__}")


def _current_cuda_device():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _from_dlpack(x, name):
    # The capsule stays alive (in Arr.keep) while the view is used; its
    # destructor calls the producer's deleter, so nothing is leaked.
    dev_type = None
    if hasattr(x, "__dlpack_device__"):
        dev_type, dev_id = x.__dlpack_device__()
    stream = _current_stream_handle(dev_id) if dev_type == 2 else None
    capsule = x.__dlpack__(stream=stream) if stream is not None else x.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    dt = _DLPACK.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dt is None:
        raise TypeError(f"{name}: unsupported DLPack dtype code {t.dtype.code} bits {t.dtype.bits}")
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides:
        strides = [t.strides[i] for i in range(t.ndim)]
    else:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.insert(0, acc)
            acc *= s
    if t.device.device_type == 1:
        dev = "cpu"
    elif t.device.device_type == 2:
        dev = ("cuda", t.device.device_id)
    else:
        raise ValueError(f"{name}: DLPack device type {t.device.device_type} is not CPU or CUDA")
    return Arr((t.data or 0) + t.byte_offset, shape, strides, dt, dev, "dlpack", x, keep=capsule)


def _current_stream_handle(device_index):
    torch = sys.modules.get("torch")
    if torch is None:
        return 1  # DLPack: 1 = the legacy default stream
    s = torch.cuda.current_stream(device_index).cuda_stream
    return s if s else 1


# ---- validation ----------------------------------------------------------

def require(a, name, *, dtypes=None, ndim=None, shape=None, device=None, contiguous=True):
    """Checks a view; shape entries of None match anything."""
    if dtypes is not None and a.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {_dtype_name(a.dtype)} not in "
                        f"{[_dtype_name(d) for d in dtypes]}")
    if ndim is not None and a.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {list(a.shape)}")
    if shape is not None:
        if len(shape) != a.ndim or any(e is not None and e != s for e, s in zip(shape, a.shape)):
            raise ValueError(f"{name}: expected shape {['*' if e is None else e for e in shape]}, "
                             f"got {list(a.shape)}")
    if device is not None and a.device != device:
        raise ValueError(f"{name}: on {a.device}, expected {device}")
    if contiguous and not a.contiguous():
        raise ValueError(f"{name}: must be contiguous (shape {list(a.shape)}, strides "
                         f"{list(a.strides)})")
    return a


def same_device(views):
    devs = {a.device for a in views}
    if len(devs) != 1:
        raise ValueError(f"arrays on different devices: {sorted(map(str, devs))}")
    dev = devs.pop()
    if dev != "cpu" and not (isinstance(dev, tuple) and dev[0] == "cuda"):
        raise ValueError(f"device {dev} is not supported (cpu or cuda)")
    return dev


def host_int32(x, name):
    """Index array (or int/sequence) -> contiguous host numpy int32 (copies; for a
    CUDA tensor this synchronizes)."""
    import numpy as np
    if x is None:
        return None
    if is_torch(x):
        if x.dtype.is_floating_point:
            raise TypeError(f"{name}: expected an integer tensor, got {x.dtype}")
        x = x.detach().to("cpu").numpy()
    elif hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: CUDA index arrays are read via torch; pass a torch tensor")
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got {arr.dtype}")
    if arr.size and (arr.min() < -2**31 or arr.max() >= 2**31):
        raise ValueError(f"{name}: values out of int32 range")
    return np.ascontiguousarray(arr, dtype=np.int32)


def i32p(arr):
    return arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)) if arr is not None else None


# ---- allocation like the inputs ------------------------------------------

def empty_like_kind(ref, shape, dtype):
    """New array like ref: numpy on the CPU unless ref is a torch tensor; torch on CUDA."""
    if ref.kind != "torch" and ref.device == "cpu":
        import numpy as np
        return np.empty(shape, dtype={F32: np.float32, F16: np.float16}[dtype])
    import torch
    tdt = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[dtype]
    dev = "cpu" if ref.device == "cpu" else f"cuda:{ref.device[1]}"
    return torch.empty(shape, dtype=tdt, device=dev)


