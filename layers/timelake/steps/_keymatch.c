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
 * Keys may repeat on either side: every repeat in the first array is marked, a repeat in the second
 * marks nothing more. Nothing is allocated; the caller owns all three buffers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A contiguous buffer of signed integers of ``size`` bytes (8, or 4 where ``size`` is 0 and either is
 * taken); on failure a TypeError that names the argument. */
static int int_view(PyObject *obj, Py_buffer *view, int writable, int size, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int wide = view->itemsize == 8 && (strcmp(f, "q") == 0 || strcmp(f, "l") == 0);
    int narrow = view->itemsize == 4 && (strcmp(f, "i") == 0 || (sizeof(long) == 4 && strcmp(f, "l") == 0));
    if (!(wide && size != 4) && !(narrow && size == 0)) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous %s array, not format '%s' of %zd bytes", name,
                     size ? "int64" : "int32 or int64", view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

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
    Py_ssize_t n = mine.len / 8, m = theirs.len / 8;
    if (mask.len != n || mask.itemsize != 1) {
        PyErr_Format(PyExc_ValueError, "mask must be %zd bytes of one byte each (one per key of mine), not %zd",
                     n, mask.len);
        PyBuffer_Release(&mine);
        PyBuffer_Release(&theirs);
        PyBuffer_Release(&mask);
        return NULL;
    }
    const int64_t *a = mine.buf, *b = theirs.buf;
    uint8_t *out = mask.buf;
    Py_ssize_t i = 0, j = 0, hits = 0;
    Py_BEGIN_ALLOW_THREADS
    while (i < n && j < m) {
        int64_t x = a[i], y = b[j];
        int equal = x == y;
        out[i] |= (uint8_t)equal;
        hits += equal;
        i += x <= y; /* an equal key stays in theirs: the next of mine may repeat it */
        j += y < x;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&mine);
    PyBuffer_Release(&theirs);
    PyBuffer_Release(&mask);
    return PyLong_FromSsize_t(hits);
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS,
     "pack(codes, times, base, time_bits, out, lookup=None) -> int: out[i] = rank << time_bits | (times[i] - "
     "base), rank = codes[i] (int32 or int64) or lookup[codes[i]]; -1 where the rank is negative or unknown or "
     "the time is outside [base, base + 2**time_bits); returns how many rows got -1. out may be times."},
    {"mark", mark, METH_VARARGS,
     "mark(mine, theirs, mask) -> int: set mask[i] to 1 where mine[i] occurs in theirs (both int64 and "
     "ascending; mask one byte per key of mine); returns how many keys of mine were found."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keymatch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__keymatch(void) { return PyModule_Create(&module); }
