/* pymodule_directory.c — Python type of directory.c (being written). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

int memos_directory_register(PyObject *m)
{
    (void)m;
    return 0;
}
