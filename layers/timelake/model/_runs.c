/* The runs of a scan's batch: where its rows' time bucket (an hour or a day) or series changes, found in
 * one pass without the GIL; where runs of equal values start, up to a limit; and the row numbers of runs
 * laid end to end, written without it.
 *
 * A batch of files per device holds a few devices, each in time order: a few hundred runs of one day and
 * one device in 270,000 rows. The scan cuts, counts and spills such a batch a run at a time, and only
 * needs where the runs start. numpy found them in five passes with a temporary array each (divide the
 * times, compare both columns with their shifted selves, combine, find the changes), and the time's
 * bounds in two more; `runs` does it in one, and divides only where a run ends.
 *
 * `tally` sums rows' weights per code, as numpy's bincount does, without the interpreter and without
 * copying a dictionary's int32 codes to numpy's index type first: the diff counts a merge unit's day of
 * main per series with it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_int_view.h"

/* The first and last value of the bucket of ``width`` that holds t, within int64 at both ends. */
static void bucket(int64_t t, int64_t width, int64_t *lo, int64_t *last) {
    int64_t q = t / width - (t % width < 0); /* floor, for times before 1970 too */
    if (q < INT64_MIN / width) { /* the bucket starts below int64 */
        *lo = INT64_MIN;
        *last = (q + 1) * width - 1;
        return;
    }
    *lo = q * width;
    *last = *lo > INT64_MAX - (width - 1) ? INT64_MAX : *lo + (width - 1);
}

/* runs(times, width, series, out, limit) -> (count, lowest, highest): out[:count] = the rows where a run
 * starts (row 0 first) of equal floor(times / width) and, unless series is None, equal series; the lowest
 * and highest time. Past ``limit`` runs the rest are not looked for and count is -1: a batch of rows that
 * change series every row (a time-ordered source) is cut row by row instead. times int64, series int32
 * (a dictionary's indices), out int64 of room for the runs recorded: min(rows, limit). */
static PyObject *runs(PyObject *self, PyObject *args) {
    PyObject *times_obj, *series_obj, *out_obj;
    long long width;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OLOOn:runs", &times_obj, &width, &series_obj, &out_obj, &limit))
        return NULL;
    if (width < 1 || limit < 0) {
        PyErr_Format(PyExc_ValueError, "width must be positive and limit not negative, not %lld and %zd", width, limit);
        return NULL;
    }
    Py_buffer times, series = {0}, out;
    int have_series = series_obj != Py_None;
    if (int_view(times_obj, &times, 0, 8, "times") < 0)
        return NULL;
    if (have_series && int_view(series_obj, &series, 0, 4, "series") < 0) {
        PyBuffer_Release(&times);
        return NULL;
    }
    if (int_view(out_obj, &out, 1, 8, "out") < 0) {
        if (have_series) PyBuffer_Release(&series);
        PyBuffer_Release(&times);
        return NULL;
    }
    Py_ssize_t n = times.len / 8, count = 0;
    PyObject *result = NULL;
    Py_ssize_t room = n < limit ? n : limit; /* the most runs recorded */
    if (out.len / 8 < room || (have_series && series.len / 4 != n)) {
        PyErr_Format(PyExc_ValueError, "out must hold %zd entries and series one a time (%zd), not %zd and %zd", room, n,
                     out.len / 8, have_series ? series.len / 4 : n);
        goto done;
    }
    const int64_t *t = times.buf;
    const int32_t *s = series.buf;
    int64_t *o = out.buf, lowest = 0, highest = 0;
    Py_BEGIN_ALLOW_THREADS
    if (n > 0) {
        int64_t lo, last, mn = t[0], mx = t[0];
        int32_t current = have_series ? s[0] : 0;
        bucket(t[0], (int64_t)width, &lo, &last);
        Py_ssize_t i = 1;
        if (limit < 1)
            count = -1;
        else
            o[count++] = 0;
        for (; i < n && count >= 0; i++) {
            int64_t x = t[i];
            mn = x < mn ? x : mn;
            mx = x > mx ? x : mx;
            int32_t c = have_series ? s[i] : 0;
            if (x < lo || x > last || c != current) {
                if (count >= limit) { /* too many to be worth it: the bounds alone from here */
                    count = -1;
                    break;
                }
                o[count++] = i;
                current = c;
                bucket(x, (int64_t)width, &lo, &last);
            }
        }
        for (; i < n; i++) {
            mn = t[i] < mn ? t[i] : mn;
            mx = t[i] > mx ? t[i] : mx;
        }
        lowest = mn;
        highest = mx;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nLL", count, (long long)lowest, (long long)highest);
done:
    PyBuffer_Release(&out);
    if (have_series) PyBuffer_Release(&series);
    PyBuffer_Release(&times);
    return result;
}

/* starts(values, out, limit) -> count: out[:count] = the rows where a run of equal values starts (int32 or
 * int64 values), row 0 first; past ``limit`` runs it stops and count is -1. A writer looks for runs in its
 * rows' series ranks to order a few hundred runs instead of every row; a day of a time-ordered source
 * changes series every row, and numpy's search (compare, find, append) took 1.9 ms of a 432,000-row unit
 * only to find that. out holds min(len(values), limit) entries. */
static PyObject *starts(PyObject *self, PyObject *args) {
    PyObject *values_obj, *out_obj;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OOn:starts", &values_obj, &out_obj, &limit))
        return NULL;
    if (limit < 0) {
        PyErr_Format(PyExc_ValueError, "limit must not be negative, not %zd", limit);
        return NULL;
    }
    Py_buffer values, out;
    if (int_view(values_obj, &values, 0, 0, "values") < 0)
        return NULL;
    if (int_view(out_obj, &out, 1, 8, "out") < 0) {
        PyBuffer_Release(&values);
        return NULL;
    }
    Py_ssize_t n = values.len / values.itemsize, count = 0;
    Py_ssize_t room = n < limit ? n : limit;
    PyObject *result = NULL;
    if (out.len / 8 < room) {
        PyErr_Format(PyExc_ValueError, "out must hold %zd entries, not %zd", room, out.len / 8);
        goto done;
    }
    int64_t *o = out.buf;
    int wide = values.itemsize == 8;
    const int64_t *v8 = values.buf;
    const int32_t *v4 = values.buf;
    Py_BEGIN_ALLOW_THREADS
    if (n > 0) {
        if (limit < 1)
            count = -1;
        else
            o[count++] = 0;
        for (Py_ssize_t i = 1; i < n && count >= 0; i++) {
            if (wide ? v8[i] != v8[i - 1] : v4[i] != v4[i - 1]) {
                if (count >= limit) {
                    count = -1;
                    break;
                }
                o[count++] = i;
            }
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(count);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&values);
    return result;
}

/* ranges(starts, sizes, out): out = the integers of [starts[i], starts[i] + sizes[i]) one range after
 * another; all three int64, out of exactly sum(sizes) entries. A writer orders a per-device unit's rows by
 * laying its few hundred runs end to end: numpy's cumulative sum over the 432,000 row numbers held the
 * interpreter for about a millisecond a unit while the other writer waited for it. */
static PyObject *ranges(PyObject *self, PyObject *args) {
    PyObject *starts_obj, *sizes_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO:ranges", &starts_obj, &sizes_obj, &out_obj))
        return NULL;
    Py_buffer starts, sizes, out;
    if (int_view(starts_obj, &starts, 0, 8, "starts") < 0)
        return NULL;
    if (int_view(sizes_obj, &sizes, 0, 8, "sizes") < 0) {
        PyBuffer_Release(&starts);
        return NULL;
    }
    if (int_view(out_obj, &out, 1, 8, "out") < 0) {
        PyBuffer_Release(&sizes);
        PyBuffer_Release(&starts);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = starts.len / 8, room = out.len / 8;
    const int64_t *first = starts.buf, *size = sizes.buf;
    int64_t *o = out.buf;
    if (sizes.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "starts and sizes must be as long as each other, not %zd and %zd", n, sizes.len / 8);
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (size[i] < 0) {
            PyErr_Format(PyExc_ValueError, "sizes[%zd] is negative (%lld)", i, (long long)size[i]);
            goto done;
        }
        if (size[i] > room - total) {
            PyErr_Format(PyExc_ValueError, "out holds %zd entries, fewer than the sizes' sum", room);
            goto done;
        }
        total += (Py_ssize_t)size[i];
    }
    if (total != room) {
        PyErr_Format(PyExc_ValueError, "out holds %zd entries, not the sizes' sum %zd", room, total);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t value = (uint64_t)first[i]; /* wraps where numpy's sum would, not undefined */
        for (int64_t k = 0; k < size[i]; k++)
            *o++ = (int64_t)(value + (uint64_t)k);
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(out_obj);
    result = out_obj;
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&starts);
    return result;
}

/* tally(codes, out, weights=None): out[codes[i]] += weights[i] (1.0 without weights), each code in
 * [0, len(out)); codes int32 or int64, out and weights float64. The diff counts main's rows of a merge unit
 * per series this way: numpy's bincount copies a dictionary's int32 indices to its index type first and
 * holds the interpreter throughout, twice a unit (rows, then each column's sum). A run of one code is
 * summed first and added once (so a slot's sum may round apart from bincount's in the last bit). A code
 * outside out names its row in a ValueError, with out added to up to there. */
static PyObject *tally(PyObject *self, PyObject *args) {
    PyObject *codes_obj, *out_obj, *weights_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O:tally", &codes_obj, &out_obj, &weights_obj))
        return NULL;
    Py_buffer codes, out, weights = {0};
    int have_weights = weights_obj != Py_None;
    if (int_view(codes_obj, &codes, 0, 0, "codes") < 0)
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&codes);
        return NULL;
    }
    if (have_weights && PyObject_GetBuffer(weights_obj, &weights, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&codes);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = codes.len / codes.itemsize, slots = out.len / 8, bad = -1;
    const char *fo = out.format ? out.format : "B", *fw = have_weights && weights.format ? weights.format : "d";
    if (out.itemsize != 8 || strcmp(fo, "d") != 0 || (have_weights && (weights.itemsize != 8 || strcmp(fw, "d") != 0))) {
        PyErr_SetString(PyExc_TypeError, "out and weights must be contiguous float64 arrays");
        goto done;
    }
    if (have_weights && weights.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "weights must hold one value a code: %zd, not %zd", n, weights.len / 8);
        goto done;
    }
    double *o = out.buf;
    const double *w = have_weights ? weights.buf : NULL;
    const int wide = codes.itemsize == 8;
    const int64_t *c8 = codes.buf;
    const int32_t *c4 = codes.buf;
    Py_BEGIN_ALLOW_THREADS
    /* a run of one code adds up beside the slot and lands in it once: rows in series order (a staged file, main
     * as our writers and a sorting compaction leave it) would otherwise each wait for the addition before to
     * the same slot to be stored and loaded again (four times as long as codes that change every row). One
     * loop for each kind of codes and each of counting and summing, so that none asks which it is per row. */
#define TALLY(CODES, WEIGHTED)                                                                              \
    {                                                                                                      \
        int64_t run = -1;                                                                                  \
        Py_ssize_t from = 0;                                                                               \
        double sum = 0.0;                                                                                  \
        for (Py_ssize_t i = 0; i < n; i++) {                                                               \
            int64_t c = (int64_t)(CODES)[i];                                                               \
            if ((uint64_t)c >= (uint64_t)slots) {                                                          \
                bad = i;                                                                                   \
                break;                                                                                     \
            }                                                                                              \
            if (c != run) {                                                                                \
                if (run >= 0) o[run] += WEIGHTED ? sum : (double)(i - from);                               \
                run = c;                                                                                   \
                from = i;                                                                                  \
                sum = 0.0;                                                                                 \
            }                                                                                              \
            if (WEIGHTED) sum += w[i];                                                                     \
        }                                                                                                  \
        if (run >= 0) o[run] += WEIGHTED ? sum : (double)((bad >= 0 ? bad : n) - from);                    \
    }
    if (wide && w) TALLY(c8, 1)
    else if (wide) TALLY(c8, 0)
    else if (w) TALLY(c4, 1)
    else TALLY(c4, 0)
#undef TALLY
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "codes[%zd] is %lld, outside [0, %zd)", bad,
                     (long long)(wide ? c8[bad] : (int64_t)c4[bad]), slots);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    if (have_weights) PyBuffer_Release(&weights);
    PyBuffer_Release(&out);
    PyBuffer_Release(&codes);
    return result;
}

static PyMethodDef methods[] = {
    {"runs", runs, METH_VARARGS,
     "runs(times, width, series, out, limit) -> (count, lowest, highest): out[:count] = the rows (int64) where a "
     "run of equal floor(times / width) and equal series (int32, or None) starts, row 0 first; the lowest and "
     "highest of times (int64). Past limit runs, count is -1. out holds min(len(times), limit) entries."},
    {"starts", starts, METH_VARARGS,
     "starts(values, out, limit) -> count: out[:count] = the rows (int64) where a run of equal values (int32 or "
     "int64) starts, row 0 first. Past limit runs, count is -1. out holds min(len(values), limit) entries."},
    {"ranges", ranges, METH_VARARGS,
     "ranges(starts, sizes, out) -> out: the integers of [starts[i], starts[i] + sizes[i]) one range after another, "
     "int64 all three, out of exactly sum(sizes) entries."},
    {"tally", tally, METH_VARARGS,
     "tally(codes, out, weights=None): out[codes[i]] += weights[i] (or 1.0), codes int32 or int64 in [0, len(out)), "
     "out and weights float64; a code outside raises, naming its row."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_runs", NULL, -1, methods};

PyMODINIT_FUNC PyInit__runs(void) { return PyModule_Create(&module); }
