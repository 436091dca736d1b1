"""Quantised GGUF tensor types: which type each tensor of an export gets, and the bytes of each.

`plan_type(name, shape, quant, layer, n_layers)` picks a tensor's storage type for one of the
export types (`QUANT_TYPES`); `encode(x, qtype)` turns a float32 array [rows, cols] into what the
file holds: float32, float16 or uint8 blocks [rows, cols // block * bytes per block].

Design choices:
- Block layouts are ggml's (ggml-common.h), the ones llama.cpp and `gguf.quants.dequantize` read:
  Q8_0 (32 values: fp16 d, 32 int8), Q4_K (256 values: fp16 d, fp16 dmin, 12 bytes of packed 6-bit
  scales and mins, 128 bytes of 4-bit codes; value = d*sc*q - dmin*m), Q6_K (256 values: 128 bytes
  of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, fp16 d; value = d*scale*(q - 32)).
- Q8_0 and BF16 are `gguf.quants.quantize` (bit-exact with ggml's reference, its docstring says);
  gguf 0.19 only dequantises the K types, so Q4_K and Q6_K are written here, in numpy, after
  llama.cpp's reference quantisers (`quantize_row_q4_K_ref`, `quantize_row_q6_K_ref`): the same
  weighted least-squares search for each sub-block's scale (and min), vectorised over blocks. The
  codes need not equal llama.cpp's bit for bit; tests check them against a dequantisation written
  from the layout and bound the error.
- q4_k_m is llama.cpp's mix (`llama_tensor_get_type`): Q4_K everywhere, Q6_K for the output
  projection and for attn_v / ffn_down in the layers `_more_bits` picks.
- Vectors (norms, biases) and routers stay float32 in every type, as llama.cpp keeps them.
- A row whose width is not a whole number of blocks is refused (`check_rows`), never padded or
  given a fallback type: the caller checks every tensor before writing a byte.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf.quants import quantize as gguf_quantize

from hone.errors import InputError

# Export type -> (the type of most matrices, llama.cpp's general.file_type code)
QUANT_TYPES = {"f32": (QT.F32, 0), "f16": (QT.F16, 1), "bf16": (QT.BF16, 32),
               "q8_0": (QT.Q8_0, 7), "q4_k_m": (QT.Q4_K, 15)}
_QK = 256  # values per K-quant block


def check_quant(quant: str) -> None:
    if quant not in QUANT_TYPES:
        raise InputError(f"cannot write tensor type {quant!r}; hone writes: "
                         f"{', '.join(QUANT_TYPES)}", key="--quant")


def _more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def plan_type(name: str, shape: tuple[int, ...], quant: str, layer: int | None,
              n_layers: int) -> QT:
    """The storage type of GGUF tensor `name` (numpy `shape`) in export type `quant`."""
    base = QUANT_TYPES[quant][0]
    if len(shape) < 2 or "ffn_gate_inp" in name:  # vectors, routers: float32 as in llama.cpp
        return QT.F32
    if base != QT.Q4_K:
        return base
    if name == "output.weight":
        return QT.Q6_K
    if layer is not None and ("attn_v." in name or "ffn_down" in name) and _more_bits(
            layer, n_layers):
        return QT.Q6_K
    return QT.Q4_K


def check_rows(name: str, shape: tuple[int, ...], qtype: QT) -> None:
    """Refuse a tensor whose rows do not split into whole blocks of `qtype`."""
    block = GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block:
        raise InputError(f"tensor {name!r} has rows of {shape[-1]} values, not a multiple of "
                         f"the {qtype.name} block of {block}; quantising it would lose the "
                         f"model. Export it as f32, f16 or bf16 instead", key=name)


def encode(x: np.ndarray, qtype: QT) -> np.ndarray:
    """float32 `x` [..., cols] as stored in the file: a float array, or uint8 blocks
    [..., cols // block * bytes per block]."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == QT.F32:
        return x
    if qtype == QT.F16:
        return x.astype(np.float16)
    if qtype in (QT.BF16, QT.Q8_0):
        return gguf_quantize(x, qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = x.reshape(-1, block)  # [nb, 256]
    out = _q4_k(blocks) if qtype == QT.Q4_K else _q6_k(blocks)  # [nb, size]
    return out.reshape(*x.shape[:-1], x.shape[-1] // block * size)


def _fp16(x: np.ndarray) -> np.ndarray:
    """fp16-rounded float32 (what a block's stored scale reads back as)."""
    return x.astype(np.float16).astype(np.float32)


def _scale_min_search(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's `make_qkx2_quants`: per row of x [S, n], (scale, min <= 0) minimising the
    weighted squared error of x ~ scale * q + min, q in 0..nmax; tries 21 start points."""
    w = np.sqrt(np.mean(x * x, axis=1, keepdims=True)) + np.abs(x)  # [S, n] llama.cpp's weights
    lo = np.minimum(x.min(axis=1, keepdims=True), 0.0)  # [S, 1]
    hi = x.max(axis=1, keepdims=True)
    span = np.where(hi > lo, hi - lo, 1.0)
    best_scale, best_min = span / nmax, lo  # the plain min/max fit
    best_err = np.sum(w * (np.clip(np.rint((x - lo) / best_scale), 0, nmax) * best_scale + lo - x)
                      ** 2, axis=1, keepdims=True)
    sw, sx = w.sum(axis=1, keepdims=True), (w * x).sum(axis=1, keepdims=True)
    for step in range(21):
        iscale = (nmax - 1.0 + 0.1 * step) / span
        q = np.clip(np.rint(iscale * (x - lo)), 0, nmax)  # [S, n]
        sl, sl2, sxl = ((w * q).sum(1, keepdims=True), (w * q * q).sum(1, keepdims=True),
                        (w * q * x).sum(1, keepdims=True))
        det = sw * sl2 - sl * sl
        ok = det > 0
        det = np.where(ok, det, 1.0)
        scale = (sw * sxl - sx * sl) / det
        mn = (sl2 * sx - sl * sxl) / det
        pos = mn > 0  # a positive min is not representable: refit the scale alone
        scale = np.where(pos, sxl / np.where(sl2 > 0, sl2, 1.0), scale)
        mn = np.where(pos, 0.0, mn)
        err = np.sum(w * (scale * q + mn - x) ** 2, axis=1, keepdims=True)
        better = ok & (err < best_err)
        best_scale = np.where(better, scale, best_scale)
        best_min = np.where(better, mn, best_min)
        best_err = np.where(better, err, best_err)
    return best_scale[:, 0], -best_min[:, 0]  # [S], [S] (the min as the positive m)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    """Q4_K blocks [nb, 256] float32 -> [nb, 144] uint8."""
    nb = blocks.shape[0]
    sub = blocks.reshape(nb * 8, 32)  # [S, 32], 8 sub-blocks per block
    scale, mins = (a.reshape(nb, 8) for a in _scale_min_search(sub, 15))
    scale, mins = np.maximum(scale, 0.0), np.maximum(mins, 0.0)
    max_scale, max_min = scale.max(axis=1, keepdims=True), mins.max(axis=1, keepdims=True)
    sc = np.where(max_scale > 0, np.rint(scale * 63 / np.where(max_scale > 0, max_scale, 1)), 0)
    mn = np.where(max_min > 0, np.rint(mins * 63 / np.where(max_min > 0, max_min, 1)), 0)
    sc, mn = np.clip(sc, 0, 63).astype(np.uint8), np.clip(mn, 0, 63).astype(np.uint8)  # [nb, 8]
    d, dmin = _fp16(max_scale / 63), _fp16(max_min / 63)  # [nb, 1]
    step = (d * sc)[:, :, None]  # [nb, 8, 1] each sub-block's scale as the file reads it
    offset = (dmin * mn)[:, :, None]
    q = np.rint((blocks.reshape(nb, 8, 32) + offset) / np.where(step > 0, step, 1))
    q = np.where(step > 0, np.clip(q, 0, 15), 0).astype(np.uint8)  # [nb, 8, 32]
    scales = np.empty((nb, 12), np.uint8)  # 6-bit sc/m, low 4 in bytes 0-7, high 2 on top
    scales[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    q = q.reshape(nb, 4, 2, 32)  # 32 bytes per pair of sub-blocks: low nibble, high nibble
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)
    return np.concatenate([d.astype(np.float16).view(np.uint8),
                           dmin.astype(np.float16).view(np.uint8), scales, qs], axis=1)


def _q6_scales(sub: np.ndarray) -> np.ndarray:
    """llama.cpp's `make_qx_quants(nmax=32, rmse_type=1)`: a signed scale per row of sub [S, 16]
    so that x ~ scale * q, q in -32..31; tries 19 start points, weights x**2."""
    amax_at = np.argmax(np.abs(sub), axis=1)
    peak = sub[np.arange(sub.shape[0]), amax_at][:, None]  # [S, 1] the signed extreme value
    safe = np.where(peak != 0, peak, 1.0)
    w = sub * sub
    best_scale = np.zeros_like(peak)
    best_err = np.full_like(peak, np.inf)
    for step in range(-9, 10):
        iscale = -(32 + 0.1 * step) / safe
        q = np.clip(np.rint(iscale * sub), -32, 31)
        sumlx, suml2 = (w * sub * q).sum(1, keepdims=True), (w * q * q).sum(1, keepdims=True)
        scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, 1), 0.0)
        err = np.sum(w * (scale * q - sub) ** 2, axis=1, keepdims=True)
        better = err < best_err
        best_scale, best_err = np.where(better, scale, best_scale), np.where(better, err, best_err)
    return np.where(peak != 0, best_scale, 0.0)[:, 0]


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    """Q6_K blocks [nb, 256] float32 -> [nb, 210] uint8."""
    nb = blocks.shape[0]
    scale = _q6_scales(blocks.reshape(nb * 16, 16)).reshape(nb, 16)  # [nb, 16]
    at = np.argmax(np.abs(scale), axis=1)
    peak = scale[np.arange(nb), at][:, None]  # [nb, 1]
    iscale = np.where(peak != 0, -128 / np.where(peak != 0, peak, 1), 0.0)
    d = _fp16(np.where(iscale != 0, 1 / np.where(iscale != 0, iscale, 1), 0.0))  # [nb, 1]
    sc = np.clip(np.rint(iscale * scale), -128, 127).astype(np.int8)  # [nb, 16]
    step = (d * sc)[:, :, None]  # [nb, 16, 1]
    q = np.rint(blocks.reshape(nb, 16, 16) / np.where(step != 0, step, 1))
    q = (np.where(step != 0, np.clip(q, -32, 31), 0) + 32).astype(np.uint8)  # [nb, 16, 16]
    q = q.reshape(nb, 2, 4, 32)  # [block, half, segment, l]: value h*128 + s*32 + l
    low, high = q & 0xF, q >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4),  # ql[h*64 + l]: segments 0 and 2
                         low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)  # ql[h*64 + 32 + l]: 1, 3
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8),
                           d.astype(np.float16).view(np.uint8)], axis=1)
