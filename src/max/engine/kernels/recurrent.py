"""Kernels for ``max.graph.ops.recurrent``: ``causal_conv1d``, ``selective_scan``, ``gated_delta_rule``.

Requests with one token this step (decode) run together through the recurrent form -- on float32 CPU
tensors the native kernels of the node's ``native`` variant (set at lowering; ``csrc/recurrent.c``: each
slot updated in place in one pass), else torch --
and the others (prefill, chunks of a prompt) one by one through the chunked form, so a step mixing
prefill and decode requests keeps the decode rows batched.

Each reads request ``b``'s state from ``state[slots[b]]`` and writes the state after its last token
back.  The chunked form takes ``chunk_size`` tokens at a time: the within-chunk part as dense products,
the state carried between chunks.  Half-precision
inputs are computed in float32.  Slots are gathered and written back with ``index_select`` /
``index_copy_`` (advanced indexing opens a thread-parallel region even for a few kilobytes, which costs
milliseconds on a busy host).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel

_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _native(native: str | None, state: torch.Tensor, *ts: torch.Tensor):
    """The library of kernel variant ``native`` when a decode step can run there (CPU, float32, contiguous
    state), else None."""
    if not native or state.device.type != "cpu" or state.dtype != torch.float32 or not state.is_contiguous():
        return None
    if any(t is not None and t.dtype != torch.float32 for t in ts):
        return None
    from max.engine.native import library

    return library(native)


def _c(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _slot_stride(state: torch.Tensor) -> int:
    return state[0].numel() if state.shape[0] else 0


_last_layout: tuple = ((), None)
"""The last step's layout, keyed by its ``slots`` / ``offsets`` tensors (held, with their versions): every
recurrent layer of a step reads the same two tensors, so the step's layout is worked out and checked once."""


def _layout(op: str, slots: torch.Tensor, offsets: torch.Tensor, n_slots: int, n_tokens: int) -> tuple:
    """(slot ids int64 [B], the one-token requests' (token rows, slots) or None, the longer requests'
    [(start, end, slot)])."""
    global _last_layout
    key, res = _last_layout
    if (key and key[0] is slots and key[1] is offsets and key[2:] == (slots._version, offsets._version, n_slots,
                                                                       n_tokens)):
        return res
    res = _work_out_layout(op, slots, offsets, n_slots, n_tokens)
    _last_layout = ((slots, offsets, slots._version, offsets._version, n_slots, n_tokens), res)
    return res


def _work_out_layout(op: str, slots: torch.Tensor, offsets: torch.Tensor, n_slots: int, n_tokens: int) -> tuple:
    offs = [int(o) for o in offsets.tolist()]
    sl = slots.to(torch.int64).reshape(-1)
    B = sl.shape[0]
    if len(offs) != B + 1:
        raise ValueError(f"{op}: input_row_offsets has {len(offs)} entries but slots names {B} requests "
                         f"(expected batch + 1 = {B + 1})")
    if (offs and offs[0] != 0) or any(b < a for a, b in zip(offs, offs[1:])) or (offs and offs[-1] != n_tokens):
        raise ValueError(f"{op}: input_row_offsets must rise from 0 to the {n_tokens} tokens, got {offs}")
    if B and (int(sl.min()) < 0 or int(sl.max()) >= n_slots):
        raise ValueError(f"{op}: slot ids {sl.tolist()} out of range for a state of {n_slots} slots")
    if B and torch.unique(sl).numel() != B:
        raise ValueError(f"{op}: two requests share a state slot: {sl.tolist()}")
    spans = list(zip(offs[:-1], offs[1:]))
    one = [b for b, (lo, hi) in enumerate(spans) if hi - lo == 1]
    multi = [(lo, hi, int(sl[b])) for b, (lo, hi) in enumerate(spans) if hi - lo > 1]
    single = None
    if one:
        if len(one) == B:
            single = (None, sl.contiguous())  # every row: no gather
        else:
            idx = torch.tensor(one, dtype=torch.int64)
            single = (torch.tensor([spans[b][0] for b in one], dtype=torch.int64), sl.index_select(0, idx))
    return sl, single, multi


def _rows(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    return _c(t) if rows is None else t.index_select(0, rows)


def _put(y: torch.Tensor, rows: torch.Tensor | None, v: torch.Tensor) -> None:
    if rows is None:
        y.copy_(v)
    else:
        y.index_copy_(0, rows, v)


def _segment_decay(cum: torch.Tensor) -> torch.Tensor:
    """``exp(cum[i] - cum[j])`` for ``j <= i`` and 0 above the diagonal: ``[L, L, H]`` from ``cum [L, H]``."""
    L = cum.shape[0]
    diff = cum[:, None, :] - cum[None, :, :]
    mask = torch.ones(L, L, dtype=torch.bool, device=cum.device).tril()[:, :, None]
    return torch.exp(diff.masked_fill(~mask, float("-inf")))


def _heads(t: torch.Tensor, H: int) -> torch.Tensor:
    """``[..., G, N]`` -> ``[..., H, N]``: head ``h`` reads group ``h // (H / G)``."""
    return t.repeat_interleave(H // t.shape[-2], dim=-2)


def _check(op: str, rc: int) -> None:
    if rc != 0:
        raise RuntimeError(f"{op}: native kernel failed with code {rc}")


# ------------------------------------------------------------------------------------------ conv1d
def _conv_step(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor,
               sl: torch.Tensor, silu: bool, ct: torch.dtype, native: str | None) -> tuple[torch.Tensor, bool]:
    """One token per request: ``x [B, C]`` -> (output, whether bias and SiLU were applied already: the
    native kernel applies them, the torch path leaves them to the caller)."""
    so = _native(native, state, x, w, bias)
    if so is not None:
        y = torch.empty(x.shape, dtype=torch.float32)
        _check("causal_conv1d", so.lmx_conv1d_decode(
            x.shape[0], x.shape[1], w.shape[1], x.data_ptr(), x.stride(0), _c(w).data_ptr(),
            0 if bias is None else _c(bias).data_ptr(), state.data_ptr(), sl.data_ptr(), _slot_stride(state),
            int(silu), y.data_ptr()))
        return y, True
    xp = torch.cat([state.index_select(0, sl).to(ct), x.to(ct)[:, :, None]], -1)  # [B, C, K]
    state.index_copy_(0, sl, xp[:, :, 1:].to(state.dtype))
    return (xp * w.to(ct)).sum(-1), False


@kernel("causal_conv1d", pure=False)
def causal_conv1d(x: torch.Tensor, w: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                  offsets: torch.Tensor, *rest: torch.Tensor, has_bias: bool, silu: bool,
                  native: str | None = None) -> torch.Tensor:
    ct = _WIDE.get(x.dtype, x.dtype)
    _, single, multi = _layout("causal_conv1d", slots, offsets, state.shape[0], x.shape[0])
    K = w.shape[1]
    wc = w.to(ct)
    bias = rest[0] if has_bias else None
    y = torch.empty(x.shape, dtype=ct, device=x.device)

    def finish(v: torch.Tensor) -> torch.Tensor:
        if bias is not None:
            v = v + bias.to(ct)
        return F.silu(v) if silu else v

    if single is not None:
        rows, ssl = single
        xr = x if rows is None and x.stride(-1) == 1 else _rows(x, rows)  # a column slice: its row stride
        v, done = _conv_step(xr, w, bias, state, ssl, silu, ct, native)
        _put(y, rows, v.to(ct) if done else finish(v))
    for lo, hi, s in multi:
        xp = torch.cat([state[s].to(ct), x[lo:hi].to(ct).T], 1)  # [C, K - 1 + n]
        y[lo:hi] = finish(F.conv1d(xp[None], wc[:, None, :], groups=wc.shape[0])[0].T)
        state[s] = xp[:, xp.shape[1] - (K - 1):].to(state.dtype)
    return y.to(x.dtype)


def _softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(x))`` as the graph writes it (``max(x, 0) + log1p(exp(-|x|))``)."""
    return torch.relu(x) + torch.log1p(torch.exp(-x.abs()))


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its rows are uniformly strided with contiguous inner dims (a column slice of a
    contiguous matrix, as the ops' inputs usually are), else a contiguous copy."""
    if t.is_contiguous():
        return t
    inner = 1
    for d in range(t.dim() - 1, 0, -1):
        if t.shape[d] != 1 and t.stride(d) != inner:
            return t.contiguous()
        inner *= t.shape[d]
    return t


def _row(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else t[0].numel()


# ------------------------------------------------------------------------------------------ SSD scan
def _ssd_step(x, dt, A, B, C, D, dt_bias, dt_args, state, sl, ct, native):
    """One token per request: ``x [B, H, P]`` -> ``y [B, H, P]`` (D skip included); ``dt`` raw when
    ``dt_args`` = (softplus, low, high) asks for the softplus."""
    H = x.shape[1]
    so = _native(native, state, x, dt, A, B, C, D, dt_bias)
    if so is not None:
        xs, ds, Bs, Cs = (_strided(t) for t in (x, dt, B, C))
        if _row(Bs) != _row(Cs):
            Bs, Cs = _c(Bs), _c(Cs)
        y = torch.empty(x.shape, dtype=torch.float32)
        _check("selective_scan", so.lmx_ssd_decode(
            x.shape[0], H, x.shape[2], B.shape[1], B.shape[2], xs.data_ptr(), _row(xs), ds.data_ptr(), _row(ds),
            _c(A).data_ptr(), Bs.data_ptr(), Cs.data_ptr(), _row(Bs), 0 if D is None else _c(D).data_ptr(),
            0 if dt_bias is None else _c(dt_bias).data_ptr(), int(dt_args[0]), dt_args[1], dt_args[2],
            state.data_ptr(), sl.data_ptr(), _slot_stride(state), y.data_ptr()))
        return y
    xc, Ac = x.to(ct), A.to(ct)
    dtc = _step_size(dt, dt_bias, dt_args, ct)
    Bh, Ch = _heads(B.to(ct), H), _heads(C.to(ct), H)
    h = state.index_select(0, sl).to(ct)  # [B, H, P, N]
    h = h * torch.exp(dtc * Ac)[:, :, None, None] + (dtc[:, :, None] * xc)[..., None] * Bh[:, :, None, :]
    state.index_copy_(0, sl, h.to(state.dtype))
    y = torch.einsum("bhpn,bhn->bhp", h, Ch)
    return y + D.to(ct)[:, None] * xc if D is not None else y


def _step_size(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_args: tuple, ct: torch.dtype) -> torch.Tensor:
    d = dt.to(ct)
    if not dt_args[0]:
        return d
    d = _softplus(d + dt_bias.to(ct) if dt_bias is not None else d)
    lo, hi = dt_args[1:]
    if lo > 0:
        d = d.clamp(min=lo)
    return d.clamp(max=hi) if hi != float("inf") else d


@kernel("selective_scan", pure=False)
def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   state: torch.Tensor, slots: torch.Tensor, offsets: torch.Tensor, *rest: torch.Tensor,
                   has_d: bool, chunk_size: int, has_dt_bias: bool = False, dt_softplus: bool = False,
                   dt_min: float = 0.0, dt_max: float = float("inf"), native: str | None = None) -> torch.Tensor:
    ct = _WIDE.get(x.dtype, x.dtype)
    _, single, multi = _layout("selective_scan", slots, offsets, state.shape[0], x.shape[0])
    T, H, P = x.shape
    if H % B.shape[1]:
        raise ValueError(f"selective_scan: {H} heads are not a multiple of {B.shape[1]} groups")
    D = rest[0] if has_d else None
    dt_bias = rest[int(has_d)] if has_dt_bias else None
    dt_args = (dt_softplus, dt_min, dt_max)
    if single is not None:
        rows, ssl = single
        if rows is None:
            v = _ssd_step(x, dt, A, B, C, D, dt_bias, dt_args, state, ssl, ct, native)
            if v.dtype == x.dtype:  # every request decodes: the step's output is the op's
                return v
        else:
            v = _ssd_step(*(t.index_select(0, rows) for t in (x, dt)), A, *(t.index_select(0, rows) for t in (B, C)),
                          D, dt_bias, dt_args, state, ssl, ct, native)
    y = torch.zeros((T, H, P), dtype=ct, device=x.device)
    if single is not None:
        _put(y, single[0], v.to(ct))
    if multi:
        xc, dtc, Ac = x.to(ct), _step_size(dt, dt_bias, dt_args, ct), A.to(ct)
        Bh, Ch = _heads(B.to(ct), H), _heads(C.to(ct), H)  # [T, H, N]
        Dc = D.to(ct) if D is not None else None
    for lo, hi, s in multi:
        h = state[s].to(ct)  # [H, P, N]
        for c0 in range(lo, hi, chunk_size):
            c1 = min(hi, c0 + chunk_size)
            xs, ds, bs, cs = xc[c0:c1], dtc[c0:c1], Bh[c0:c1], Ch[c0:c1]
            cum = torch.cumsum(ds * Ac, 0)  # [L, H]
            decay = _segment_decay(cum)  # [L, L, H]
            cb = torch.einsum("ihn,jhn->ijh", cs, bs) * decay
            y[c0:c1] = (torch.einsum("ijh,jhp->ihp", cb, ds[:, :, None] * xs)
                        + torch.einsum("ihn,hpn->ihp", cs, h) * torch.exp(cum)[:, :, None])
            if Dc is not None:
                y[c0:c1] += Dc[:, None] * xs
            last = torch.exp(cum[-1][None, :] - cum) * ds  # [L, H]
            h = h * torch.exp(cum[-1])[:, None, None] + torch.einsum("jh,jhp,jhn->hpn", last, xs, bs)
        state[s] = h.to(state.dtype)
    return y.to(x.dtype)


# ------------------------------------------------------------------------------------------ gated delta rule
def _gdr_prepare(q, k, g, beta, H, A, dt_bias, prep, ct):
    """The plain op's inputs from the prepared form: q/k with ``H`` heads (L2-normalised, q scaled), the
    log decay and beta (``prep`` = (beta_sigmoid, qk_l2norm, scale))."""
    beta_sigmoid, l2, scale = prep
    qc, kc, gc, bc = (t.to(ct) for t in (q, k, g, beta))
    if l2:
        qc = qc * torch.rsqrt((qc * qc).sum(-1, keepdim=True) + 1e-6)
        kc = kc * torch.rsqrt((kc * kc).sum(-1, keepdim=True) + 1e-6)
    if scale != 1.0:
        qc = qc * scale
    if qc.shape[1] != H:
        qc, kc = qc.repeat_interleave(H // qc.shape[1], 1), kc.repeat_interleave(H // kc.shape[1], 1)
    if A is not None:
        gc = A.to(ct) * _softplus(gc + dt_bias.to(ct) if dt_bias is not None else gc)
    if beta_sigmoid:
        bc = torch.sigmoid(bc)
    return qc, kc, gc, bc


def _gdr_step(q, k, v, g, beta, A, dt_bias, prep, state, sl, ct, native):
    """One token per request: ``o [B, H, V]``."""
    H = v.shape[1]
    so = _native(native, state, q, k, v, g, beta, A, dt_bias)
    if so is not None:
        qs, ks, vs, gs, bs = (_strided(t) for t in (q, k, v, g, beta))
        if _row(gs) != _row(bs):
            gs, bs = _c(gs), _c(bs)
        o = torch.empty(v.shape, dtype=torch.float32)
        _check("gated_delta_rule", so.lmx_gdr_decode(
            q.shape[0], H, q.shape[1], q.shape[2], v.shape[2], qs.data_ptr(), _row(qs), ks.data_ptr(), _row(ks),
            vs.data_ptr(), _row(vs), gs.data_ptr(), bs.data_ptr(), _row(gs), 0 if A is None else _c(A).data_ptr(),
            0 if dt_bias is None else _c(dt_bias).data_ptr(), int(prep[0]), int(prep[1]), prep[2],
            state.data_ptr(), sl.data_ptr(), _slot_stride(state), o.data_ptr()))
        return o
    qc, kc, gc, bc = _gdr_prepare(q, k, g, beta, H, A, dt_bias, prep, ct)
    vc = v.to(ct)
    S = state.index_select(0, sl).to(ct) * torch.exp(gc)[:, :, None, None]  # [B, H, K, V]
    delta = (vc - torch.einsum("bhkv,bhk->bhv", S, kc)) * bc[:, :, None]
    S = S + kc[..., None] * delta[:, :, None, :]
    state.index_copy_(0, sl, S.to(state.dtype))
    return torch.einsum("bhkv,bhk->bhv", S, qc)


@kernel("gated_delta_rule", pure=False)
def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor, slots: torch.Tensor, offsets: torch.Tensor, *rest: torch.Tensor,
                     chunk_size: int, has_a: bool = False, has_dt_bias: bool = False, beta_sigmoid: bool = False,
                     qk_l2norm: bool = False, scale: float = 1.0, native: str | None = None) -> torch.Tensor:
    ct = _WIDE.get(v.dtype, v.dtype)
    _, single, multi = _layout("gated_delta_rule", slots, offsets, state.shape[0], q.shape[0])
    T, H, V = v.shape
    if H % q.shape[1]:
        raise ValueError(f"gated_delta_rule: {H} value heads are not a multiple of {q.shape[1]} q/k heads")
    A = rest[0] if has_a else None
    dt_bias = rest[1] if has_dt_bias else None
    prep = (beta_sigmoid, qk_l2norm, scale)
    if single is not None:
        rows, ssl = single
        ins = (q, k, v, g, beta) if rows is None else tuple(t.index_select(0, rows) for t in (q, k, v, g, beta))
        r = _gdr_step(*ins, A, dt_bias, prep, state, ssl, ct, native)
        if rows is None and r.dtype == v.dtype:  # every request decodes: the step's output is the op's
            return r
    o = torch.zeros((T, H, V), dtype=ct, device=v.device)
    if single is not None:
        _put(o, single[0], r.to(ct))
    if multi:
        qc, kc, gc, bc = _gdr_prepare(q, k, g, beta, H, A, dt_bias, prep, ct)
        vc = v.to(ct)
    for lo, hi, s in multi:
        S = state[s].to(ct)  # [H, K, V]
        for c0 in range(lo, hi, chunk_size):
            c1 = min(hi, c0 + chunk_size)
            qs, ks, vs, bs = qc[c0:c1], kc[c0:c1], vc[c0:c1], bc[c0:c1]
            L = c1 - c0
            G = torch.cumsum(gc[c0:c1], 0)  # [L, H]
            decay = _segment_decay(G)  # [L, L, H]: exp(G_i - G_j), j <= i
            eG = torch.exp(G)
            # u_j + beta_j sum_{m<j} exp(G_j - G_m) (k_j . k_m) u_m = beta_j (v_j - exp(G_j) S^T k_j)
            strict = decay * torch.ones(L, L, dtype=torch.bool, device=v.device).tril(-1)[:, :, None]
            a = torch.einsum("jhk,mhk->hjm", ks, ks) * strict.permute(2, 0, 1) * bs.T[:, :, None]
            rhs = bs[:, :, None] * (vs - eG[:, :, None] * torch.einsum("jhk,hkv->jhv", ks, S))
            eye = torch.eye(L, dtype=ct, device=v.device)
            u = torch.linalg.solve_triangular(eye + a, rhs.permute(1, 0, 2), upper=False,
                                              unitriangular=True)  # [H, L, V]
            qk = torch.einsum("ihk,jhk->hij", qs, ks) * decay.permute(2, 0, 1)
            o[c0:c1] = (torch.einsum("hij,hjv->ihv", qk, u)
                        + eG[:, :, None] * torch.einsum("ihk,hkv->ihv", qs, S))
            last = torch.exp(G[-1][None, :] - G)  # [L, H]
            S = S * torch.exp(G[-1])[:, None, None] + torch.einsum("jh,jhk,hjv->hkv", last, ks, u)
        state[s] = S.to(state.dtype)
    return o.to(v.dtype)
