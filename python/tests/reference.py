"""Float64 NumPy implementations the tests check flashlab against, written from the
specifications (docs/attention.md, docs/mta.md, docs/stream.md) and sharing no code with the
package or the library: plain dense formulas, loops where the specification is a procedure.
"""

import math

import numpy as np

LOG2E = 1.0 / math.log(2.0)


def attention(q, k, v, causal=False, scale=None, window=(-1, -1)):
    """(O, LSE base 2) of softmax(scale·QKᵀ)V for q [B, N, H, d], k, v [B, Nk, Hkv, d] (Hkv | H).
    window (left, right): query i sees keys i + Nk − N − left … i + Nk − N + right (−1: unbounded).
    A row that sees no key (causal with N > Nk, a window past every key) gets O = 0 and LSE = −inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, N, H, d = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = H // Hkv
    o = np.zeros((B, N, H, d))
    lse = np.full((B, H, N), -np.inf)
    visible = np.ones((N, Nk), dtype=bool)
    diag = np.arange(N)[:, None] + (Nk - N)
    if causal:
        visible = np.arange(Nk)[None, :] <= diag
    if window[0] >= 0:
        visible = visible & (np.arange(Nk)[None, :] >= diag - window[0])
    if window[1] >= 0:
        visible = visible & (np.arange(Nk)[None, :] <= diag + window[1])
    for b in range(B):
        for h in range(H):
            s = scale * q[b, :, h, :] @ k[b, :, h // group, :].T
            s = np.where(visible, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            seen = np.isfinite(m[:, 0])
            m = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(s - m)
            l = p.sum(axis=1, keepdims=True)
            o[b, seen, h, :] = (p[seen] / l[seen]) @ v[b, :, h // group, :]
            lse[b, h, seen] = (m[seen, 0] + np.log(l[seen, 0])) * LOG2E
    return o, lse


def mta(q, k, v, w, scale=None):
    """O of causal Multi-Token Attention, docs/mta.md's five steps, for q, k, v [B, N, H, d],
    w [H, cq, ck]: the convolution is a scalar loop over the kernel taps."""
    q, k, v, w = (np.asarray(x, dtype=np.float64) for x in (q, k, v, w))
    B, N, H, d = q.shape
    cq, ck = w.shape[1], w.shape[2]
    Pq, Pk = cq - 1, (ck - 1) // 2
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    future = np.arange(N)[None, :] > np.arange(N)[:, None]
    o = np.zeros((B, N, H, d))
    for b in range(B):
        for h in range(H):
            s = scale * q[b, :, h, :] @ k[b, :, h, :].T
            s[future] = 0.0
            padded = np.zeros((N + Pq, N + 2 * Pk))
            padded[Pq:, Pk:Pk + N] = s
            conv = np.zeros((N, N))
            for a in range(cq):
                for c in range(ck):
                    # Ŝ[i, j] += W[a, c] · S[i + a − Pq, j + c − Pk]
                    conv += w[h, a, c] * padded[a:a + N, c:c + N]
            conv[future] = -np.inf
            p = np.exp(conv - conv.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            o[b, :, h, :] = p @ v[b, :, h, :]
    return o


def finite_difference(f, x, do, h=1e-6):
    """∂(Σ f(x)∘do)/∂x by central differences, element by element (tiny x only)."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + h
        up = np.sum(f(x) * do)
        flat[i] = keep - h
        down = np.sum(f(x) * do)
        flat[i] = keep
        gflat[i] = (up - down) / (2 * h)
    return g


# ------------------------------------------------------------------------------------------------
# STREAM: the literal specification of docs/stream.md
# ------------------------------------------------------------------------------------------------

def _block_valid(qb, r, T, bq, bk, user):
    """C_blk[q, r]: some token pair s ≤ t of the two blocks exists, and the user mask allows it."""
    last_t = min(T - 1, (qb + 1) * bq - 1)
    return r * bk <= last_t and r * bk < T and (user is None or bool(user[qb, r]))


def _score(q, k, qb, r, T, bq, bk):
    """max ⟨q_t, k_s⟩ over the token-valid pairs (s ≤ t < T) of blocks (qb, r), NaN read as −inf;
    −inf if there is none."""
    rows = np.arange(qb * bq, min(T, (qb + 1) * bq))
    cols = np.arange(r * bk, min(T, (r + 1) * bk))
    if rows.size == 0 or cols.size == 0:
        return -np.inf
    s = q[rows] @ k[cols].T
    s = np.where(np.isnan(s) | (cols[None, :] > rows[:, None]), -np.inf, s)
    return float(s.max())


def stream_estimate(q, k, k_blocks, bq=64, bk=64, mask=None):
    """Indices [n_q, k_blocks] by the specification: initial branches, n_it bisection rounds,
    candidates ordered by τ = (score desc, r, branch_id, split_bit), first k kept."""
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    T = q.shape[0]
    n_q, n_k = -(-T // bq), -(-T // bk)
    n_it = math.ceil(math.log2(n_k)) if n_k > 1 else 0
    out = np.full((n_q, k_blocks), -1, dtype=np.int64)
    for qb in range(n_q):
        valid = [r for r in range(n_k) if _block_valid(qb, r, T, bq, bk, mask)]
        valid_set = set(valid)
        if not valid:
            continue
        lo, hi = valid[0], valid[-1]

        def candidate(a, b, bid, bit):
            reps = [r for r in range(a, b + 1) if r in valid_set]
            if not reps:
                return None
            return (-_score(q, k, qb, reps[0], T, bq, bk), reps[0], bid, bit, a, b)

        L = hi - lo + 1
        nb = min(k_blocks, L)
        kept, a = [], lo
        for i in range(nb):
            length = L // nb + (1 if i < L % nb else 0)
            c = candidate(a, a + length - 1, i, 0)
            if c is not None:
                kept.append(c)
            a += length
        kept.sort(key=lambda c: c[:4])
        for _ in range(n_it):
            cands = []
            for (_, _, bid, _, a, b) in kept:
                left = (b - a + 2) // 2  # ⌈len/2⌉
                for c in (candidate(a, a + left - 1, 2 * bid, 0),
                          candidate(a + left, b, 2 * bid + 1, 1) if a + left <= b else None):
                    if c is not None:
                        cands.append(c)
            cands.sort(key=lambda c: c[:4])
            kept = cands[:k_blocks]
        for j, c in enumerate(kept):
            out[qb, j] = c[1]
    return out


def stream_trace(q, k, v, indices, bq=64, bk=64):
    """(O [T, d], edges as a dict of arrays) of the sparse softmax over the selected blocks."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    T, d = q.shape
    n_q, kb = indices.shape
    o = np.zeros((T, d))
    edges = {f: np.zeros(n_q * kb) for f in ("q", "r", "slot", "score", "mass", "value_norm")}
    for qb in range(n_q):
        rows = np.arange(qb * bq, min(T, (qb + 1) * bq))
        blocks = [int(r) for r in indices[qb] if r >= 0]
        keys = np.concatenate([np.arange(r * bk, min(T, (r + 1) * bk)) for r in blocks]) if blocks else np.zeros(0, int)
        s = q[rows] @ k[keys].T
        s = np.where(keys[None, :] <= rows[:, None], s, -np.inf)
        m = s.max(axis=1, keepdims=True) if keys.size else np.full((rows.size, 1), -np.inf)
        seen = np.isfinite(m[:, 0])
        p = np.zeros_like(s)
        p[seen] = np.exp(s[seen] - m[seen])
        p[seen] /= p[seen].sum(axis=1, keepdims=True)
        o[rows] = p @ v[keys]
        for j in range(kb):
            e = qb * kb + j
            r = int(indices[qb, j])
            edges["q"][e], edges["slot"][e], edges["r"][e] = qb, j, r
            if r < 0:
                continue
            cols = (keys >= r * bk) & (keys < (r + 1) * bk)
            edges["score"][e] = _score(q, k, qb, r, T, bq, bk)
            edges["mass"][e] = p[:, cols].sum()
            edges["value_norm"][e] = np.linalg.norm((p[:, cols] @ v[keys[cols]]).sum(axis=0))
    return o, edges
