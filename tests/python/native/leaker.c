/* A C extension for the host-leak Python-frames tests: leak(n) allocates n bytes with malloc
 * and keeps them; churn(n) allocates n bytes and frees them at once. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

static PyObject *leak(PyObject *self, PyObject *args) {
  Py_ssize_t n;
  if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
  char *p = malloc((size_t)n);
  if (p == NULL) return PyErr_NoMemory();
  memset(p, 1, (size_t)n);
  Py_RETURN_NONE;
}

static PyObject *churn(PyObject *self, PyObject *args) {
  Py_ssize_t n;
  if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
  char *volatile p = malloc((size_t)n);
  if (p == NULL) return PyErr_NoMemory();
  p[0] = 1;
  free(p);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"leak", leak, METH_VARARGS, "Allocates n bytes and keeps them."},
    {"churn", churn, METH_VARARGS, "Allocates n bytes and frees them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "leaker", NULL, -1, methods};

PyMODINIT_FUNC PyInit_leaker(void) { return PyModule_Create(&module); }
