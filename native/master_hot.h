/* The master index's hot-chain maps owned by C: kvstored._native_master.HotChains.
 *
 * A block whose chain is longer than HOT_CHAIN_ROWS (kvstored/master/columns.py) keeps maps
 * of its rows so that finding a holder's row and a row's predecessor is O(1), not a walk of
 * up to one row per node. The pure-Python version (columns.py ``PyHotChains``: a dict of
 * ``HotChain`` dicts per slot) costs ~140 B and ~3 us per touched row (a Python int per key,
 * a cache miss per dict); here the same three maps are open-addressing tables of plain
 * integers (linear probing, Fibonacci hash, backward-shift deletion, at most half full):
 *
 *   rows   (slot << 32 | holder * 4 + tier) -> row   (HotChain.rows of every hot chain)
 *   prev   row -> its predecessor in its chain, -1 for the head   (HotChain.prev)
 *   count  slot -> rows in its chain's maps   (len(HotChain.prev); a slot is hot iff here)
 *
 * 12 bytes per entry (an 8-byte key, a 4-byte value), two entries per hot row: 48-96 B per
 * hot row by the fill (~24 B/row more for the count map's share is negligible: one per chain).
 * The same operations as PyHotChains, with the same results (tests/unit/master/
 * test_master_native.py compares their snapshots after the same events); the C loops
 * (find_rows, unlink_rows, apply_events in master.c) call the ht_* functions directly.
 */
#ifndef KVSTORED_MASTER_HOT_H
#define KVSTORED_MASTER_HOT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HM_EMPTY UINT64_MAX
#define HM_MULT 0x9E3779B97F4A7C15ULL
#define HM_MIN_BITS 4

typedef struct {
    uint64_t *keys; /* HM_EMPTY = free */
    int32_t *vals;
    uint64_t mask;
    int bits;
    Py_ssize_t used;
} HMap;

static inline uint64_t hm_home(const HMap *m, uint64_t k) { return (k * HM_MULT) >> (64 - m->bits); }

static int hm_alloc(HMap *m, int bits) {
    size_t cap = (size_t)1 << bits;
    uint64_t *keys = PyMem_RawMalloc(cap * sizeof(uint64_t));
    int32_t *vals = PyMem_RawMalloc(cap * sizeof(int32_t));
    if (!keys || !vals) {
        PyMem_RawFree(keys);
        PyMem_RawFree(vals);
        PyErr_NoMemory();
        return -1;
    }
    memset(keys, 0xFF, cap * sizeof(uint64_t));
    m->keys = keys;
    m->vals = vals;
    m->bits = bits;
    m->mask = cap - 1;
    m->used = 0;
    return 0;
}

static void hm_free(HMap *m) {
    PyMem_RawFree(m->keys);
    PyMem_RawFree(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->used = 0;
}

/* The entry index holding k, or -1. */
static inline int64_t hm_find(const HMap *m, uint64_t k) {
    for (uint64_t i = hm_home(m, k);; i = (i + 1) & m->mask) {
        uint64_t e = m->keys[i];
        if (e == k) return (int64_t)i;
        if (e == HM_EMPTY) return -1;
    }
}

static inline int64_t hm_get(const HMap *m, uint64_t k, int64_t dflt) {
    int64_t i = hm_find(m, k);
    return i < 0 ? dflt : m->vals[i];
}

static void hm_place(HMap *m, uint64_t k, int32_t v) { /* k absent, room left */
    uint64_t i = hm_home(m, k);
    while (m->keys[i] != HM_EMPTY) i = (i + 1) & m->mask;
    m->keys[i] = k;
    m->vals[i] = v;
    m->used++;
}

/* Room for one more entry (doubled when it would be more than half full); -1: no memory. */
static int hm_room(HMap *m) {
    if (2 * (m->used + 1) <= (Py_ssize_t)(m->mask + 1)) return 0;
    HMap old = *m;
    if (hm_alloc(m, old.bits + 1) != 0) {
        *m = old;
        return -1;
    }
    for (uint64_t i = 0; i <= old.mask; i++)
        if (old.keys[i] != HM_EMPTY) hm_place(m, old.keys[i], old.vals[i]);
    hm_free(&old);
    return 0;
}

/* m[k] = v; -1: no memory (nothing changed). */
static int hm_put(HMap *m, uint64_t k, int32_t v) {
    int64_t i = hm_find(m, k);
    if (i >= 0) {
        m->vals[i] = v;
        return 0;
    }
    if (hm_room(m) != 0) return -1;
    hm_place(m, k, v);
    return 0;
}

/* del m[k] (backward-shift: no tombstones); returns 1 if it was there. */
static int hm_del(HMap *m, uint64_t k) {
    int64_t f = hm_find(m, k);
    if (f < 0) return 0;
    uint64_t i = (uint64_t)f, j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        uint64_t e = m->keys[j];
        if (e == HM_EMPTY) break;
        uint64_t h = hm_home(m, e);
        if (((j - h) & m->mask) >= ((j - i) & m->mask)) { /* i lies on e's probe path: move it */
            m->keys[i] = e;
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = HM_EMPTY;
    m->used--;
    return 1;
}

typedef struct {
    PyObject_HEAD HMap rows, prev, count;
} HotObj;

static PyTypeObject HotChainsType;

static inline uint64_t ht_rkey(int64_t slot, int64_t ht) { return ((uint64_t)slot << 32) | (uint64_t)(uint32_t)ht; }

/* Rows in the slot's maps, or -1 when the slot is not hot. */
static inline int64_t ht_count(const HotObj *h, int64_t slot) {
    if (h->count.used == 0) return -1;
    return hm_get(&h->count, (uint64_t)slot, -1);
}

/* (holder, tier) -> row of a hot slot (-1: none); *prev its predecessor when found. */
static inline int64_t ht_find(const HotObj *h, int64_t slot, int64_t ht, int64_t *prev) {
    int64_t r = hm_get(&h->rows, ht_rkey(slot, ht), -1);
    if (prev) *prev = r >= 0 ? hm_get(&h->prev, (uint64_t)r, -1) : -1;
    return r;
}

/* Fetch ahead the buckets a hot slot's next touch reads: its (holder, tier) entry and the
 * predecessor entry of its head (a no-op for a slot that is not hot). */
static inline void ht_prefetch(const HotObj *h, int64_t slot, int64_t ht, int64_t head_row) {
    if (ht_count(h, slot) < 0) return;
    uint64_t i = hm_home(&h->rows, ht_rkey(slot, ht));
    __builtin_prefetch(&h->rows.keys[i]);
    __builtin_prefetch(&h->rows.vals[i]);
    if (head_row >= 0) {
        uint64_t j = hm_home(&h->prev, (uint64_t)head_row);
        __builtin_prefetch(&h->prev.keys[j]);
        __builtin_prefetch(&h->prev.vals[j]);
    }
}

/* The rows of a chain, walked from head (IndexColumns.make_hot); -1: no memory. */
static int ht_make(HotObj *h, int64_t slot, const int32_t *head, const int32_t *next, const uint32_t *holder,
                   const uint8_t *tier, Py_ssize_t nrows) {
    int32_t n = 0;
    int64_t p = -1;
    for (int64_t r = head[slot]; r >= 0; p = r, r = next[r], n++)
        if (r >= nrows || n >= nrows) {
            PyErr_Format(PyExc_ValueError, "HotChains: the chain of slot %lld is inconsistent (row %lld, %d rows)",
                         (long long)slot, (long long)r, n);
            return -1;
        } else if (hm_put(&h->rows, ht_rkey(slot, (int64_t)holder[r] * 4 + tier[r]), (int32_t)r) != 0 ||
            hm_put(&h->prev, (uint64_t)r, (int32_t)p) != 0)
            return -1;
    return hm_put(&h->count, (uint64_t)slot, n);
}

/* HotChain.add_head: row became the head before old_head (-1: the chain was empty). */
static int ht_add_head(HotObj *h, int64_t slot, int64_t row, int64_t old_head, int64_t ht) {
    Py_ssize_t before = h->prev.used; /* the count is len(HotChain.prev): its new keys */
    if (hm_put(&h->rows, ht_rkey(slot, ht), (int32_t)row) != 0 || hm_put(&h->prev, (uint64_t)row, -1) != 0 ||
        (old_head >= 0 && hm_put(&h->prev, (uint64_t)old_head, (int32_t)row) != 0))
        return -1;
    int64_t c = hm_find(&h->count, (uint64_t)slot);
    if (c >= 0) h->count.vals[c] += (int32_t)(h->prev.used - before);
    return 0;
}

/* HotChain.remove: row (followed by nxt) left the slot's chain. Returns the rows left in the
 * chain's maps; -1 with RuntimeError set when the row has no map entry (inconsistent). */
static int64_t ht_remove(HotObj *h, int64_t slot, int64_t row, int64_t nxt, int64_t ht) {
    int64_t pi = hm_find(&h->prev, (uint64_t)row);
    if (pi < 0) {
        PyErr_Format(PyExc_RuntimeError, "HotChains: row %lld of hot slot %lld has no predecessor entry",
                     (long long)row, (long long)slot);
        return -1;
    }
    int32_t p = h->prev.vals[pi];
    Py_ssize_t before = h->prev.used;
    hm_del(&h->prev, (uint64_t)row);
    if (nxt >= 0) {
        int64_t ni = hm_find(&h->prev, (uint64_t)nxt);
        if (ni >= 0)
            h->prev.vals[ni] = p;
        else if (hm_put(&h->prev, (uint64_t)nxt, p) != 0)
            return -1;
    }
    uint64_t rk = ht_rkey(slot, ht);
    if (hm_get(&h->rows, rk, -1) == row) hm_del(&h->rows, rk);
    int64_t c = hm_find(&h->count, (uint64_t)slot);
    if (c < 0) return 0;
    h->count.vals[c] += (int32_t)(h->prev.used - before);
    return h->count.vals[c];
}

/* The slot's maps dropped (rows: its chain's rows now, walked from head). */
static void ht_drop(HotObj *h, int64_t slot, const int32_t *head, const int32_t *next, const uint32_t *holder,
                    const uint8_t *tier) {
    for (int64_t r = head[slot]; r >= 0; r = next[r]) {
        uint64_t rk = ht_rkey(slot, (int64_t)holder[r] * 4 + tier[r]);
        if (hm_get(&h->rows, rk, -1) == r) hm_del(&h->rows, rk);
        hm_del(&h->prev, (uint64_t)r);
    }
    hm_del(&h->count, (uint64_t)slot);
}

/* ---- the Python type: the PyHotChains interface (kvstored/master/columns.py) ---- */

static int ht_init_maps(HotObj *h) {
    if (hm_alloc(&h->rows, HM_MIN_BITS) != 0) return -1;
    if (hm_alloc(&h->prev, HM_MIN_BITS) != 0) {
        hm_free(&h->rows);
        return -1;
    }
    if (hm_alloc(&h->count, HM_MIN_BITS) != 0) {
        hm_free(&h->rows);
        hm_free(&h->prev);
        return -1;
    }
    return 0;
}

static PyObject *hot_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "HotChains() takes no arguments");
        return NULL;
    }
    HotObj *h = (HotObj *)type->tp_alloc(type, 0);
    if (!h) return NULL;
    if (ht_init_maps(h) != 0) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

static void hot_dealloc(HotObj *h) {
    hm_free(&h->rows);
    hm_free(&h->prev);
    hm_free(&h->count);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static Py_ssize_t hot_len(HotObj *h) { return h->count.used; }

/* Checked arguments: slot in [0, 2**31), row in [-1, 2**31), ht in [0, 2**32). */
static int ht_arg(PyObject *o, int64_t lo, int64_t hi, const char *what, int64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < lo || v >= hi) {
        PyErr_Format(PyExc_ValueError, "HotChains: %s must be in [%lld, %lld), got %lld", what, (long long)lo,
                     (long long)hi, v);
        return -1;
    }
    *out = v;
    return 0;
}
#define SLOT_ARG(o, v) ht_arg(o, 0, (int64_t)1 << 31, "slot", v)
#define ROW_ARG(o, v) ht_arg(o, 0, (int64_t)1 << 31, "row", v)
#define LINK_ARG(o, v) ht_arg(o, -1, (int64_t)1 << 31, "a linked row (-1 none)", v)
#define HT_ARG(o, v) ht_arg(o, 0, (int64_t)1 << 32, "holder * 4 + tier", v)

static int hot_contains(HotObj *h, PyObject *o) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    return v >= 0 && v < ((long long)1 << 31) && ht_count(h, v) >= 0;
}

static int hot_args(PyObject *args, Py_ssize_t n, const char *fn, PyObject **out) {
    if (PyTuple_GET_SIZE(args) != n) {
        PyErr_Format(PyExc_TypeError, "HotChains.%s takes %zd arguments, got %zd", fn, n, PyTuple_GET_SIZE(args));
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) out[i] = PyTuple_GET_ITEM(args, i);
    return 0;
}

static PyObject *hot_find(HotObj *h, PyObject *args) {
    PyObject *a[2];
    int64_t slot, ht, prev;
    if (hot_args(args, 2, "find", a) || SLOT_ARG(a[0], &slot) || HT_ARG(a[1], &ht)) return NULL;
    if (ht_count(h, slot) < 0) Py_RETURN_NONE;
    int64_t r = ht_find(h, slot, ht, &prev);
    return Py_BuildValue("(LL)", (long long)r, (long long)prev);
}

static PyObject *hot_prev_of(HotObj *h, PyObject *args) {
    PyObject *a[2];
    int64_t slot, row;
    if (hot_args(args, 2, "prev_of", a) || SLOT_ARG(a[0], &slot) || ROW_ARG(a[1], &row)) return NULL;
    if (ht_count(h, slot) < 0) Py_RETURN_NONE;
    int64_t i = hm_find(&h->prev, (uint64_t)row);
    if (i < 0) {
        PyErr_Format(PyExc_KeyError, "HotChains.prev_of: row %lld is not in hot slot %lld's maps", (long long)row,
                     (long long)slot);
        return NULL;
    }
    return PyLong_FromLong(h->prev.vals[i]);
}

static PyObject *hot_make(HotObj *h, PyObject *args) {
    PyObject *a[3];
    int64_t slot;
    if (hot_args(args, 3, "make", a) || SLOT_ARG(a[0], &slot)) return NULL;
    if (!PyList_Check(a[1]) || !PyList_Check(a[2]) || PyList_GET_SIZE(a[1]) != PyList_GET_SIZE(a[2])) {
        PyErr_SetString(PyExc_TypeError, "HotChains.make(slot, rows, hts): rows and hts must be lists of one length");
        return NULL;
    }
    if (ht_count(h, slot) >= 0) {
        PyErr_Format(PyExc_ValueError, "HotChains.make: slot %lld is hot already", (long long)slot);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(a[1]);
    int64_t p = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r, ht;
        if (ROW_ARG(PyList_GET_ITEM(a[1], i), &r) || HT_ARG(PyList_GET_ITEM(a[2], i), &ht)) return NULL;
        if (hm_put(&h->rows, ht_rkey(slot, ht), (int32_t)r) || hm_put(&h->prev, (uint64_t)r, (int32_t)p)) return NULL;
        p = r;
    }
    if (hm_put(&h->count, (uint64_t)slot, (int32_t)n) != 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *hot_add_head_m(HotObj *h, PyObject *args) {
    PyObject *a[4];
    int64_t slot, row, old, ht;
    if (hot_args(args, 4, "add_head", a) || SLOT_ARG(a[0], &slot) || ROW_ARG(a[1], &row) || LINK_ARG(a[2], &old) ||
        HT_ARG(a[3], &ht))
        return NULL;
    if (ht_count(h, slot) < 0) {
        PyErr_Format(PyExc_KeyError, "HotChains.add_head: slot %lld is not hot", (long long)slot);
        return NULL;
    }
    if (ht_add_head(h, slot, row, old, ht) != 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *hot_remove_m(HotObj *h, PyObject *args) {
    PyObject *a[4];
    int64_t slot, row, nxt, ht;
    if (hot_args(args, 4, "remove", a) || SLOT_ARG(a[0], &slot) || ROW_ARG(a[1], &row) || LINK_ARG(a[2], &nxt) ||
        HT_ARG(a[3], &ht))
        return NULL;
    if (ht_count(h, slot) < 0) return PyLong_FromLong(-1);
    int64_t left = ht_remove(h, slot, row, nxt, ht);
    if (left < 0) return NULL;
    return PyLong_FromLongLong(left);
}

static PyObject *hot_drop_m(HotObj *h, PyObject *args) {
    PyObject *a[3];
    int64_t slot;
    if (hot_args(args, 3, "drop", a) || SLOT_ARG(a[0], &slot)) return NULL;
    if (!PyList_Check(a[1]) || !PyList_Check(a[2]) || PyList_GET_SIZE(a[1]) != PyList_GET_SIZE(a[2])) {
        PyErr_SetString(PyExc_TypeError, "HotChains.drop(slot, rows, hts): rows and hts must be lists of one length");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(a[1]); i++) {
        int64_t r, ht;
        if (ROW_ARG(PyList_GET_ITEM(a[1], i), &r) || HT_ARG(PyList_GET_ITEM(a[2], i), &ht)) return NULL;
        uint64_t rk = ht_rkey(slot, ht);
        if (hm_get(&h->rows, rk, -1) == r) hm_del(&h->rows, rk);
        hm_del(&h->prev, (uint64_t)r);
    }
    hm_del(&h->count, (uint64_t)slot);
    Py_RETURN_NONE;
}

static PyObject *hot_slots(HotObj *h, PyObject *noargs) {
    (void)noargs;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (uint64_t i = 0; i <= h->count.mask; i++) {
        if (h->count.keys[i] == HM_EMPTY) continue;
        PyObject *v = PyLong_FromUnsignedLongLong(h->count.keys[i]);
        if (!v || PyList_Append(out, v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    if (PyList_Sort(out) != 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static int set_ll(PyObject *d, long long k, long long v) {
    PyObject *ko = PyLong_FromLongLong(k), *vo = PyLong_FromLongLong(v);
    int rc = (ko && vo) ? PyDict_SetItem(d, ko, vo) : -1;
    Py_XDECREF(ko);
    Py_XDECREF(vo);
    return rc;
}

/* snapshot() -> (counts {slot: rows}, rows {slot: {ht: row}}, prev {row: prev}) */
static PyObject *hot_snapshot(HotObj *h, PyObject *noargs) {
    (void)noargs;
    PyObject *counts = PyDict_New(), *rows = PyDict_New(), *prev = PyDict_New();
    if (!counts || !rows || !prev) goto fail;
    for (uint64_t i = 0; i <= h->count.mask; i++) {
        if (h->count.keys[i] == HM_EMPTY) continue;
        if (set_ll(counts, (long long)h->count.keys[i], h->count.vals[i])) goto fail;
        PyObject *d = PyDict_New(), *k = PyLong_FromUnsignedLongLong(h->count.keys[i]);
        int rc = (d && k) ? PyDict_SetItem(rows, k, d) : -1;
        Py_XDECREF(d);
        Py_XDECREF(k);
        if (rc) goto fail;
    }
    for (uint64_t i = 0; i <= h->rows.mask; i++) {
        uint64_t k = h->rows.keys[i];
        if (k == HM_EMPTY) continue;
        PyObject *ko = PyLong_FromUnsignedLongLong(k >> 32);
        if (!ko) goto fail;
        PyObject *d = PyDict_GetItemWithError(rows, ko); /* borrowed */
        if (!d && !PyErr_Occurred()) { /* (an entry of a slot not hot: shown under it anyway) */
            d = PyDict_New();
            if (d && PyDict_SetItem(rows, ko, d) != 0) Py_CLEAR(d);
            Py_XDECREF(d); /* rows holds it */
        }
        Py_DECREF(ko);
        if (!d || set_ll(d, (long long)(k & 0xFFFFFFFFULL), h->rows.vals[i])) goto fail;
    }
    for (uint64_t i = 0; i <= h->prev.mask; i++)
        if (h->prev.keys[i] != HM_EMPTY && set_ll(prev, (long long)h->prev.keys[i], h->prev.vals[i])) goto fail;
    return Py_BuildValue("(NNN)", counts, rows, prev);
fail:
    Py_XDECREF(counts);
    Py_XDECREF(rows);
    Py_XDECREF(prev);
    return NULL;
}

static PyObject *hot_num_rows(HotObj *h, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(h->prev.used);
}

static PyObject *hot_nbytes(HotObj *h, void *closure) {
    (void)closure;
    size_t per = sizeof(uint64_t) + sizeof(int32_t);
    return PyLong_FromSize_t(per * (h->rows.mask + 1 + h->prev.mask + 1 + h->count.mask + 1));
}

static PyMethodDef hot_methods[] = {
    {"find", (PyCFunction)hot_find, METH_VARARGS,
     "find(slot, ht) -> (row, prev) | None: the row of holder * 4 + tier in a hot slot's chain and its "
     "predecessor ((-1, -1): none); None when the slot is not hot."},
    {"prev_of", (PyCFunction)hot_prev_of, METH_VARARGS,
     "prev_of(slot, row) -> int | None: a row's predecessor in a hot slot's chain (-1: the head); None when the "
     "slot is not hot. Raises KeyError for a row not in its maps."},
    {"make", (PyCFunction)hot_make, METH_VARARGS,
     "make(slot, rows, hts): maps for a chain (rows from its head, hts their holder * 4 + tier)."},
    {"add_head", (PyCFunction)hot_add_head_m, METH_VARARGS,
     "add_head(slot, row, old_head, ht): row became the hot slot's head before old_head (-1: none)."},
    {"remove", (PyCFunction)hot_remove_m, METH_VARARGS,
     "remove(slot, row, nxt, ht) -> int: row (followed by nxt, -1 none) left the chain; the rows left in its "
     "maps, or -1 when the slot is not hot."},
    {"drop", (PyCFunction)hot_drop_m, METH_VARARGS,
     "drop(slot, rows, hts): the slot's maps dropped (rows: the chain's rows now, hts theirs)."},
    {"slots", (PyCFunction)hot_slots, METH_NOARGS, "slots() -> list: the hot slots, ascending."},
    {"snapshot", (PyCFunction)hot_snapshot, METH_NOARGS,
     "snapshot() -> (counts, rows, prev): {slot: rows in its maps}, {slot: {ht: row}}, {row: prev}."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef hot_getset[] = {
    {"num_rows", (getter)hot_num_rows, NULL, "rows in every hot chain's maps", NULL},
    {"nbytes", (getter)hot_nbytes, NULL, "bytes of the three tables (capacity included)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods hot_as_sequence = {
    .sq_length = (lenfunc)hot_len,
    .sq_contains = (objobjproc)hot_contains,
};

static PyTypeObject HotChainsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstored._native_master.HotChains",
    .tp_basicsize = sizeof(HotObj),
    .tp_dealloc = (destructor)hot_dealloc,
    .tp_as_sequence = &hot_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The hot chains' maps of a block index, owned by C (native/master_hot.h; the interface of "
              "kvstored.master.columns.PyHotChains).",
    .tp_methods = hot_methods,
    .tp_getset = hot_getset,
    .tp_new = hot_new,
};

#endif
