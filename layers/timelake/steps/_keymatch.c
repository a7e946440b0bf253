/* Merge mode's key match: keys packed to one int64 each, and which of one sorted array of them occur in
 * another, each in one pass without the GIL.
 *
 * A key of the usual shape (series, time) packs as the series' rank in the high bits over the time in
 * the low bits (`KeyPacker`). numpy packed a batch in five passes with a temporary array each (offset the
 * times, check the range, check the series, shift, or), and looked the series up in one more; `pack`
 * does it all in one.
 *
 * Merge mode matches a unit's keys with main's (`KeyPacker.mark`): both sides are packed to one int64
 * a key and sorted, so the keys they share are found by walking the two arrays side by side, as the
 * merge step of a merge sort does. numpy has no such walk: its binary search of each of main's keys
 * among a day's unit took three times as long as this pass, and the audit of each staged file paid it
 * again. The pass reads each array once, so it never costs more than reading the keys did.
 *
 * `meet` finds the same keys without packing either side: the unit's (or a staged file's) sort codes in
 * key order, a series rank and a time a key, against main's rows put in series order by counting, each
 * series' times walked beside its stretch of the keys, four series a step each in turn so that their
 * loads overlap. Packing both sides, sorting main's and walking them took three passes over a day's keys
 * and two temporary arrays of them; the audit of a day's staged file spent 6.4 ms on main's rows that way,
 * 3 ms this way.
 *
 * `drop` then takes the matched rows out of the unit's sorted order and sums their check column. Indexed
 * by the order, that column was read a row here and there across the unit (30 % of a day: three times
 * the time of reading it all); the rows to sum are flagged first and the column then read through once.
 *
 * `ordered` checks keys of the usual shape in sort order, as a unit's writer and the audit of each
 * staged file do: whether each (series, time) follows the one before, and which repeat the next. numpy
 * compared both columns with their shifted selves and combined the results, eight passes with a temporary
 * array each; this is one.
 *
 * Keys may repeat on either side: every repeat in the first array is marked, a repeat in the second
 * marks nothing more. The caller owns every array passed; only `drop` (a byte of flags a row) and
 * `by_series` (a count a series) allocate, and free it before they return. Should `drop` find an entry
 * naming no row, it raises with ``order`` moved forward up to there: the unit fails and is written again
 * from its rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../_int_view.h"

static int int64_view(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    return int_view(obj, view, writable, 8, name);
}

/* pack(codes, times, base, time_bits, out, lookup=None): out[i] = rank << time_bits | (times[i] - base),
 * the rank being codes[i] or, with lookup, lookup[codes[i]]; -1 where the rank is negative or unknown or
 * the time falls outside [base, base + 2^time_bits). Returns how many rows got -1. */
static PyObject *pack(PyObject *self, PyObject *args) {
    PyObject *codes_obj, *times_obj, *out_obj, *lookup_obj = Py_None;
    long long base;
    int bits;
    if (!PyArg_ParseTuple(args, "OOLiO|O:pack", &codes_obj, &times_obj, &base, &bits, &out_obj, &lookup_obj))
        return NULL;
    if (bits < 1 || bits > 62) {
        PyErr_Format(PyExc_ValueError, "time_bits must be 1 to 62, not %d", bits);
        return NULL;
    }
    Py_buffer codes, times, out, lookup = {0};
    int have_lookup = lookup_obj != Py_None;
    if (int_view(codes_obj, &codes, 0, 0, "codes") < 0)
        return NULL;
    if (int64_view(times_obj, &times, 0, "times") < 0)
        goto fail_codes;
    if (int64_view(out_obj, &out, 1, "out") < 0)
        goto fail_times;
    if (have_lookup && int64_view(lookup_obj, &lookup, 0, "lookup") < 0)
        goto fail_out;
    Py_ssize_t n = times.len / 8;
    if (codes.len / codes.itemsize != n || out.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "codes, times and out must have one value a row: %zd, %zd and %zd",
                     codes.len / codes.itemsize, n, out.len / 8);
        goto fail_lookup;
    }
    const int64_t *t = times.buf, *table = have_lookup ? lookup.buf : NULL;
    const Py_ssize_t entries = have_lookup ? lookup.len / 8 : 0;
    const int wide = codes.itemsize == 8;
    const int64_t *c64 = codes.buf;
    const int32_t *c32 = codes.buf;
    int64_t *o = out.buf;
    const uint64_t span = (uint64_t)1 << bits;
    Py_ssize_t outside = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t rank = wide ? c64[i] : (int64_t)c32[i];
        if (table) rank = rank >= 0 && rank < entries ? table[rank] : -1;
        uint64_t low = (uint64_t)t[i] - (uint64_t)base; /* a time before base wraps past the top */
        int ok = rank >= 0 && low < span;
        o[i] = ok ? (int64_t)(((uint64_t)rank << bits) | low) : -1;
        outside += !ok;
    }
    Py_END_ALLOW_THREADS
    if (have_lookup) PyBuffer_Release(&lookup);
    PyBuffer_Release(&out);
    PyBuffer_Release(&times);
    PyBuffer_Release(&codes);
    return PyLong_FromSsize_t(outside);
fail_lookup:
    if (have_lookup) PyBuffer_Release(&lookup);
fail_out:
    PyBuffer_Release(&out);
fail_times:
    PyBuffer_Release(&times);
fail_codes:
    PyBuffer_Release(&codes);
    return NULL;
}

/* The place of the first key of ascending a[i..n) not below ``y``. Eight keys are stepped over while the
 * last of them is below ``y``; among the eight that hold it, three comparisons each halving them find
 * it, their answers added to the place rather than branched on. A walk a key at a time waited on one
 * mispredicted branch a key; comparing all eight and summing cost twice the instructions of this. */
static inline Py_ssize_t skip_below(const int64_t *a, Py_ssize_t i, Py_ssize_t n, int64_t y) {
    while (i + 8 <= n) {
        const int64_t *p = a + i;
        if (p[7] < y) {
            i += 8;
            continue;
        }
        p += (p[3] < y) * 4;
        p += (p[1] < y) * 2;
        p += p[0] < y;
        return p - a;
    }
    while (i < n && a[i] < y) i++;
    return i;
}

/* A walk of ascending mine[0..n) beside ascending theirs[0..m), marking in ``out`` the keys of mine that
 * theirs holds: the longer side is skipped over, the shorter taken a key at a time (``over_mine``: mine
 * is the longer). */
typedef struct {
    const int64_t *mine, *theirs;
    Py_ssize_t n, m, i, j;
    uint8_t *out;
    int over_mine;
} walker;

static walker walker_of(const int64_t *mine, Py_ssize_t n, const int64_t *theirs, Py_ssize_t m, uint8_t *out) {
    return (walker){mine, theirs, n, m, 0, 0, out, n >= m};
}

/* Key ``y`` of theirs met in mine[i..n): every repeat of it in mine marked, and the place past them returned
 * (a repeat of ``y`` in theirs then meets a greater key). */
static inline Py_ssize_t meet_in_mine(const int64_t *mine, Py_ssize_t i, Py_ssize_t n, int64_t y, uint8_t *out,
                                      Py_ssize_t *hits) {
    for (i = skip_below(mine, i, n, y); i < n && mine[i] == y; i++) {
        out[i] = 1;
        (*hits)++;
    }
    return i;
}

/* One key of the shorter side met; false once either side is through. */
static inline int step(walker *w, Py_ssize_t *hits) {
    if (w->i >= w->n || w->j >= w->m)
        return 0;
    if (w->over_mine) {
        w->i = meet_in_mine(w->mine, w->i, w->n, w->theirs[w->j++], w->out, hits);
    } else { /* an equal key stays in theirs: the next of mine may repeat it */
        int64_t y = w->mine[w->i];
        w->j = skip_below(w->theirs, w->j, w->m, y);
        if (w->j < w->m && w->theirs[w->j] == y) {
            w->out[w->i] = 1;
            (*hits)++;
        }
        w->i++;
    }
    return 1;
}

/* Walks taken a step each in turn, until all are through; returns the keys marked. Each step waits on
 * the loads of the one before it in its walk, so one walk alone leaves the core idle between them; four
 * in turn overlap their loads (a day's unit against main's rows of it in 300 series: 1.05 ms alone,
 * 0.57 ms four at a time). */
static Py_ssize_t walk_all(walker *walks, int count) {
    Py_ssize_t hits = 0;
    for (int live = count; live;) {
        live = 0;
        for (int k = 0; k < count; k++)
            live += step(&walks[k], &hits);
    }
    return hits;
}

#define WALKS 4

#define WALK_LOCALS(k)                                                                                    \
    const int64_t *a##k = w[k].mine, *b##k = w[k].theirs;                                                \
    const Py_ssize_t n##k = w[k].n, m##k = w[k].m;                                                        \
    Py_ssize_t i##k = w[k].i, j##k = w[k].j;                                                              \
    uint8_t *o##k = w[k].out;
#define WALK_LIVE(k) (i##k < n##k && j##k < m##k)

/* Four walks over their mine (the usual: a unit's keys against main's fewer rows of a series) a step
 * each in turn while all four last, their state held in registers: `walk_all` after it finishes them.
 * A step of `walk_all` read and wrote its walk through memory, half its instructions. */
static Py_ssize_t walk_four(walker *w) {
    Py_ssize_t hits = 0;
    WALK_LOCALS(0)
    WALK_LOCALS(1)
    WALK_LOCALS(2)
    WALK_LOCALS(3)
    while (WALK_LIVE(0) && WALK_LIVE(1) && WALK_LIVE(2) && WALK_LIVE(3)) {
        i0 = meet_in_mine(a0, i0, n0, b0[j0++], o0, &hits);
        i1 = meet_in_mine(a1, i1, n1, b1[j1++], o1, &hits);
        i2 = meet_in_mine(a2, i2, n2, b2[j2++], o2, &hits);
        i3 = meet_in_mine(a3, i3, n3, b3[j3++], o3, &hits);
    }
    w[0].i = i0, w[0].j = j0, w[1].i = i1, w[1].j = j1, w[2].i = i2, w[2].j = j2, w[3].i = i3, w[3].j = j3;
    return hits;
}

/* `walk_all` of a full set of `WALKS` walks, the usual four over their mine first taken by `walk_four`. */
static Py_ssize_t walk_set(walker *walks) {
    Py_ssize_t hits = 0;
    if (walks[0].over_mine && walks[1].over_mine && walks[2].over_mine && walks[3].over_mine)
        hits = walk_four(walks);
    return hits + walk_all(walks, WALKS);
}

/* mark(mine, theirs, mask): sets mask[i] to 1 where mine[i] is in theirs; both int64, ascending. */
static PyObject *mark(PyObject *self, PyObject *args) {
    PyObject *mine_obj, *theirs_obj, *mask_obj;
    if (!PyArg_ParseTuple(args, "OOO:mark", &mine_obj, &theirs_obj, &mask_obj))
        return NULL;
    Py_buffer mine, theirs, mask;
    if (int64_view(mine_obj, &mine, 0, "mine") < 0)
        return NULL;
    if (int64_view(theirs_obj, &theirs, 0, "theirs") < 0) {
        PyBuffer_Release(&mine);
        return NULL;
    }
    if (PyObject_GetBuffer(mask_obj, &mask, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&mine);
        PyBuffer_Release(&theirs);
        return NULL;
    }
    Py_ssize_t n = mine.len / 8, m = theirs.len / 8, hits = -1;
    if (mask.len != n || mask.itemsize != 1)
        PyErr_Format(PyExc_ValueError, "mask must be %zd bytes of one byte each (one per key of mine), not %zd",
                     n, mask.len);
    else {
        walker w = walker_of(mine.buf, n, theirs.buf, m, mask.buf);
        Py_BEGIN_ALLOW_THREADS
        hits = walk_all(&w, 1);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&mine);
    PyBuffer_Release(&theirs);
    PyBuffer_Release(&mask);
    return hits < 0 ? NULL : PyLong_FromSsize_t(hits);
}

static int ascending_times(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* The slot of each row's code (the last, ``slots``, for a code naming no series) counted, then each row's
 * time put at its slot's next place: no branch on the code, whose series change from row to row. */
#define SLOT(T, j) ((uint64_t)(int64_t)((const T *)codes.buf)[j] < (uint64_t)slots \
                    ? (size_t)((const T *)codes.buf)[j] : (size_t)slots)
#define COUNT_CODES(T)                                                                                    \
    {                                                                                                    \
        for (Py_ssize_t j = 0; j < m; j++) place[SLOT(T, j)]++;                                          \
    }
#define PLACE_CODES(T)                                                                                    \
    {                                                                                                    \
        for (Py_ssize_t j = 0; j < m; j++) grouped[place[SLOT(T, j)]++] = tt[j];                         \
    }

/* meet(ranks, times, count, codes, their_times, found, lookup=None) -> int: found[i] = 1 where key i (series
 * ranks[i] of ``count``, time times[i]) is the key of one of the rows given by codes and their_times, the
 * rank of row j being codes[j] or, with lookup, lookup[codes[j]] (negative or unknown: no key); returns how
 * many keys it marked. The keys must be in key order, which every caller has checked already (a writer
 * sorted its unit, the audit checked the file's order); out of order they are answered wrongly, never
 * read or written out of bounds. Each series' stretch of the keys is found by halving the ranks (reading
 * them through to check their order was a fifth of the call). The rows are counted per code, placed in
 * series order (their order kept within a series, so main's rows in time order need no sort; a series
 * out of order is sorted alone) and walked beside each series' keys, four series in turn. Allocates a time
 * a row, three places a series and one a code, and frees them before it returns. */
static PyObject *meet(PyObject *self, PyObject *args) {
    PyObject *ranks_obj, *times_obj, *codes_obj, *their_obj, *found_obj, *lookup_obj = Py_None;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OOnOOO|O:meet", &ranks_obj, &times_obj, &count, &codes_obj, &their_obj, &found_obj,
                          &lookup_obj))
        return NULL;
    Py_buffer ranks, times, codes, their, found, lookup = {0};
    int have_lookup = lookup_obj != Py_None;
    PyObject *result = NULL;
    if (int_view(ranks_obj, &ranks, 0, 0, "ranks") < 0)
        return NULL;
    if (int64_view(times_obj, &times, 0, "times") < 0)
        goto fail_ranks;
    if (int_view(codes_obj, &codes, 0, 0, "codes") < 0)
        goto fail_times;
    if (int64_view(their_obj, &their, 0, "their_times") < 0)
        goto fail_codes;
    if (PyObject_GetBuffer(found_obj, &found, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto fail_their;
    if (have_lookup && int64_view(lookup_obj, &lookup, 0, "lookup") < 0)
        goto fail_found;
    Py_ssize_t n = times.len / 8, m = their.len / 8;
    if (ranks.len / ranks.itemsize != n || found.len != n || found.itemsize != 1 || codes.len / codes.itemsize != m
            || count < 0) {
        PyErr_Format(PyExc_ValueError, "ranks, times and found must hold one entry a key (%zd; not %zd and %zd bytes), "
                     "codes and their_times one a row (%zd, not %zd), count must not be negative (%zd)", n,
                     ranks.len / ranks.itemsize, found.len, m, codes.len / codes.itemsize, count);
        goto fail_lookup;
    }
    const int wide = ranks.itemsize == 8, wide_codes = codes.itemsize == 8;
    const int64_t *t = times.buf, *tt = their.buf, *table = have_lookup ? lookup.buf : NULL;
    const Py_ssize_t entries = have_lookup ? lookup.len / 8 : 0;
    uint8_t *mark = found.buf;
    const Py_ssize_t slots = have_lookup ? entries : count; /* the codes that may name a series */
    Py_ssize_t *start = malloc(((size_t)count + 1) * sizeof(Py_ssize_t));
    Py_ssize_t *off = calloc((size_t)count + 1, sizeof(Py_ssize_t));
    Py_ssize_t *next = malloc(((size_t)count + 1) * sizeof(Py_ssize_t));
    Py_ssize_t *place = calloc((size_t)slots + 1, sizeof(Py_ssize_t));
    int64_t *grouped = malloc(((size_t)m + 1) * sizeof(int64_t));
    if (!start || !off || !next || !place || !grouped) {
        free(start);
        free(off);
        free(next);
        free(place);
        free(grouped);
        PyErr_NoMemory();
        goto fail_lookup;
    }
    Py_ssize_t hits = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0, lo = 0; r <= count; r++) { /* start[r]: where series r's keys begin */
        Py_ssize_t hi = n;
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            int64_t x = wide ? ((const int64_t *)ranks.buf)[mid] : (int64_t)((const int32_t *)ranks.buf)[mid];
            if (x < r) lo = mid + 1;
            else hi = mid;
        }
        start[r] = lo;
    }
    /* The rows are counted by code, then placed by code: a code's place is looked up once, not a row's
     * series (half the instructions of counting and placing by series). Codes naming no series (negative,
     * past the lookup, looked up to none) share the last slot and are placed past every series' rows. */
    if (wide_codes)
        COUNT_CODES(int64_t)
    else
        COUNT_CODES(int32_t)
    for (Py_ssize_t c = 0; c < slots; c++) {
        int64_t r = table ? table[c] : c;
        if (r >= 0 && r < count) off[r + 1] += place[c];
    }
    for (Py_ssize_t r = 0; r < count; r++) off[r + 1] += off[r]; /* series r's rows: [off[r], off[r + 1]) */
    memcpy(next, off, ((size_t)count + 1) * sizeof(Py_ssize_t));
    for (Py_ssize_t c = 0; c <= slots; c++) { /* each code's rows follow the earlier codes' of its series */
        int64_t r = c == slots ? -1 : table ? table[c] : c;
        Py_ssize_t rows = place[c];
        if (r < 0 || r >= count) r = count; /* none: past the last series */
        place[c] = next[r];
        next[r] += rows;
    }
    if (wide_codes)
        PLACE_CODES(int64_t)
    else
        PLACE_CODES(int32_t)
    walker walks[WALKS];
    int ready = 0;
    for (Py_ssize_t r = 0; r < count; r++) {
        Py_ssize_t from = off[r], rows = off[r + 1] - from, keys = start[r + 1] - start[r];
        if (!rows || !keys) continue;
        int64_t *b = grouped + from;
        for (Py_ssize_t k = 1; k < rows; k++)
            if (b[k] < b[k - 1]) {
                qsort(b, (size_t)rows, sizeof(int64_t), ascending_times);
                break;
            }
        walks[ready++] = walker_of(t + start[r], keys, b, rows, mark + start[r]);
        if (ready == WALKS) {
            hits += walk_set(walks);
            ready = 0;
        }
    }
    hits += walk_all(walks, ready);
    Py_END_ALLOW_THREADS
    free(start);
    free(off);
    free(next);
    free(place);
    free(grouped);
    result = PyLong_FromSsize_t(hits);
fail_lookup:
    if (have_lookup) PyBuffer_Release(&lookup);
fail_found:
    PyBuffer_Release(&found);
fail_their:
    PyBuffer_Release(&their);
fail_codes:
    PyBuffer_Release(&codes);
fail_times:
    PyBuffer_Release(&times);
fail_ranks:
    PyBuffer_Release(&ranks);
    return result;
}

/* by_series(keys, time_bits, out) -> bool: out = keys (packed, none negative) in the order of their series
 * (the bits above time_bits), keeping their order within a series, by counting; whether out ascends, as
 * it does when each series' keys ascended in keys: main's rows in time order, which is how live writers
 * leave them. Two passes over the keys took under half the time numpy's sort of them did (a day of
 * main, 130,000 keys: 0.3 against 0.7 ms). False, with out unspecified, when a key is negative, when there
 * are more series than keys (counting would then cost more than sorting) or no memory for the counts. */
static PyObject *by_series(PyObject *self, PyObject *args) {
    PyObject *keys_obj, *out_obj;
    int bits;
    if (!PyArg_ParseTuple(args, "OiO:by_series", &keys_obj, &bits, &out_obj))
        return NULL;
    if (bits < 1 || bits > 62) {
        PyErr_Format(PyExc_ValueError, "time_bits must be 1 to 62, not %d", bits);
        return NULL;
    }
    Py_buffer keys, out;
    if (int64_view(keys_obj, &keys, 0, "keys") < 0)
        return NULL;
    if (int64_view(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&keys);
        return NULL;
    }
    Py_ssize_t n = keys.len / 8;
    if (out.len != keys.len) {
        PyErr_Format(PyExc_ValueError, "out must hold %zd keys, not %zd", n, out.len / 8);
        PyBuffer_Release(&keys);
        PyBuffer_Release(&out);
        return NULL;
    }
    const int64_t *k = keys.buf;
    int64_t *o = out.buf, top = -1, any = 0;
    int ascending = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r = k[i] >> bits;
        top = r > top ? r : top;
        any |= k[i]; /* the sign bit of any negative key */
    }
    Py_ssize_t *place = any >= 0 && top >= 0 && top < n ? calloc((size_t)top + 1, sizeof(Py_ssize_t)) : NULL;
    if (place) {
        for (Py_ssize_t i = 0; i < n; i++) place[k[i] >> bits]++;
        Py_ssize_t at = 0;
        for (int64_t r = 0; r <= top; r++) {
            Py_ssize_t count = place[r];
            place[r] = at;
            at += count;
        }
        for (Py_ssize_t i = 0; i < n; i++) o[place[k[i] >> bits]++] = k[i];
        ascending = 1;
        for (Py_ssize_t i = 1; i < n && ascending; i++) ascending = o[i] >= o[i - 1];
        free(place);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&keys);
    PyBuffer_Release(&out);
    return PyBool_FromLong(ascending);
}

/* drop(order, mask, values, rows) -> (kept, dropped_sum): moves the entries of order that mask does not
 * mark to its front, in order, and sums values (float64 or int64, one a row; None: no sum) over the rows
 * the marked entries name. Every entry must name a row below ``rows``, each row at most once. */
static PyObject *drop(PyObject *self, PyObject *args) {
    PyObject *order_obj, *mask_obj, *values_obj;
    Py_ssize_t rows;
    if (!PyArg_ParseTuple(args, "OOOn:drop", &order_obj, &mask_obj, &values_obj, &rows))
        return NULL;
    Py_buffer order, mask, values = {0};
    int have_values = values_obj != Py_None, floating = 0;
    if (int64_view(order_obj, &order, 1, "order") < 0)
        return NULL;
    if (PyObject_GetBuffer(mask_obj, &mask, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&order);
        return NULL;
    }
    if (have_values) {
        if (PyObject_GetBuffer(values_obj, &values, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto fail_mask;
        const char *f = values.format ? values.format : "B";
        if (*f == '<' || *f == '=' || *f == '@') f++;
        floating = strcmp(f, "d") == 0;
        if (values.itemsize != 8 || !(floating || strcmp(f, "q") == 0 || strcmp(f, "l") == 0)) {
            PyErr_Format(PyExc_TypeError, "values must be a contiguous float64 or int64 array, not format '%s'", f);
            goto fail_values;
        }
        if (values.len / 8 != rows) {
            PyErr_Format(PyExc_ValueError, "values must hold one value a row: %zd, not %zd", rows, values.len / 8);
            goto fail_values;
        }
    }
    Py_ssize_t n = order.len / 8;
    if (mask.len != n || mask.itemsize != 1) {
        PyErr_Format(PyExc_ValueError, "mask must be %zd bytes of one byte each (one per entry of order), not %zd", n, mask.len);
        goto fail_values;
    }
    uint8_t *flags = have_values ? calloc((size_t)rows + 1, 1) : NULL; /* flags[rows]: where kept rows go */
    if (have_values && !flags) {
        PyErr_NoMemory();
        goto fail_values;
    }
    int64_t *o = order.buf;
    const uint8_t *m = mask.buf;
    Py_ssize_t kept = 0, bad = -1;
    double sum = 0.0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) { /* no branch on the mask: it marks rows here and there */
        int64_t row = o[i];
        uint8_t marked = m[i] != 0;
        o[kept] = row;
        kept += !marked;
        if (flags) {
            if ((uint64_t)row >= (uint64_t)rows) { bad = i; break; }
            flags[marked ? row : rows] = 1; /* a kept row's store lands on one byte, in cache */
        }
    }
    if (flags && bad < 0) { /* four sums, so that each addition need not wait for the one before */
        double part[4] = {0.0, 0.0, 0.0, 0.0};
        Py_ssize_t r = 0;
        if (floating) { /* an unflagged value's bits are masked to 0.0, a NaN's too: no branch */
            const uint64_t *v = values.buf;
            double x;
            for (; r + 4 <= rows; r += 4)
                for (int k = 0; k < 4; k++) {
                    uint64_t bits = v[r + k] & (0 - (uint64_t)flags[r + k]);
                    memcpy(&x, &bits, 8);
                    part[k] += x;
                }
            for (; r < rows; r++) {
                uint64_t bits = v[r] & (0 - (uint64_t)flags[r]);
                memcpy(&x, &bits, 8);
                part[0] += x;
            }
        } else {
            const int64_t *v = values.buf;
            for (; r + 4 <= rows; r += 4)
                for (int k = 0; k < 4; k++) part[k] += (double)(v[r + k] & (0 - (int64_t)flags[r + k]));
            for (; r < rows; r++) part[0] += (double)(v[r] & (0 - (int64_t)flags[r]));
        }
        sum = (part[0] + part[1]) + (part[2] + part[3]);
    }
    Py_END_ALLOW_THREADS
    free(flags);
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "order[%zd] names row %lld of %zd", bad, (long long)o[bad], rows);
        goto fail_values;
    }
    if (have_values) PyBuffer_Release(&values);
    PyBuffer_Release(&mask);
    PyBuffer_Release(&order);
    return Py_BuildValue("nd", kept, sum);
fail_values:
    if (have_values) PyBuffer_Release(&values);
fail_mask:
    PyBuffer_Release(&mask);
    PyBuffer_Release(&order);
    return NULL;
}

/* ordered(first, second, equal) -> (unsorted_at, repeats): equal[i] = 1 where key i (first[i], second[i])
 * equals key i + 1, else 0 (the last key too); the first row whose key comes before the one above it, or
 * -1; how many keys equal the next. first int32 or int64, second int64, equal one byte a key. */
static PyObject *ordered(PyObject *self, PyObject *args) {
    PyObject *first_obj, *second_obj, *equal_obj;
    if (!PyArg_ParseTuple(args, "OOO:ordered", &first_obj, &second_obj, &equal_obj))
        return NULL;
    Py_buffer first, second, equal;
    if (int_view(first_obj, &first, 0, 0, "first") < 0)
        return NULL;
    if (int64_view(second_obj, &second, 0, "second") < 0) {
        PyBuffer_Release(&first);
        return NULL;
    }
    if (PyObject_GetBuffer(equal_obj, &equal, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&first);
        PyBuffer_Release(&second);
        return NULL;
    }
    Py_ssize_t n = second.len / 8, unsorted = -1, repeats = 0;
    PyObject *result = NULL;
    if (first.len / first.itemsize != n || equal.len != n || equal.itemsize != 1) {
        PyErr_Format(PyExc_ValueError, "first, second and equal must hold one entry a key (%zd), not %zd and %zd bytes",
                     n, first.len / first.itemsize, equal.len);
        goto done;
    }
    const int64_t *b = second.buf;
    uint8_t *e = equal.buf;
    int wide = first.itemsize == 8;
    Py_BEGIN_ALLOW_THREADS
    if (n > 0) {
        int64_t before = wide ? ((const int64_t *)first.buf)[0] : ((const int32_t *)first.buf)[0];
        for (Py_ssize_t i = 1; i < n; i++) {
            int64_t a = wide ? ((const int64_t *)first.buf)[i] : ((const int32_t *)first.buf)[i];
            int same = a == before, eq = same && b[i] == b[i - 1];
            e[i - 1] = (uint8_t)eq;
            repeats += eq;
            if (unsorted < 0 && (a < before || (same && b[i] < b[i - 1])))
                unsorted = i;
            before = a;
        }
        e[n - 1] = 0;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nn", unsorted, repeats);
done:
    PyBuffer_Release(&first);
    PyBuffer_Release(&second);
    PyBuffer_Release(&equal);
    return result;
}

static PyMethodDef methods[] = {
    {"by_series", by_series, METH_VARARGS,
     "by_series(keys, time_bits, out) -> bool: out = keys (int64, none negative) ordered by series (the bits "
     "above time_bits), stable; whether out ascends. False, out unspecified, for a negative key or more series "
     "than keys."},
    {"drop", drop, METH_VARARGS,
     "drop(order, mask, values, rows) -> (kept, dropped_sum): the entries of order (int64) that mask does not "
     "mark moved to its front, how many those are, and the sum of values (float64 or int64, one per row; or "
     "None) over the rows the marked entries name."},
    {"pack", pack, METH_VARARGS,
     "pack(codes, times, base, time_bits, out, lookup=None) -> int: out[i] = rank << time_bits | (times[i] - "
     "base), rank = codes[i] (int32 or int64) or lookup[codes[i]]; -1 where the rank is negative or unknown or "
     "the time is outside [base, base + 2**time_bits); returns how many rows got -1. out may be times."},
    {"ordered", ordered, METH_VARARGS,
     "ordered(first, second, equal) -> (unsorted_at, repeats): equal[i] = 1 where key i (first[i], second[i]; "
     "int32 or int64, int64) equals key i + 1; the first row whose key comes before the one above it (-1: none); "
     "how many keys equal the next. equal holds a byte a key."},
    {"meet", meet, METH_VARARGS,
     "meet(ranks, times, count, codes, their_times, found, lookup=None) -> int: found[i] = 1 where key i (series "
     "ranks[i] of count, int32 or int64; time times[i], int64; keys in key order) is the key of a row (rank "
     "codes[j] or lookup[codes[j]], time their_times[j]; rows in any order); how many keys it marked."},
    {"mark", mark, METH_VARARGS,
     "mark(mine, theirs, mask) -> int: set mask[i] to 1 where mine[i] occurs in theirs (both int64 and "
     "ascending; mask one byte per key of mine); returns how many keys of mine were found."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keymatch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__keymatch(void) { return PyModule_Create(&module); }
