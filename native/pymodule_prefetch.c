/* pymodule_prefetch.c — Python type of prefetch.c (being written). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

int memos_prefetch_register(PyObject *m)
{
    (void)m;
    return 0;
}
