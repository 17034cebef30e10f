/* Buffer arguments of the kvstored._native_master functions (native/master_lookup.c).
 *
 * Each function takes numpy columns through the buffer protocol (no copy), checks each one's
 * item size and format class, and releases every buffer it took on every exit path.
 */
#ifndef KVSTORED_MASTER_BUFFERS_H
#define KVSTORED_MASTER_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MB_U64 "LQ"
#define MB_I64 "lq"
#define MB_I32 "i"
#define MB_U32 "I"
#define MB_U8 "B"
#define MB_BOOL "?B"
#define MB_F64 "d"

/* Group prefetching of the master's lookups (Chen, Ailamaki, Gibbons, Mowry, "Improving Hash
 * Join Performance through Prefetching", ICDE 2004; MICA's batched lookups, Lim et al., NSDI
 * 2014): a batch is taken MB_PREFETCH_GROUP keys at a time, each stage issuing the loads the
 * next one needs (key-table buckets, then head entries, then rows) for the whole group before
 * any is used, so that a group's cache misses overlap instead of one dependent miss after the
 * other. 32: measured against 8, 16 and 64 on a 10M-block index (bench_master.py's lookup;
 * 16 and 32 within noise, 8 slower, 64 slower on random keys); a group's lines (~32 x 7) stay
 * in L1/L2 until used. Prefetches never fault and change no result. */
#ifndef MB_PREFETCH_GROUP
#define MB_PREFETCH_GROUP 32
#endif
/* A key table's bucket (kvstored/master/keytable.py BUCKET_DTYPE): its 3 ways' low words, high
 * words and slots (-1 free), and its overflow flag, in one 64-byte cache line (the table is
 * 64-byte aligned), so that a probe of a key in its home bucket costs one miss, not three. */
#define MB_BUCKET_WAYS 3 /* kvstored/master/keytable.py WAYS */
#define MB_KT_MULT 0x9E3779B97F4A7C15ULL
typedef struct {
    uint64_t lo[MB_BUCKET_WAYS];
    uint64_t hi[MB_BUCKET_WAYS];
    int32_t sl[MB_BUCKET_WAYS];
    uint8_t over;
    uint8_t pad[3];
} MbBucket;
_Static_assert(sizeof(MbBucket) == 64, "a key-table bucket is one cache line");

/* The home bucket of a key's low word in a table of 2**bits buckets (Fibonacci hashing). */
static inline uint64_t mb_home(uint64_t lo, int bits) { return (lo * MB_KT_MULT) >> (64 - bits); }

static inline void mb_prefetch_bucket(const MbBucket *t, uint64_t bk) { __builtin_prefetch(t + bk); }

/* KeyTable._probe: from the key's home bucket, a live entry with both words equal; a bucket
 * without its overflow flag ends the search (at most every bucket once). Returns the slot or
 * -1; *pos gets the entry (bucket * MB_BUCKET_WAYS + way) or -1. */
static inline int64_t mb_kt_probe(const MbBucket *t, int bits, uint64_t lo, uint64_t hi, int64_t *pos) {
    uint64_t mask = ((uint64_t)1 << bits) - 1, bk = mb_home(lo, bits);
    for (uint64_t step = 0; step <= mask; step++) {
        const MbBucket *e = t + bk;
        for (int w = 0; w < MB_BUCKET_WAYS; w++) {
            if (e->lo[w] == lo && e->hi[w] == hi && e->sl[w] >= 0) {
                *pos = (int64_t)(bk * MB_BUCKET_WAYS + (uint64_t)w);
                return e->sl[w];
            }
        }
        if (!e->over) break;
        bk = (bk + 1) & mask;
    }
    *pos = -1;
    return -1;
}

/* Whether ``n_bytes`` at ``p`` are the 2**bits buckets of a key table (KeyTable.probe_buffers):
 * 0, else -1 with a ValueError naming what was wrong (the caller releases its buffers). */
static inline int mb_check_buckets(const void *p, Py_ssize_t n_bytes, int bits, const char *fn) {
    if (bits < 1 || bits > 40) {
        PyErr_Format(PyExc_ValueError, "%s: bits must be in 1..40, got %d", fn, bits);
        return -1;
    }
    Py_ssize_t nb = (Py_ssize_t)1 << bits;
    if (n_bytes != nb * (Py_ssize_t)sizeof(MbBucket) || ((uintptr_t)p & 63) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s: buckets must be %zd buckets (bits %d) of %zd bytes, 64-byte aligned; got %zd bytes at "
                     "offset %d from a 64-byte line", fn, nb, bits, (Py_ssize_t)sizeof(MbBucket), n_bytes,
                     (int)((uintptr_t)p & 63));
        return -1;
    }
    return 0;
}

/* What a ranking reads of row ``r`` (its holder, state, tier and link). */
static inline void mb_prefetch_row(const int32_t *next, const uint32_t *holder, const uint8_t *state,
                                   const uint8_t *tier, int64_t r) {
    __builtin_prefetch(next + r);
    __builtin_prefetch(holder + r);
    __builtin_prefetch(state + r);
    __builtin_prefetch(tier + r);
}

#define MB_MAX 24
typedef struct {
    Py_buffer v[MB_MAX];
    int n;
} MBufs;

static void mb_release(MBufs *b) {
    for (int i = 0; i < b->n; i++) PyBuffer_Release(&b->v[i]);
    b->n = 0;
}

/* Take one C-contiguous buffer of ``itemsize``-byte items of one of ``formats`` into ``b``;
 * returns its data, or NULL with ValueError set and every buffer of ``b`` released. */
static void *mb_take(MBufs *b, PyObject *obj, Py_ssize_t itemsize, const char *formats, int writable,
                     const char *fn, const char *name, Py_ssize_t *count) {
    if (b->n >= MB_MAX) {
        mb_release(b);
        PyErr_Format(PyExc_SystemError, "%s: too many buffers", fn);
        return NULL;
    }
    Py_buffer *view = &b->v[b->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        mb_release(b);
        PyErr_Format(PyExc_ValueError, "%s: %s must be a %sC-contiguous buffer, got %s", fn, name,
                     writable ? "writable " : "", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    const char *f = view->format ? view->format : "B";
    while (*f == '@' || *f == '=' || *f == '<') f++;
    if (view->itemsize != itemsize || f[0] == 0 || f[1] != 0 || strchr(formats, f[0]) == NULL) {
        PyErr_Format(PyExc_ValueError, "%s: %s must hold %zd-byte items of format '%s', got format '%s'", fn, name,
                     itemsize, formats, view->format ? view->format : "B");
        PyBuffer_Release(view);
        mb_release(b);
        return NULL;
    }
    b->n++;
    *count = view->len / itemsize;
    return view->buf;
}

/* ---- protobuf wire reading and writing ---------------------------------------------------- */
typedef struct {
    const uint8_t *p, *end;
} MbRd;

static int mb_varint(MbRd *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return -1;
        uint8_t c = *r->p++;
        v |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Skip one field of wire type wt; -1 on a malformed or group field. */
static int mb_skip(MbRd *r, int wt) {
    uint64_t v;
    switch (wt) {
    case 0: return mb_varint(r, &v);
    case 1: if (r->end - r->p < 8) return -1; r->p += 8; return 0;
    case 5: if (r->end - r->p < 4) return -1; r->p += 4; return 0;
    case 2:
        if (mb_varint(r, &v) != 0 || v > (uint64_t)(r->end - r->p)) return -1;
        r->p += v;
        return 0;
    default: return -1;
    }
}

static uint8_t *mb_put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static size_t mb_varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A packed repeated field (nothing when n is 0, as protobuf writes an empty one); at most
 * 2 x 10 + 10 x n bytes. */
static uint8_t *mb_put_packed(uint8_t *p, int field, const uint64_t *vals, Py_ssize_t n) {
    if (n == 0) return p;
    size_t len = 0;
    for (Py_ssize_t i = 0; i < n; i++) len += mb_varint_len(vals[i]);
    p = mb_put_varint(p, ((uint64_t)field << 3) | 2);
    p = mb_put_varint(p, len);
    for (Py_ssize_t i = 0; i < n; i++) p = mb_put_varint(p, vals[i]);
    return p;
}

#endif
