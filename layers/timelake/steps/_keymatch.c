/* Which of one sorted array of packed keys occur in another, in one pass over both, without the GIL.
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

static int int64_view(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (view->itemsize != 8 || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous int64 array, not format '%s' of %zd bytes",
                     name, view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
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
    {"mark", mark, METH_VARARGS,
     "mark(mine, theirs, mask) -> int: set mask[i] to 1 where mine[i] occurs in theirs (both int64 and "
     "ascending; mask one byte per key of mine); returns how many keys of mine were found."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keymatch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__keymatch(void) { return PyModule_Create(&module); }
