/* How the compiled modules take the integer arrays they are given: contiguous, of the width asked for,
 * or a TypeError that names the argument. Included by each module's source (one shared object each). */
#ifndef TIMELAKE_INT_VIEW_H
#define TIMELAKE_INT_VIEW_H

#include <Python.h>
#include <string.h>

/* A contiguous buffer of signed integers: int64 where ``size`` is 8, int32 where it is 4, either where it
 * is 0; on failure a TypeError that names the argument. */
static int int_view(PyObject *obj, Py_buffer *view, int writable, int size, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int wide = view->itemsize == 8 && (strcmp(f, "q") == 0 || strcmp(f, "l") == 0);
    int narrow = view->itemsize == 4 && (strcmp(f, "i") == 0 || (sizeof(long) == 4 && strcmp(f, "l") == 0));
    if (!(wide && size != 4) && !(narrow && size != 8)) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous %s array, not format '%s' of %zd bytes", name,
                     size == 8 ? "int64" : size == 4 ? "int32" : "int32 or int64", view->format ? view->format : "B",
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

#endif
