"""Part: operators. The compiled state replay of the rules operator: every state key of a Spark partition in one call.

Each state's forks are replayed in processing order exactly as `rules_kernel.py` states the rules (store,
evaluate, reset; with `order: arrival` also clears and cleanup timers), in O(log m) per fork (m the state's
distinct event times), never by scanning a window:

* event times are compressed to bucket numbers; a bucket holds the transactions of one event time;
* per aggregated field, Fenwick trees over the buckets give the sum and the count of a window, and two
  segment trees its minimum and maximum;
* every removal (cleanup below a threshold, CLEAR_STATE_ALL, a reset) removes whole buckets, found in
  order through a Fenwick tree of the non-empty ones, so each stored entry is removed at most once;
* cleanup timers wait in a heap by time, or, registered at or below the watermark, in arrival order for
  the next rise.

Values are integers at a fixed scale per field (the caller scales the decimals); counting rules are a field of
ones. The caller falls back to the exact decimal replay where values do not fit.
"""
from __future__ import annotations

import numpy as np
from numba import njit

SUM, AVG, MIN, MAX = 0, 1, 2, 3
EQUAL, NOT_EQUAL, GREATER, LESS, GREATER_EQUAL, LESS_EQUAL = 0, 1, 2, 3, 4, 5
BIG = np.int64(2**62)


@njit(cache=True)
def _fw_add(tree, i, delta):
    i += 1
    n = tree.shape[0]
    while i <= n:
        tree[i - 1] += delta
        i += i & (-i)


@njit(cache=True)
def _fw_prefix(tree, i):
    """Sum of tree[0..i]."""
    s = 0
    i += 1
    while i > 0:
        s += tree[i - 1]
        i -= i & (-i)
    return s


@njit(cache=True)
def _fw_first(tree, m):
    """The smallest index whose prefix sum is >= 1 (tree of 0/1 counts), or m."""
    pos = 0
    step = 1
    while step * 2 <= m:
        step *= 2
    rem = 1
    while step > 0:
        nxt = pos + step
        if nxt <= m and tree[nxt - 1] < rem:
            pos = nxt
            rem -= tree[nxt - 1]
        step //= 2
    return pos


@njit(cache=True)
def _seg_set(tree, size, i, value, is_min):
    i += size
    tree[i] = value
    i //= 2
    while i >= 1:
        a, b = tree[2 * i], tree[2 * i + 1]
        tree[i] = min(a, b) if is_min else max(a, b)
        i //= 2


@njit(cache=True)
def _seg_query(tree, size, lo, hi, is_min):
    """min or max over [lo, hi] (inclusive)."""
    res = BIG if is_min else -BIG
    lo += size
    hi += size + 1
    while lo < hi:
        if lo & 1:
            res = min(res, tree[lo]) if is_min else max(res, tree[lo])
            lo += 1
        if hi & 1:
            hi -= 1
            res = min(res, tree[hi]) if is_min else max(res, tree[hi])
        lo //= 2
        hi //= 2
    return res


@njit(cache=True)
def _holds(value, cnt, op, limit, avg):
    # AVG: sum / cnt op limit  <=>  sum op limit * cnt (cnt > 0)
    right = limit * cnt if avg else limit
    if op == EQUAL:
        return value == right
    if op == NOT_EQUAL:
        return value != right
    if op == GREATER:
        return value > right
    if op == LESS:
        return value < right
    if op == GREATER_EQUAL:
        return value >= right
    return value <= right


@njit(cache=True)
def _heap_push(heap_t, heap_s, size, t, s):
    i = size
    heap_t[i] = t
    heap_s[i] = s
    while i > 0:
        p = (i - 1) // 2
        if heap_t[p] <= heap_t[i]:
            break
        heap_t[p], heap_t[i] = heap_t[i], heap_t[p]
        heap_s[p], heap_s[i] = heap_s[i], heap_s[p]
        i = p
    return size + 1


@njit(cache=True)
def _heap_pop(heap_t, heap_s, size):
    size -= 1
    heap_t[0], heap_s[0] = heap_t[size], heap_s[size]
    i = 0
    while True:
        a, b, m = 2 * i + 1, 2 * i + 2, i
        if a < size and heap_t[a] < heap_t[m]:
            m = a
        if b < size and heap_t[b] < heap_t[m]:
            m = b
        if m == i:
            break
        heap_t[m], heap_t[i] = heap_t[i], heap_t[m]
        heap_s[m], heap_s[i] = heap_s[i], heap_s[m]
        i = m
    return size


@njit(cache=True)
def replay(bounds, t, rec, ident, version, vals, valid, wm, nclear, cidx, widest_now, c_wm, c_widest,
           v_active, v_window, v_field, v_agg, v_op, v_limit, v_resets, arrival, demo, out_alert, out_value,
           out_count):
    """Replay every state (forks bounds[g]..bounds[g+1]-1, in processing order); fill the out_* arrays.

    Returns the first fork (in the array) where compat: demo fails, or -1.
    """
    nfields = vals.shape[1]
    present = np.zeros(ident.max() + 1 if ident.shape[0] else 1, dtype=np.bool_)
    for g in range(bounds.shape[0] - 1):
        lo_f, hi_f = bounds[g], bounds[g + 1]
        n = hi_f - lo_f
        times = np.unique(t[lo_f:hi_f])
        m = times.shape[0]
        size = 1
        while size < m:
            size *= 2
        sums = np.zeros((nfields, m), dtype=np.int64)
        cnts = np.zeros((nfields, m), dtype=np.int64)
        bsum = np.zeros((nfields, m), dtype=np.int64)
        bcnt = np.zeros((nfields, m), dtype=np.int64)
        bmin = np.full((nfields, m), BIG, dtype=np.int64)
        bmax = np.full((nfields, m), -BIG, dtype=np.int64)
        segmin = np.full((nfields, 2 * size), BIG, dtype=np.int64)
        segmax = np.full((nfields, 2 * size), -BIG, dtype=np.int64)
        nonempty = np.zeros(m, dtype=np.int64)
        filled = np.zeros(m, dtype=np.bool_)
        head = np.full(m, -1, dtype=np.int64)
        nxt = np.full(n, -1, dtype=np.int64)
        live = 0
        # timers: slot -> time, watermark and fork at registration
        timer_t = np.zeros(n, dtype=np.int64)
        timer_wm = np.zeros(n, dtype=np.int64)
        timer_reg = np.zeros(n, dtype=np.int64)
        slots = 0
        pending = dict()
        heap_t = np.zeros(n, dtype=np.int64)
        heap_s = np.zeros(n, dtype=np.int64)
        heap_n = 0
        late_q = np.zeros(n, dtype=np.int64)
        late_head = 0
        late_tail = 0

        for k in range(n):
            f = lo_f + k
            # ---- between transactions: clears, then due timers (arrival order only)
            if arrival and k > 0 and rec[f] != rec[f - 1]:
                if nclear[f] > nclear[f - 1]:
                    while live > 0:
                        c = _fw_first(nonempty, m)
                        live = _remove(c, nfields, sums, cnts, bsum, bcnt, bmin, bmax, segmin, segmax, size,
                                       nonempty, filled, head, nxt, present, ident, lo_f, live)
                w_now = wm[f]
                # late-registered timers (time <= watermark then): due at the first rise after them
                while late_head < late_tail and timer_wm[late_q[late_head]] < w_now:
                    s = late_q[late_head]
                    late_head += 1
                    live = _fire(s, f, timer_t, timer_wm, timer_reg, cidx, widest_now, c_wm, c_widest, times, m,
                                 nfields, sums, cnts, bsum, bcnt, bmin, bmax, segmin, segmax, size, nonempty,
                                 filled, head, nxt, present, ident, lo_f, live, pending)
                while heap_n > 0 and heap_t[0] <= w_now:
                    s = heap_s[0]
                    heap_n = _heap_pop(heap_t, heap_s, heap_n)
                    live = _fire(s, f, timer_t, timer_wm, timer_reg, cidx, widest_now, c_wm, c_widest, times, m,
                                 nfields, sums, cnts, bsum, bcnt, bmin, bmax, segmin, segmax, size, nonempty,
                                 filled, head, nxt, present, ident, lo_f, live, pending)
            # ---- store the transaction (a set: once per identity)
            c = np.searchsorted(times, t[f])
            if not present[ident[f]]:
                present[ident[f]] = True
                nxt[k] = head[c]
                head[c] = k
                if not filled[c]:
                    filled[c] = True
                    _fw_add(nonempty, c, 1)
                    live += 1
                for j in range(nfields):
                    if valid[f, j]:
                        v = vals[f, j]
                        _fw_add(sums[j], c, v)
                        _fw_add(cnts[j], c, 1)
                        bsum[j, c] += v
                        bcnt[j, c] += 1
                        if v < bmin[j, c]:
                            bmin[j, c] = v
                            _seg_set(segmin[j], size, c, v, True)
                        if v > bmax[j, c]:
                            bmax[j, c] = v
                            _seg_set(segmax[j], size, c, v, False)
            ver = version[f]
            if not v_active[ver]:
                continue
            # ---- evaluate
            if arrival:
                tt = t[f]
                timer = (tt // 1000) * 1000 if tt >= 0 else -((-tt) // 1000) * 1000
                if timer not in pending:
                    pending[timer] = slots
                    timer_t[slots] = timer
                    timer_wm[slots] = wm[f]
                    timer_reg[slots] = f
                    if timer <= wm[f]:
                        late_q[late_tail] = slots
                        late_tail += 1
                    else:
                        heap_n = _heap_push(heap_t, heap_s, heap_n, timer, slots)
                    slots += 1
            j = v_field[ver]
            lo_c = np.searchsorted(times, t[f] - v_window[ver])
            cnt = _fw_prefix(cnts[j], c) - (_fw_prefix(cnts[j], lo_c - 1) if lo_c > 0 else 0)
            agg = v_agg[ver]
            if agg == SUM or agg == AVG:
                value = _fw_prefix(sums[j], c) - (_fw_prefix(sums[j], lo_c - 1) if lo_c > 0 else 0)
            elif agg == MIN:
                value = _seg_query(segmin[j], size, lo_c, c, True)
            else:
                value = _seg_query(segmax[j], size, lo_c, c, False)
            if demo and (agg == AVG or (agg == MAX and _seg_query(segmin[j], size, lo_c, c, True) <= 0)):
                return f
            out_value[f] = value
            out_count[f] = cnt
            if _holds(value, cnt, v_op[ver], v_limit[ver], agg == AVG):
                out_alert[f] = True
                if v_resets[ver]:
                    while live > 0:
                        cc = _fw_first(nonempty, m)
                        live = _remove(cc, nfields, sums, cnts, bsum, bcnt, bmin, bmax, segmin, segmax, size,
                                       nonempty, filled, head, nxt, present, ident, lo_f, live)
        # the next state starts empty: forget this one's identities
        for k in range(n):
            present[ident[lo_f + k]] = False
    return -1


@njit(cache=True)
def _remove(c, nfields, sums, cnts, bsum, bcnt, bmin, bmax, segmin, segmax, size, nonempty, filled, head, nxt,
            present, ident, lo_f, live):
    """Empty bucket c (every transaction of that event time)."""
    for j in range(nfields):
        if bcnt[j, c]:
            _fw_add(sums[j], c, -bsum[j, c])
            _fw_add(cnts[j], c, -bcnt[j, c])
            bsum[j, c] = 0
            bcnt[j, c] = 0
            bmin[j, c] = BIG
            bmax[j, c] = -BIG
            _seg_set(segmin[j], size, c, BIG, True)
            _seg_set(segmax[j], size, c, -BIG, False)
    e = head[c]
    while e >= 0:
        present[ident[lo_f + e]] = False
        e = nxt[e]
    head[c] = -1
    filled[c] = False
    _fw_add(nonempty, c, -1)
    return live - 1


@njit(cache=True)
def _fire(s, f, timer_t, timer_wm, timer_reg, cidx, widest_now, c_wm, c_widest, times, m, nfields, sums, cnts,
          bsum, bcnt, bmin, bmax, segmin, segmax, size, nonempty, filled, head, nxt, present, ident, lo_f, live,
          pending):
    """A cleanup timer fires before fork f: remove the buckets older than its time minus the widest window then."""
    timer = timer_t[s]
    del pending[timer]
    reg = timer_reg[s]
    widest = widest_now[f]
    for ch in range(cidx[reg], cidx[f]):  # a widest-window change between: did the rise come before it?
        if c_wm[ch] > timer_wm[s] and c_wm[ch] >= timer:
            widest = c_widest[ch]
            break
    if widest < 0:
        return live
    cut = np.searchsorted(times, timer - widest)
    while live > 0:
        c = _fw_first(nonempty, m)
        if c >= cut:
            break
        live = _remove(c, nfields, sums, cnts, bsum, bcnt, bmin, bmax, segmin, segmax, size, nonempty, filled,
                       head, nxt, present, ident, lo_f, live)
    return live
