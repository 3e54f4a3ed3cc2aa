"""Key/value storage for the streaming cache: as given (16 bits), or quantised integers packed into bytes.

Asymmetric min-max quantisation in groups (as in KIVI, Liu et al. 2024, "KIVI: A Tuning-Free
Asymmetric 2bit Quantization for KV Cache", sec. 3): a group ``x_1..x_g`` is stored as integer
codes ``c_i = round((x_i - z) / s)`` in ``[0, 2^b - 1]`` with zero ``z = min x`` and scale
``s = (max x - min x) / (2^b - 1)`` (a constant group: ``s = 0``, codes 0), and read back as
``c_i s + z``. Values are quantised per token (groups of ``kv_group`` consecutive channels of
one head); keys either the same way (``key_quant = "token"``) or per channel (``"channel"``,
KIVI's choice for keys, whose outliers sit in fixed channels): each channel of a head over a block
of ``kv_group`` consecutive tokens of the stream. A channel block is quantised when its last token
has arrived; until then its tokens stay in full precision (KIVI's residual). The first
``sinks_full_precision`` tokens of the stream (the attention sinks, IntactKV / KVSink's point)
are kept lossless besides and read from that copy. With ``sinks_full_precision = "detected"`` the
lossless tokens are instead those sinklab's own sink metric flags (:class:`sinklab.streaming.policies.SinkMetric`,
the detection of the ``detected-sinks`` policy: attention mass above ``eps`` in a head), measured
on the fly from the attention weights, wherever they are in the stream (secondary sinks included):
a token gets its lossless copy when the metric flags it at the end of the call it arrives in (the
cache holds a call's full-precision keys/values only until that call's weights have come), and
keeps it while it stays flagged; a token unflagged later is read from its codes from then on (and
is not promoted again), one flagged only later than its arrival call stays quantised.

Memory is counted honestly (:attr:`QuantKV.nbytes`): the packed codes (``b`` bits per entry,
``b = 3`` packs 8 codes into 3 bytes), the scales and zeros (in the key/value dtype), the
full-precision residual and the lossless copies. ``kv_bits = 16`` keeps the model's tensors as
they are (:class:`DenseKV`), bit-identical to an unquantised cache whatever the model's dtype.

Device and dtype: codes, scales, zeros and copies live on the keys' device; scales and zeros and
the lossless copies in the keys' dtype. The quantiser's min / max / scale / codes and the
dequantisation are computed in float32 (float64 for a float64 model) whatever the keys' dtype
(:func:`quantize_minmax`, :func:`dequantize`): bfloat16 arithmetic there would misplace codes.

Slots are addressed by arrival index (``order``: the 0-based index of a token in the stream the
cache has seen), not by its RoPE position, which may be a cache position that repeats.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinklab.errors import InputError, param

#: the ``kv_bits`` accepted: 16 = stored as given, else integer codes of that width
KV_BITS = (16, 8, 4, 3, 2)
KEY_QUANT = ("token", "channel")
#: ``sinks_full_precision`` value that keeps the detected sinks lossless (instead of the first N tokens)
DETECTED = "detected"


def parse_sinks_full_precision(value) -> int | str:
    """``sinks_full_precision`` from a config or the command line: an integer N >= 0 (the first N tokens
    lossless; ``"4"`` is read as 4) or ``"detected"`` (the sinks the metric flags).

    Raises:
        InputError: anything else.
    """
    if isinstance(value, str):
        v = value.strip().lower()
        if v == DETECTED:
            return DETECTED
        if v.isdigit():
            return int(v)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InputError(f"sinks_full_precision must be an integer >= 0 or {DETECTED!r}, got {value!r}")


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype the quantiser computes in: float32, or float64 for float64 tensors."""
    return torch.promote_types(dtype, torch.float32)


def _codes_for(xw: Tensor, zero: Tensor, scale: Tensor, bits: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Codes of ``xw`` (wide) for a group's ``zero`` and ``scale`` (wide, broadcasting): both are rounded
    to the storage ``dtype`` first and the codes computed against the rounded values, so that
    ``codes * scale + zero`` read back from storage is the nearest grid point to ``x`` that storage holds."""
    levels = 2**bits - 1
    zero_s, scale_s = zero.to(dtype), scale.to(dtype)
    zw, sw = zero_s.to(xw.dtype), scale_s.to(xw.dtype)
    safe = torch.where(sw > 0, sw, torch.ones_like(sw))
    codes = torch.round((xw - zw) / safe).clamp_(0, levels).to(torch.uint8)
    return codes, scale_s, zero_s


def quantize_minmax(x: Tensor, bits: int, dim: int = -1) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric min-max quantisation of groups along ``dim`` (KIVI, Liu et al. 2024, Eq. 1).

    The min, max, scale and codes are computed in float32 whatever ``x``'s dtype (float64 for float64):
    in bfloat16 / float16 ``(max - min) / (2^b - 1)`` and ``(x - zero) / scale`` would round to 8 / 11
    bits and put codes on the wrong level. Scale and zero are then stored in ``x``'s dtype, rounded
    before the codes are computed, so that the codes are those of the stored scale and zero.

    Args:
        x: (..., g, ...) float; each slice along ``dim`` is one group of g entries.
        bits: code width b in 1..8.
        dim: the group dimension.

    Returns:
        codes: uint8, shape of ``x``, in [0, 2^b - 1]: ``round((x - zero) / scale)`` (round half to
        even), 0 where scale is 0; scale, zero: ``x``'s dtype and device, shape of ``x`` with ``dim`` of
        size 1: ``(max - min) / (2^b - 1)`` and ``min`` of each group.

    Raises:
        InputError: ``bits`` outside 1..8.
    """
    if not 1 <= bits <= 8:
        raise InputError(f"quantisation needs 1..8 bits, got {bits}")
    xw = x.to(_wide(x.dtype))
    zero = xw.amin(dim, keepdim=True)
    scale = (xw.amax(dim, keepdim=True) - zero) / (2**bits - 1)
    return _codes_for(xw, zero, scale, bits, x.dtype)


def dequantize(codes: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """``codes * scale + zero`` computed in float32 (float64 for float64 scales) and returned in the dtype
    of ``scale`` (one rounding, not two, in bfloat16 / float16; shapes broadcast as from
    :func:`quantize_minmax`)."""
    wide = _wide(scale.dtype)
    return (codes.to(wide) * scale.to(wide) + zero.to(wide)).to(scale.dtype)


def _chunk(bits: int) -> tuple[int, int]:
    """(codes per chunk, bytes per chunk): the smallest run of b-bit codes that fills whole bytes."""
    per = 8 // math.gcd(bits, 8)
    return per, per * bits // 8


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Pack b-bit codes along the last dimension into bytes, little-endian within a chunk.

    Args:
        codes: (..., n) uint8 in [0, 2^b - 1]; n a multiple of ``8 / gcd(b, 8)`` (4 for 2 bits,
            8 for 3, 2 for 4, 1 for 8).

    Returns:
        (..., n * b / 8) uint8.

    Raises:
        InputError: n not a multiple of the chunk length.
    """
    per, nbytes = _chunk(bits)
    n = codes.shape[-1]
    if n % per:
        raise InputError(f"{bits}-bit packing needs a multiple of {per} codes per row, got {n}")
    c = codes.reshape(*codes.shape[:-1], n // per, per).to(torch.int32)  # (..., n/per, per)
    shift = bits * torch.arange(per, device=codes.device, dtype=torch.int32)
    word = (c << shift).sum(-1)  # (..., n/per) < 2^(per*bits) <= 2^24
    byte_shift = 8 * torch.arange(nbytes, device=codes.device, dtype=torch.int32)
    out = (word[..., None] >> byte_shift) & 255  # (..., n/per, nbytes)
    return out.to(torch.uint8).reshape(*codes.shape[:-1], n // per * nbytes)


def unpack_codes(packed: Tensor, bits: int, n: int) -> Tensor:
    """Inverse of :func:`pack_codes`: (..., n * b / 8) uint8 -> (..., n) uint8 codes."""
    per, nbytes = _chunk(bits)
    p = packed.reshape(*packed.shape[:-1], n // per, nbytes).to(torch.int32)  # (..., n/per, nbytes)
    word = (p << (8 * torch.arange(nbytes, device=packed.device, dtype=torch.int32))).sum(-1)
    codes = (word[..., None] >> (bits * torch.arange(per, device=packed.device, dtype=torch.int32))) & (2**bits - 1)
    return codes.to(torch.uint8).reshape(*packed.shape[:-1], n)


def check_kv_options(kv_bits: int, kv_group: int, key_quant: str, sinks_full_precision: int | str) -> None:
    """Raises InputError naming the first bad quantisation option."""
    if kv_bits not in KV_BITS:
        raise InputError(f"kv_bits must be one of {', '.join(map(str, KV_BITS))}, got {kv_bits!r}")
    if not isinstance(kv_group, int) or kv_group < 1:
        raise InputError(f"kv_group must be an integer >= 1, got {kv_group!r}")
    if key_quant not in KEY_QUANT:
        raise InputError(f"key_quant must be token or channel, got {key_quant!r}")
    if sinks_full_precision != DETECTED and (not isinstance(sinks_full_precision, int) or sinks_full_precision < 0):
        raise InputError(f"sinks_full_precision must be an integer >= 0 or {DETECTED!r}, got {sinks_full_precision!r}")


def check_storage_options(budget: int, kv_bits: int, key_quant: str, sinks_full_precision: int | str,
                          kv_group: int | None = None) -> None:
    """Refuse storage options that would be accepted and silently do nothing: ``key_quant``,
    ``sinks_full_precision`` (and ``kv_group``, where given) other than their defaults on a 16-bit cache,
    which stores keys and values as given; more lossless first tokens than the ``budget`` a layer keeps.

    Raises:
        InputError: naming the option and what to change.
    """
    if kv_bits == 16:
        given = [param(name, value) for name, value, default in
                 (("key_quant", key_quant, "token"), ("sinks_full_precision", sinks_full_precision, 0),
                  ("kv_group", kv_group, None if kv_group is None else 32)) if value != default]
        if given:
            raise InputError(f"{', '.join(given)} set(s) quantised storage, and a 16-bit cache stores keys and values "
                             f"as given: add a {param('kv_bits')} below 16 (e.g. 4)")
    elif isinstance(sinks_full_precision, int) and sinks_full_precision > budget:
        raise InputError(f"{param('sinks_full_precision', sinks_full_precision)} exceeds the {param('budget')} "
                         f"{budget}: a layer keeps at most that many tokens")


def _nbytes(*ts: Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _take(t: Tensor, idx: Tensor) -> Tensor:
    """Slots ``idx`` of ``t`` (B, H, K, ...): (K',) shared by the rows, or (B, K') per row."""
    if idx.dim() == 1:
        return t[:, :, idx]
    shape = (idx.shape[0], t.shape[1], idx.shape[1], *t.shape[3:])
    ix = idx.view(idx.shape[0], 1, idx.shape[1], *([1] * (t.dim() - 3))).expand(shape)
    return t.gather(2, ix)


class DenseKV:
    """Keys and values stored as the model gave them (``kv_bits = 16``).

    Attributes:
        keys, values: (B, H_kv, K, head_dim), slots in arrival order.
    """

    bits = 16

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def init(self, key_states: Tensor, value_states: Tensor) -> None:
        self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]

    def read(self, order: Tensor) -> tuple[Tensor, Tensor]:
        """The stored (B, H_kv, K, head_dim) keys and values themselves (no copy)."""
        return self.keys, self.values

    def append(self, key_states: Tensor, value_states: Tensor, order: Tensor, *, cat_k: Tensor | None = None,
               cat_v: Tensor | None = None) -> None:
        """Add q new slots; ``cat_k`` / ``cat_v``: the concatenation already made by the caller, if any."""
        self.keys = cat_k if cat_k is not None else torch.cat((self.keys, key_states), dim=-2)
        self.values = cat_v if cat_v is not None else torch.cat((self.values, value_states), dim=-2)

    def select(self, idx: Tensor, order: Tensor) -> None:
        """Keep slots ``idx`` ((K',) for every row, or (B, K') per row)."""
        if idx.dim() == 1:
            self.keys, self.values = self.keys[..., idx, :], self.values[..., idx, :]
        else:
            self.keys, self.values = _take(self.keys, idx), _take(self.values, idx)

    def batch(self, fn) -> None:
        """Apply ``fn`` (a function of a tensor's batch dimension) to every stored tensor."""
        if self.keys is not None:
            self.keys, self.values = fn(self.keys), fn(self.values)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys, self.values)


class QuantKV:
    """Keys and values stored as packed b-bit codes with per-group scales and zeros (module docstring).

    Args:
        bits: 8, 4, 3 or 2.
        group: ``kv_group``: channels per group (per-token quantisation; capped at head_dim, which it
            must divide) or tokens per block (per-channel keys).
        key_quant: ``"token"`` or ``"channel"``.
        lossless: ``sinks_full_precision``: arrival indices ``0 .. lossless-1`` are also kept lossless;
            or ``"detected"``: the slots :meth:`mark_lossless` is given (the sinks the metric flags),
            the cache layer handing over each call's flags once its attention weights have come.

    Raises (on the first tokens): InputError for a head_dim that is not a multiple of 8 or of the
    channel group.
    """

    def __init__(self, bits: int, group: int = 32, key_quant: str = "token", lossless: int = 0) -> None:
        check_kv_options(bits, group, key_quant, lossless)
        if bits == 16:
            raise InputError("QuantKV stores 2..8-bit codes; kv_bits 16 is DenseKV")
        self.bits, self.group, self.key_quant, self.lossless = bits, group, key_quant, lossless
        self.detected = lossless == DETECTED
        # arrivals from here on are quantised by the per-channel blocks (fixed lossless ones are left out)
        self._first_quantised = 0 if self.detected else lossless
        self.d = 0
        self.dtype: torch.dtype | None = None
        # per slot (B, H, K, ...)
        self.k_codes = self.v_codes = self.v_scale = self.v_zero = self.k_scale = self.k_zero = None
        # lossless copies of arrivals fp_start .. fp_start + n - 1 (B, H, n, d), n <= lossless: the first ``lossless``
        # arrivals, those before the oldest one still kept in any row freed (all of them once none is kept)
        self.fp_k = self.fp_v = None
        self.fp_start = 0
        self._seen = 0  # arrivals appended so far
        # "detected": the copies (B, H, M, d) of the flagged slots (M the most in a row), fp_idx (B, K)
        # int64 the copy of each slot or -1; pending: the last call's new (keys, values) until marked
        self.fp_idx: Tensor | None = None
        self.pending: tuple[Tensor, Tensor] | None = None
        # per-channel keys: block table (B, H, Nb, d) with its block numbers (Nb,); the residual
        # (B, H, r, d) holds arrivals res_start .. res_start + r - 1 of the block not yet complete
        self.tab_scale = self.tab_zero = self.tab_block = None
        self.res_k: Tensor | None = None
        self.res_start = 0

    # ------------------------------------------------------------------ helpers
    def _cgroup(self) -> int:
        return min(self.group, self.d)

    def _quant_token(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, H, q, d) -> packed codes (B, H, q, d b / 8), scale, zero (B, H, q, d / g)."""
        B, H, q, d = x.shape
        g = self._cgroup()
        codes, scale, zero = quantize_minmax(x.reshape(B, H, q, d // g, g), self.bits)  # (B, H, q, d/g, g)
        return pack_codes(codes.reshape(B, H, q, d), self.bits), scale[..., 0], zero[..., 0]

    def _deq_token(self, packed: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
        B, H, K, _ = packed.shape
        g = self._cgroup()
        codes = unpack_codes(packed, self.bits, self.d).reshape(B, H, K, self.d // g, g)
        return dequantize(codes, scale[..., None], zero[..., None]).reshape(B, H, K, self.d)

    def init(self, key_states: Tensor, value_states: Tensor) -> None:
        B, H, _, d = key_states.shape
        if d % 8:
            raise InputError(f"kv_bits {self.bits} packs codes in runs of 8 channels; head_dim {d} is not a multiple of 8")
        if d % min(self.group, d):
            what = ("the values' channels of one token (the keys' blocks of kv_group tokens per channel share it)"
                    if self.key_quant == "channel" else "the channels of one token's key and value")
            raise InputError(f"kv_group {self.group} must divide head_dim {d} (or be at least head_dim): it groups "
                             f"{what}")
        self.d, self.dtype = d, key_states.dtype
        dev, dt = key_states.device, key_states.dtype
        nb, ng = d * self.bits // 8, d // self._cgroup()
        self.k_codes = torch.zeros(B, H, 0, nb, dtype=torch.uint8, device=dev)
        self.v_codes = torch.zeros(B, H, 0, nb, dtype=torch.uint8, device=dev)
        self.v_scale = torch.zeros(B, H, 0, ng, dtype=dt, device=dev)
        self.v_zero = torch.zeros(B, H, 0, ng, dtype=dt, device=dev)
        if self.key_quant == "token":
            self.k_scale = torch.zeros(B, H, 0, ng, dtype=dt, device=dev)
            self.k_zero = torch.zeros(B, H, 0, ng, dtype=dt, device=dev)
        else:
            self.tab_scale = torch.zeros(B, H, 0, d, dtype=dt, device=dev)
            self.tab_zero = torch.zeros(B, H, 0, d, dtype=dt, device=dev)
            self.tab_block = torch.zeros(0, dtype=torch.long, device=dev)
            self.res_k = key_states[..., :0, :]
        self.fp_k, self.fp_v = key_states[..., :0, :], value_states[..., :0, :]
        if self.detected:
            self.fp_idx = torch.zeros(B, 0, dtype=torch.long, device=dev)

    # ------------------------------------------------------------------ the store's interface
    def read(self, order: Tensor) -> tuple[Tensor, Tensor]:
        """Dequantised keys and values (B, H_kv, K, head_dim) of the kept slots; ``order`` (K,) or (B, K)
        arrival indices of the slots (lossless and residual slots read from their full-precision copies)."""
        B, H, K, _ = self.v_codes.shape
        values = self._deq_token(self.v_codes, self.v_scale, self.v_zero)
        if self.key_quant == "token":
            keys = self._deq_token(self.k_codes, self.k_scale, self.k_zero)
        else:
            keys = self._deq_channel(order)
        o = order if order.dim() == 2 else order[None].expand(B, K)
        if self.key_quant == "channel" and self.res_k.shape[-2]:
            res = o >= self.res_start  # (B, K)
            if bool(res.any()):
                got = _take(self.res_k, (o - self.res_start).clamp(0, self.res_k.shape[-2] - 1))
                keys = torch.where(res[:, None, :, None], got, keys)
        n_fp = self.fp_k.shape[-2]
        if n_fp and self.detected:
            fp = self.fp_idx >= 0  # (B, K)
            if bool(fp.any()):
                ix = self.fp_idx.clamp(min=0)
                keys = torch.where(fp[:, None, :, None], _take(self.fp_k, ix), keys)
                values = torch.where(fp[:, None, :, None], _take(self.fp_v, ix), values)
        elif n_fp:
            fp = (o >= self.fp_start) & (o < self.fp_start + n_fp)  # (B, K)
            if bool(fp.any()):
                ix = (o - self.fp_start).clamp(0, n_fp - 1)
                keys = torch.where(fp[:, None, :, None], _take(self.fp_k, ix), keys)
                values = torch.where(fp[:, None, :, None], _take(self.fp_v, ix), values)
        return keys, values

    def _deq_channel(self, order: Tensor) -> Tensor:
        """Per-channel keys (B, H, K, d): codes with the scale/zero of each slot's block (zeros for slots
        whose block is not complete yet: the caller reads those from the residual)."""
        B, H, K, _ = self.k_codes.shape
        codes = unpack_codes(self.k_codes, self.bits, self.d)  # (B, H, K, d)
        if not self.tab_block.numel():
            return torch.zeros(B, H, K, self.d, dtype=self.dtype, device=codes.device)
        o = order if order.dim() == 2 else order[None].expand(B, K)
        gi = torch.searchsorted(self.tab_block, o // self.group).clamp(max=self.tab_block.numel() - 1)  # (B, K)
        return dequantize(codes, _take(self.tab_scale, gi), _take(self.tab_zero, gi))

    def append(self, key_states: Tensor, value_states: Tensor, order: Tensor, *, cat_k: Tensor | None = None,
               cat_v: Tensor | None = None) -> None:
        """Quantise and add q new slots; ``order``: (K + q,) or (B, K + q) arrival indices of all slots
        after the append (the new ones last, q consecutive arrivals)."""
        B, H, q, d = key_states.shape
        first = int(order[..., -q].reshape(-1)[0])  # arrival index of the first new token
        vc, vs, vz = self._quant_token(value_states)
        self.v_codes = torch.cat((self.v_codes, vc), dim=2)
        self.v_scale = torch.cat((self.v_scale, vs), dim=2)
        self.v_zero = torch.cat((self.v_zero, vz), dim=2)
        if self.key_quant == "token":
            kc, ks, kz = self._quant_token(key_states)
            self.k_codes = torch.cat((self.k_codes, kc), dim=2)
            self.k_scale = torch.cat((self.k_scale, ks), dim=2)
            self.k_zero = torch.cat((self.k_zero, kz), dim=2)
        else:  # codes are written when the block completes
            self.k_codes = torch.cat((self.k_codes, self.k_codes.new_zeros(B, H, q, self.k_codes.shape[-1])), dim=2)
            self.res_k = torch.cat((self.res_k, key_states), dim=-2)
        if self.detected:  # lossless or not is decided by mark_lossless, once this call's weights have come
            self.fp_idx = torch.cat((self.fp_idx, self.fp_idx.new_full((B, q), -1)), dim=1)
            self.pending = (key_states, value_states)
        keep_fp = 0 if self.detected else min(q, max(0, self.lossless - first))  # new arrivals below the count
        if keep_fp:
            if not self.fp_k.shape[-2]:
                self.fp_start = first
            self.fp_k = torch.cat((self.fp_k, key_states[..., :keep_fp, :]), dim=-2)
            self.fp_v = torch.cat((self.fp_v, value_states[..., :keep_fp, :]), dim=-2)
        self._seen = first + q
        if self.key_quant == "channel":
            self._close_blocks(order, first + q)

    def _close_blocks(self, order: Tensor, seen: int) -> None:
        """Quantise every complete block of the residual: per row and channel, min-max over the block's
        tokens still kept (the first ``sinks_full_precision`` ones excluded; detected sinks are not, since
        they may lose their lossless copy later), then write their codes."""
        G = self.group
        B, H, K, _ = self.k_codes.shape
        o = order if order.dim() == 2 else order[None].expand(B, K)
        while seen >= self.res_start + G:
            start = self.res_start
            res = self.res_k[..., :G, :]  # (B, H, G, d): arrivals start .. start + G - 1
            arrivals = torch.arange(start, start + G, device=o.device)
            alive = (o[:, :, None] == arrivals[None, None, :]).any(1) & (arrivals >= self._first_quantised)[None]  # (B, G)
            m = alive[:, None, :, None]
            rw = res.to(_wide(res.dtype))  # min / max / scale in float32 (see quantize_minmax)
            big = torch.finfo(rw.dtype).max
            mn = torch.where(m, rw, big).amin(2, keepdim=True)  # (B, H, 1, d)
            mx = torch.where(m, rw, -big).amax(2, keepdim=True)
            none = ~alive.any(1)  # rows with no quantised member: any finite scale will do
            mn = torch.where(none[:, None, None, None], torch.zeros_like(mn), mn)
            mx = torch.where(none[:, None, None, None], torch.zeros_like(mx), mx)
            codes, scale, mn = _codes_for(rw, mn, (mx - mn) / (2**self.bits - 1), self.bits, res.dtype)  # (B, H, G, d)
            packed = pack_codes(codes, self.bits)  # (B, H, G, nb)
            member = (o >= start) & (o < start + G)  # (B, K)
            if bool(member.any()):
                got = _take(packed, (o - start).clamp(0, G - 1))
                self.k_codes = torch.where(member[:, None, :, None], got, self.k_codes)
            if bool(alive.any()):
                self.tab_scale = torch.cat((self.tab_scale, scale), dim=2)
                self.tab_zero = torch.cat((self.tab_zero, mn), dim=2)
                self.tab_block = torch.cat((self.tab_block, self.tab_block.new_full((1,), start // G)))
            self.res_k = self.res_k[..., G:, :]
            self.res_start = start + G

    def select(self, idx: Tensor, order: Tensor) -> None:
        """Keep slots ``idx`` ((K',) or (B, K')); ``order``: the kept slots' arrival indices after it.
        Blocks of the per-channel table left without a kept quantised token are freed."""
        names = ["k_codes", "v_codes", "v_scale", "v_zero"] + (["k_scale", "k_zero"] if self.key_quant == "token" else [])
        for name in names:
            setattr(self, name, _take(getattr(self, name), idx))
        if self.detected:
            before = (self.fp_idx >= 0).sum(1)
            self.fp_idx = self.fp_idx[:, idx] if idx.dim() == 1 else self.fp_idx.gather(1, idx)
            if bool(((self.fp_idx >= 0).sum(1) != before).any()):  # copies of evicted slots: free them
                self._compact(self.fp_idx >= 0, self.fp_idx, self.fp_k, self.fp_v)
        elif self.fp_k.shape[-2]:  # copies of the first arrivals older than every one still kept: free them
            low = order[order < self.lossless]
            start = int(low.min()) if low.numel() else (self.lossless if self._seen >= self.lossless else self.fp_start)
            if start > self.fp_start:
                cut = min(start - self.fp_start, self.fp_k.shape[-2])
                self.fp_k, self.fp_v = self.fp_k[..., cut:, :], self.fp_v[..., cut:, :]
                self.fp_start += cut
        if self.key_quant == "channel" and self.tab_block.numel():
            q = order[(order < self.res_start) & (order >= self._first_quantised)]
            live = torch.isin(self.tab_block, torch.unique(q // self.group))
            if not bool(live.all()):
                keep = live.nonzero().squeeze(-1)
                self.tab_scale, self.tab_zero = self.tab_scale[:, :, keep], self.tab_zero[:, :, keep]
                self.tab_block = self.tab_block[keep]

    def mark_lossless(self, flags: Tensor) -> None:
        """``sinks_full_precision = "detected"``: the slots to hold lossless after the last :meth:`append`.

        Args:
            flags: (B, n) bool over the n slots held now (the last call's new slots last): True for a
                sink by the metric. A new slot flagged gets its lossless copy (from the call's keys and
                values, held until now); an older slot keeps its copy while flagged, loses it when not;
                an older slot without a copy cannot get one (its full-precision states are gone).

        Raises:
            InputError: not a ``"detected"`` store, no call waiting, or flags of another shape.
        """
        if not self.detected or self.pending is None:
            raise InputError("mark_lossless needs a store with sinks_full_precision='detected' after an append")
        pk, pv = self.pending
        B, n, q, M = self.fp_idx.shape[0], self.fp_idx.shape[1], pk.shape[-2], self.fp_k.shape[-2]
        if tuple(flags.shape) != (B, n):
            raise InputError(f"flags of shape {tuple(flags.shape)} for a store of {B} rows and {n} slots")
        src = self.fp_idx.clone()
        src[:, n - q :] = M + torch.arange(q, device=src.device)
        self.pending = None
        self._compact(flags & (src >= 0), src, torch.cat((self.fp_k, pk), dim=2), torch.cat((self.fp_v, pv), dim=2))

    def _compact(self, keep: Tensor, src: Tensor, sk: Tensor, sv: Tensor) -> None:
        """Lossless copies of the slots ``keep`` (B, n) bool, taken from ``sk`` / ``sv`` (B, H, S, d) at
        ``src`` (B, n); copies stored in slot order, rows padded to the row with the most."""
        B, n = keep.shape
        M = int(keep.sum(1).max()) if n else 0
        self.fp_idx = torch.where(keep, keep.cumsum(1) - 1, torch.full_like(src, -1))
        if M == 0:
            self.fp_k, self.fp_v = sk[..., :0, :], sv[..., :0, :]
            return
        slot = torch.arange(n, device=keep.device)
        first = torch.where(keep, slot, n + slot).argsort(dim=1)[:, :M]  # (B, M): the kept slots in order first
        take = src.gather(1, first).clamp(min=0)
        self.fp_k, self.fp_v = _take(sk, take), _take(sv, take)

    def batch(self, fn) -> None:
        for name in ("k_codes", "v_codes", "v_scale", "v_zero", "k_scale", "k_zero", "fp_k", "fp_v", "tab_scale",
                     "tab_zero", "res_k", "fp_idx"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, fn(t))
        if self.pending is not None:
            self.pending = (fn(self.pending[0]), fn(self.pending[1]))

    @property
    def nbytes(self) -> int:
        """Bytes held: packed codes, scales and zeros, the residual and the lossless copies (with
        ``"detected"``: the copies as stored, rows padded to the longest, their slot index and, within a
        call, the new tokens' states held until the attention weights come). What the store holds, as allocated:
        the copies of the first ``sinks_full_precision`` arrivals from the oldest one still kept on (freed once
        evicted, in order); with per-channel keys the placeholder codes of the open block's slots and its
        full-precision keys, evicted ones included, until the block completes."""
        pend = self.pending or (None, None)
        return _nbytes(self.k_codes, self.v_codes, self.v_scale, self.v_zero, self.k_scale, self.k_zero, self.fp_k,
                       self.fp_v, self.tab_scale, self.tab_zero, self.res_k, self.fp_idx, *pend)


def make_store(kv_bits: int = 16, kv_group: int = 32, key_quant: str = "token",
               sinks_full_precision: int | str = 0) -> DenseKV | QuantKV:
    """The store of one cache layer: :class:`DenseKV` for 16 bits, else :class:`QuantKV`.

    Raises:
        InputError: an option outside its range (:func:`check_kv_options`).
    """
    check_kv_options(kv_bits, kv_group, key_quant, sinks_full_precision)
    if kv_bits == 16:
        return DenseKV()
    return QuantKV(kv_bits, kv_group, key_quant, sinks_full_precision)


__all__ = ["KV_BITS", "KEY_QUANT", "DETECTED", "parse_sinks_full_precision", "check_storage_options", "quantize_minmax", "dequantize", "pack_codes", "unpack_codes", "DenseKV", "QuantKV",
           "make_store", "check_kv_options"]
