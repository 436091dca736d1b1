"""The GGUF container (llama.cpp's file format): header, metadata and tensor directory.

This file is hone's only GGUF parser. `read_metadata(path)` returns the key-value section (what the
tokenizer needs); `open_gguf(path)` also returns the tensor directory and keeps the file mapped so
`hone.weights.gguf` can read tensor bytes in place. What the keys and tensors *mean* lives with
their users: `hone.weights.gguf` (HF config and weights) and `hone.tokenizer` (vocabularies).

Design choices:
- `struct` over an mmap instead of `gguf.GGUFReader`. The reader builds one numpy array per
  vocabulary string (about 10 s for Gemma 3's 262k pieces) and silently hands back short
  memory-mapped arrays for a file cut off in its tensor data. Constants and type codes still come
  from `gguf`.
- String arrays (vocabularies, merges) are decoded only for the keys a caller names in `arrays`;
  the rest are walked over and come back as `SkippedArray`. The weight loader needs none of them,
  the tokenizer two. Numeric arrays (scores, token types) are always read, in one numpy call each.
- Every read, and every tensor's data range, is checked against the file size; counts larger than
  the file are refused up front, so a corrupt header raises `InputError` naming the file instead
  of spinning through billions of failing reads.
- Both byte orders parse: metadata of a big-endian file is readable. Its tensor data is not
  dequantizable by `gguf.quants`, so the weight loader refuses it (see `GGUFFile.byte_order`).
"""

from __future__ import annotations

import math
import mmap
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterator

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from hone.errors import InputError

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32  # GGUF spec: tensor data alignment unless general.alignment overrides it
_MAX_DIMS = 4  # ggml tensors have at most 4 dimensions; more means a corrupt header
_MAX_NESTING = 8  # arrays of arrays deeper than this are corruption (and would exhaust the stack)

# struct (and numpy) codes of the scalar metadata types, without the byte-order prefix.
_CODES: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
# The compiled formats, keyed by byte order + code ("<I"), so reads do not build them each time.
_STRUCTS = {order + code: struct.Struct(order + code) for order in "<>" for code in _CODES.values()}


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array of strings (or of arrays) walked over but not decoded: only its length."""

    count: int


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor directory; its bytes are `GGUFFile.tensor_bytes(info)`."""

    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the innermost (contiguous) axis
    qtype: GGMLQuantizationType
    start: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        # ggml lists the fastest-varying axis first; numpy/torch list it last.
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file whose mapping is open for as long as `open_gguf`'s block runs."""

    path: Path
    byte_order: str  # "<" little-endian (what llama.cpp writes) or ">" big-endian
    metadata: dict[str, Any]  # key -> str, int, float, bool, numpy array, list or SkippedArray
    tensors: dict[str, TensorInfo]  # in file order
    buf: mmap.mmap

    def tensor_bytes(self, info: TensorInfo) -> np.ndarray:
        """The raw bytes of one tensor ([nbytes] uint8), a view into the mapping: copy to keep."""
        return np.frombuffer(self.buf, dtype=np.uint8, count=info.nbytes, offset=info.start)


def meta_value(meta: dict[str, Any], key: str, path: Path, default: Any = ..., kind: type = int,
         positive: bool = False) -> Any:
    """One metadata value of the expected kind; a missing required key is an InputError.

    `positive` guards sizes and counts: a zero there would surface later as a ZeroDivisionError
    or a reshape error that names neither the file nor the key.
    """
    if key not in meta:
        if default is ...:
            raise InputError("required GGUF metadata is missing", path=str(path), key=key)
        return default
    value = meta[key]
    if isinstance(value, np.ndarray) and value.size >= 1 and (value == value.flat[0]).all():
        value = value.flat[0].item()  # a per-layer array with one value throughout
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        if positive and value <= 0:
            raise InputError(f"GGUF metadata has value {value}; expected a positive integer",
                             path=str(path), key=key)
        return value
    if kind is str and isinstance(value, str):
        return value
    raise InputError(f"GGUF metadata has value {value!r}; expected a single {kind.__name__}",
                     path=str(path), key=key)


def read_metadata(path: str | Path, *, arrays: Collection[str] = ()) -> dict[str, Any]:
    """Every key-value pair of a GGUF header; string arrays decoded only for the keys in `arrays`.

    Decoded string arrays are lists of str (arrays of arrays: nested lists); numeric arrays are
    numpy arrays; undecoded arrays are `SkippedArray`. The tensor directory is not read.
    """
    path = Path(path)
    with _mapped(path) as (buf, size):
        return _Cursor(buf, size, path).metadata(arrays)[1]


@contextmanager
def open_gguf(path: str | Path, *, arrays: Collection[str] = ()) -> Iterator[GGUFFile]:
    """The file's metadata (as `read_metadata`) and tensor directory, mapped for the block."""
    path = Path(path)
    with _mapped(path) as (buf, size):
        cur = _Cursor(buf, size, path)
        n_tensors, metadata = cur.metadata(arrays)
        tensors = cur.tensor_directory(n_tensors, metadata)
        yield GGUFFile(path, cur.order, metadata, tensors, buf)


@contextmanager
def _mapped(path: Path) -> Iterator[tuple[mmap.mmap, int]]:
    try:
        size = path.stat().st_size
        f = path.open("rb")
    except OSError as e:
        raise InputError(f"cannot open the GGUF file: {e.strerror or e}", path=str(path)) from None
    with f:
        if size < 4:  # (an empty file cannot even be mapped)
            raise InputError(f"the file has only {size} bytes; it is not a GGUF file",
                             path=str(path))
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:  # not a regular file, or it shrank since stat()
            raise InputError(f"cannot map the GGUF file ({e})", path=str(path)) from None
        try:
            yield buf, size
        finally:
            try:
                buf.close()
            except BufferError:
                # A tensor view is still referenced, which happens only while an exception
                # propagates (its traceback holds the frame). Closing must not replace that
                # exception; the mapping is released with the last view.
                pass


class _Cursor:
    """Sequential reads over the file in its byte order; every read is checked against its size."""

    def __init__(self, buf: mmap.mmap, size: int, path: Path):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0
        self.order = "<"

    def _error(self, message: str, key: str | None = None) -> InputError:
        return InputError(message, path=str(self.path), key=key)

    def _short(self, what: str) -> InputError:
        return self._error(f"the file ends inside the GGUF header (reading {what} at byte "
                           f"{self.pos}); the header is truncated or corrupt")

    def _need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self._short(what)

    # ---- values --------------------------------------------------------------------------------

    def scalar(self, code: str, what: str) -> Any:
        fmt = _STRUCTS[self.order + code]
        self._need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        self._need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._error(f"{what} at byte {self.pos - n} is not UTF-8; the GGUF header is "
                              f"corrupt") from None

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.scalar("I", what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self._error(f"{what} has unknown value type {raw}; the GGUF header is "
                              f"corrupt") from None

    def value(self, vtype: GGUFValueType, what: str, decode: bool, depth: int = 0) -> Any:
        """One metadata value; `decode` says whether string arrays are decoded or skipped."""
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.FLOAT32:
            # The shortest decimal that is the same float32: converters wrote 1e-6, and configs
            # should say 1e-6, not 9.999999974752427e-07 (same float32, different float64).
            return float(str(np.float32(self.scalar("f", what))))
        if vtype != GGUFValueType.ARRAY:
            return self.scalar(_CODES[vtype], what)
        item_type = self.value_type(what)
        count = self.scalar("Q", what)
        if item_type in _CODES:
            dtype = np.dtype(self.order + _CODES[item_type])
            self._need(count * dtype.itemsize, what)
            # Copy: the result must not pin the mmap, which is closed when reading ends.
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            return arr
        if item_type == GGUFValueType.STRING:
            return self.strings(count, what, decode)
        # Arrays of arrays: each element takes at least 12 bytes (type and count), so a corrupt
        # count runs into the end of the file quickly instead of looping for ever.
        if depth >= _MAX_NESTING:
            raise self._error(f"{what} nests arrays more than {_MAX_NESTING} deep; the GGUF "
                              f"header is corrupt")
        items = [self.value(item_type, what, decode, depth + 1) for _ in range(count)]
        return items if decode else SkippedArray(count)

    def strings(self, count: int, what: str, decode: bool) -> list[str] | SkippedArray:
        """A string array, decoded or only walked. Each string takes at least its 8-byte length.

        The loop is inlined (no method call per element): Gemma 3's 262k pieces take well under
        a tenth of a second this way, decoded or not.
        """
        buf, size, pos, out = self.buf, self.size, self.pos, []
        unpack, append = _STRUCTS[self.order + "Q"].unpack_from, out.append
        try:
            for _ in range(count):
                end = pos + 8 + unpack(buf, pos)[0]  # struct.error when the length is cut off
                if end > size:
                    break
                if decode:
                    append(buf[pos + 8:end].decode("utf-8"))
                pos = end
            else:
                self.pos = pos
                return out if decode else SkippedArray(count)
        except struct.error:
            pass
        except UnicodeDecodeError:
            raise self._error(f"{what} has a string at byte {pos} that is not UTF-8; the GGUF "
                              f"header is corrupt") from None
        self.pos = pos
        raise self._short(what)

    # ---- sections ------------------------------------------------------------------------------

    def metadata(self, arrays: Collection[str]) -> tuple[int, dict[str, Any]]:
        """Magic, version and counts, then the key-value section: `(n_tensors, metadata)`."""
        if self.size < 4 or self.buf[:4] != _MAGIC:
            raise self._error("not a GGUF file (it does not start with the bytes 'GGUF')")
        self.pos = 4
        version = self.scalar("I", "the version")
        if version not in _VERSIONS:
            if int.from_bytes(version.to_bytes(4, "little"), "big") not in _VERSIONS:
                raise self._error(f"GGUF version {version} is not supported (only 2 and 3)")
            self.order = ">"  # written on a big-endian machine
        n_tensors = self.scalar("Q", "the tensor count")
        n_kv = self.scalar("Q", "the metadata count")
        # Each entry takes well over one byte, so counts above the file size can only be
        # corruption (and would otherwise make the loops below spin through failing reads).
        if n_tensors > self.size or n_kv > self.size:
            raise self._error(f"the GGUF header claims {n_tensors} tensors and {n_kv} metadata "
                              f"entries in a {self.size}-byte file; it is corrupt")
        meta: dict[str, Any] = {}
        for i in range(n_kv):
            key = self.string(f"metadata key #{i}")
            vtype = self.value_type(f"metadata '{key}'")
            meta[key] = self.value(vtype, f"metadata '{key}'", key in arrays)
        return n_tensors, meta

    def tensor_directory(self, n_tensors: int, meta: dict[str, Any]) -> dict[str, TensorInfo]:
        """The tensor infos after the metadata, with absolute, bounds-checked data ranges."""
        raw_infos = []
        for i in range(n_tensors):
            name = self.string(f"tensor name #{i}")
            n_dims = self.scalar("I", f"tensor '{name}'")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise self._error(f"tensor has {n_dims} dimensions (ggml allows 1 to {_MAX_DIMS});"
                                  f" the GGUF header is corrupt", key=name)
            dims = tuple(self.scalar("Q", f"tensor '{name}'") for _ in range(n_dims))
            raw_type = self.scalar("I", f"tensor '{name}'")
            offset = self.scalar("Q", f"tensor '{name}'")
            raw_infos.append((name, dims, raw_type, offset))

        alignment = meta.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise self._error(f"general.alignment is {alignment!r}; it must be a power of two",
                              key="general.alignment")
        data_start = -(-self.pos // alignment) * alignment  # data begins at the next boundary

        infos: dict[str, TensorInfo] = {}
        for name, dims, raw_type, offset in raw_infos:
            try:
                qtype = GGMLQuantizationType(raw_type)
            except ValueError:
                raise self._error(f"unknown ggml tensor type {raw_type}", key=name) from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            if dims[0] % block:
                raise self._error(f"row length {dims[0]} is not a multiple of the {qtype.name} "
                                  f"block size {block}; the GGUF header is corrupt", key=name)
            nbytes = math.prod(dims[1:]) * (dims[0] // block) * type_size
            start = data_start + offset
            # np.frombuffer over a short mmap would fail late and vaguely, so the data range is
            # checked here, up front.
            if start + nbytes > self.size:
                raise self._error(f"tensor data needs bytes {start}..{start + nbytes} but the "
                                  f"file has only {self.size} bytes; the file is truncated",
                                  key=name)
            if name in infos:
                raise self._error("two tensors share one name; the GGUF header is corrupt",
                                  key=name)
            infos[name] = TensorInfo(name, dims, qtype, start, nbytes)
        return infos
