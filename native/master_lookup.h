/* The lookup half of kvstored._native_master (native/master_lookup.c), registered in the
 * method table of native/master.c. */
#ifndef KVSTORED_MASTER_LOOKUP_H
#define KVSTORED_MASTER_LOOKUP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *lk_ranked_rows(PyObject *self, PyObject *args);
PyObject *lk_lookup_wire(PyObject *self, PyObject *args);

#define MASTER_LOOKUP_METHODS                                                                                   \
    {"ranked_rows", lk_ranked_rows, METH_VARARGS,                                                               \
     "ranked_rows(cols, consts, slots, local_holder, avoid, width, out_rows, out_holders): each block's "        \
     "readable replicas on distinct holders, best first (ranking.ranked_rows)."},                               \
    {"lookup_wire", lk_lookup_wire, METH_VARARGS,                                                               \
     "lookup_wire(table, cols, consts, request, local_holder, avoid, alternates, ranked, every_key) -> tuple | " \
     "None: a serialized MasterLookupPrefixRequest's answer as the response's wire columns (None: a key is not " \
     "16 bytes)."},

#endif
