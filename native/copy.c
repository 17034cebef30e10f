/* kvstored._native: copy a batch of blocks between buffers with the GIL released.
 *
 * copy_many(pairs, threads=0, stream=False) -> int
 *     pairs: a sequence of (dst, src) objects with the buffer protocol (dst writable), C
 *     contiguous, len(dst) == len(src). All buffers are acquired first (so no exporter can
 *     resize or close one meanwhile), then the GIL is released and the bytes are copied with
 *     memcpy: by this thread when the batch is small, else by `threads` POSIX threads, each
 *     copying one contiguous share of the batch's bytes (a share may span blocks).
 *     threads=0 picks a quarter of the online CPUs (1 to 4). stream=True: pieces of 64 KiB
 *     and more are copied with non-temporal stores (x86-64; memcpy elsewhere), then an
 *     sfence (a put's copy into the arena: see stream_copy). Returns the bytes copied.
 *     Raises TypeError (not a pair / no buffer), ValueError (length mismatch, read-only dst),
 *     naming the pair's index and what was received.
 *
 * Kept small on purpose: the pure-Python fallback (kvstored/native.py) does the same copies
 * one block at a time, and tests/unit/test_native.py runs both on the same inputs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__) && (defined(__x86_64__) || defined(__i386__))
#include <emmintrin.h>
#endif

/* xxHash 0.8.1 (BSD-2-Clause, native/third_party/xxhash/), header-only: the XXH3-128 the
 * Python side computes with the `xxhash` package (kvstored/tiers/slots.py ident). */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "third_party/xxhash/xxhash.h"

#define MAX_THREADS 16
/* Below this many bytes per batch one thread copies everything: starting threads costs
 * ~20-50 us, and a batch that fits the cache copies fastest on one core. */
#define THREADED_MIN_BYTES (16u << 20)

typedef struct {
    char *dst;
    const char *src;
    size_t len;
} seg_t;

typedef struct {
    const seg_t *segs;
    size_t nsegs;
    size_t begin; /* byte offset into the concatenation of all segments */
    size_t end;
    int stream; /* non-temporal stores for pieces of STREAM_MIN_BYTES and more */
} share_t;

/* Pieces of at least this many bytes are copied with non-temporal stores when asked
 * (copy_many(stream=True)): below it the destination's cache lines are cheap to own. */
#define STREAM_MIN_BYTES (64u << 10)

/* Copies of at least this many bytes whose destination sits 1-63 bytes past the source
 * modulo 4 KiB take vector_copy instead of memcpy (see copy_bytes). */
#define ALIAS_MIN_BYTES 4096u

#if defined(__SSE2__) && (defined(__x86_64__) || defined(__i386__))
/* The SSE2 copy loop of vector_copy and stream_copy: the head up to the destination's
 * `align`-byte boundary by memcpy, then 64 bytes a turn of unaligned 16-byte loads and
 * aligned stores (`stream`: non-temporal ones, then an sfence), the tail by memcpy. Both
 * callers pass constants, so the branches fold away. */
static inline __attribute__((always_inline)) void sse2_copy(char *dst, const char *src, size_t n,
                                                            size_t align, int stream) {
    size_t head = (align - ((uintptr_t)dst & (align - 1))) & (align - 1);
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    while (n >= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        if (stream) {
            _mm_stream_si128((__m128i *)dst, a);
            _mm_stream_si128((__m128i *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(dst + 48), d);
        } else {
            _mm_store_si128((__m128i *)dst, a);
            _mm_store_si128((__m128i *)(dst + 16), b);
            _mm_store_si128((__m128i *)(dst + 32), c);
            _mm_store_si128((__m128i *)(dst + 48), d);
        }
        src += 64;
        dst += 64;
        n -= 64;
    }
    if (stream)
        _mm_sfence();
    memcpy(dst, src, n);
}

/* Unaligned 16-byte loads, stores aligned to the destination's cache line (the head before
 * it by memcpy): the plain loop glibc's memcpy would run if it did not pick `rep movsb`. */
static void vector_copy(char *dst, const char *src, size_t n) { sse2_copy(dst, src, n, 64, 0); }
#endif

/* memcpy, except where `rep movsb` meets 4 KiB aliasing: when the destination is 1-63 bytes
 * past the source modulo 4096 ((dst - src) & 4095 in 1..63), every store lands just ahead of
 * a load of the same page offset. glibc 2.36 copies 4 KiB .. L2-sized pieces with
 * `rep movsb` on this AMD EPYC VM, and there 16 x 256 KiB from a page-aligned source (an
 * arena block) into buffers 16 bytes past a page (numpy's and malloc's usual buffers) took
 * 4-8 ms cold instead of 0.7 ms, whatever the source's page size (docs/performance.md,
 * "The 256 KiB get and 4 KiB aliasing"). Those copies take vector_copy, which runs at
 * memcpy's speed at every distance; the others keep memcpy (x86-64; memcpy elsewhere). */
static inline void copy_bytes(char *dst, const char *src, size_t n) {
#if defined(__SSE2__) && (defined(__x86_64__) || defined(__i386__))
    if (n >= ALIAS_MIN_BYTES && ((((uintptr_t)dst - (uintptr_t)src) & 4095u) - 1u) < 63u) {
        vector_copy(dst, src, n);
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* memcpy with non-temporal (streaming) stores on x86-64: the destination's lines are not
 * read for ownership first nor kept in the cache (a put's blocks are read later, by other
 * processes, from memory): ~2x memcpy's speed into a shared-memory arena on the 2-core VM
 * of docs/performance.md. Ends with an sfence, so the bytes are globally visible before any
 * later store of this thread (the commit that publishes them is sent after the copy
 * returns). Elsewhere: memcpy. */
static void stream_copy(char *dst, const char *src, size_t n) {
#if defined(__SSE2__) && (defined(__x86_64__) || defined(__i386__))
    sse2_copy(dst, src, n, 16, 1);
#else
    memcpy(dst, src, n);
#endif
}

static void copy_range(const seg_t *segs, size_t nsegs, size_t begin, size_t end, int stream) {
    size_t pos = 0;
    for (size_t i = 0; i < nsegs && pos < end; i++) {
        size_t s0 = pos, s1 = pos + segs[i].len;
        pos = s1;
        if (s1 <= begin)
            continue;
        size_t a = begin > s0 ? begin - s0 : 0;
        size_t b = (end < s1 ? end : s1) - s0;
        if (stream && b - a >= STREAM_MIN_BYTES)
            stream_copy(segs[i].dst + a, segs[i].src + a, b - a);
        else
            copy_bytes(segs[i].dst + a, segs[i].src + a, b - a);
    }
}

static void *share_main(void *arg) {
    share_t *sh = (share_t *)arg;
    copy_range(sh->segs, sh->nsegs, sh->begin, sh->end, sh->stream);
    return NULL;
}

/* A quarter of the online CPUs, 1 to 4: measured on a 2-core VM, a second copying thread
 * made batches slower, not faster (the other core runs the rest of the process). Computed
 * once: sysconf(_SC_NPROCESSORS_ONLN) reads /sys on every call (~7 us, more than copying a
 * 16 x 4 KiB batch). A benign race: every thread computes the same value. */
static int default_threads(void) {
    static int cached = 0;
    if (cached == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN) / 4;
        if (n < 1)
            n = 1;
        cached = n < 4 ? (int)n : 4;
    }
    return cached;
}

static void copy_all(const seg_t *segs, size_t nsegs, size_t total, int threads, int stream) {
    if (threads <= 1 || total < THREADED_MIN_BYTES) {
        copy_range(segs, nsegs, 0, total, stream);
        return;
    }
    size_t step = (total + (size_t)threads - 1) / (size_t)threads;
    step = (step + 4095) & ~(size_t)4095; /* page-aligned shares */
    pthread_t tids[MAX_THREADS];
    share_t shares[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int n = 0;
    for (size_t b = 0; b < total && n < threads; b += step, n++)
        shares[n] = (share_t){segs, nsegs, b, b + step < total ? b + step : total, stream};
    /* share 0 runs on this thread, the others on new threads; a share whose thread fails
     * to start is copied here too */
    for (int t = 1; t < n; t++)
        started[t] = pthread_create(&tids[t], NULL, share_main, &shares[t]) == 0;
    share_main(&shares[0]);
    for (int t = 1; t < n; t++) {
        if (started[t])
            pthread_join(tids[t], NULL);
        else
            share_main(&shares[t]);
    }
}

static PyObject *copy_many(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"pairs", "threads", "stream", NULL};
    PyObject *pairs_obj;
    int threads = 0, stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|ip:copy_many", kwlist, &pairs_obj, &threads, &stream))
        return NULL;
    (void)self;
    if (threads < 0) {
        PyErr_Format(PyExc_ValueError, "copy_many: threads must be >= 0, got %d", threads);
        return NULL;
    }
    if (threads == 0)
        threads = default_threads();
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    PyObject *seq = PySequence_Fast(pairs_obj, "copy_many: pairs must be a sequence of (dst, src)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc((size_t)(2 * n + 1), sizeof(Py_buffer));
    seg_t *segs = PyMem_Calloc((size_t)(n + 1), sizeof(seg_t));
    Py_ssize_t held = 0; /* views[0 .. held) are acquired */
    size_t total = 0;
    PyObject *result = NULL;
    if (views == NULL || segs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "copy_many: pair #%zd must be a (dst, src) tuple, got %.100s",
                         i, Py_TYPE(pair)->tp_name);
            goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 0), &views[held], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "copy_many: dst of pair #%zd must be a writable C-contiguous buffer, got %.100s", i,
                         Py_TYPE(PyTuple_GET_ITEM(pair, 0))->tp_name);
            goto done;
        }
        held++;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 1), &views[held], PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "copy_many: src of pair #%zd must be a C-contiguous buffer, got %.100s",
                         i, Py_TYPE(PyTuple_GET_ITEM(pair, 1))->tp_name);
            goto done;
        }
        held++;
        Py_buffer *d = &views[held - 2], *s = &views[held - 1];
        if (d->len != s->len) {
            PyErr_Format(PyExc_ValueError, "copy_many: pair #%zd: dst is %zd bytes but src is %zd", i, d->len,
                         s->len);
            goto done;
        }
        segs[i] = (seg_t){(char *)d->buf, (const char *)s->buf, (size_t)d->len};
        total += (size_t)d->len;
    }
    Py_BEGIN_ALLOW_THREADS
    copy_all(segs, (size_t)n, total, threads, stream);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSize_t(total);
done:
    if (views != NULL)
        for (Py_ssize_t i = 0; i < held; i++)
            PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(segs);
    Py_DECREF(seq);
    return result;
}

/* copy_checked(dst, src, versions, index, expected) -> bool
 *     The one-sided read of kvstored/tiers/slots.py: keep the bytes of src copied into dst
 *     only if versions[index] (a u64 slot version in shared memory) was `expected` (even)
 *     before and after the copy. Seqlock reader: an acquire load of the version, the copy,
 *     an acquire fence, a relaxed re-load (on arm64 the fence orders the copy's loads before
 *     the re-load; on x86 it is a compiler barrier). The GIL is released for copies of at
 *     least 64 KiB. Raises ValueError (lengths differ, dst read-only, index outside
 *     versions, versions not a u64-aligned buffer) naming what was received. */
static PyObject *copy_checked(PyObject *self, PyObject *args) {
    PyObject *dst_o, *src_o, *ver_o;
    Py_ssize_t index;
    unsigned long long expected;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnK:copy_checked", &dst_o, &src_o, &ver_o, &index, &expected))
        return NULL;
    Py_buffer d = {0}, s = {0}, v = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(dst_o, &d, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "copy_checked: dst must be a writable C-contiguous buffer, got %.100s",
                     Py_TYPE(dst_o)->tp_name);
        return NULL;
    }
    if (PyObject_GetBuffer(src_o, &s, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "copy_checked: src must be a C-contiguous buffer, got %.100s",
                     Py_TYPE(src_o)->tp_name);
        goto done;
    }
    if (PyObject_GetBuffer(ver_o, &v, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "copy_checked: versions must be a C-contiguous buffer, got %.100s",
                     Py_TYPE(ver_o)->tp_name);
        goto done;
    }
    if (d.len != s.len) {
        PyErr_Format(PyExc_ValueError, "copy_checked: dst is %zd bytes but src is %zd", d.len, s.len);
        goto done;
    }
    if (((uintptr_t)v.buf & 7) != 0 || index < 0 || (index + 1) * 8 > v.len) {
        PyErr_Format(PyExc_ValueError,
                     "copy_checked: index %zd outside the %zd u64 words of versions (or versions not 8-aligned)",
                     index, v.len / 8);
        goto done;
    }
    {
        const uint64_t *ver = (const uint64_t *)v.buf + index;
        int ok = 0;
        if ((expected & 1) == 0 && __atomic_load_n(ver, __ATOMIC_ACQUIRE) == expected) {
            if (d.len >= (64 << 10)) {
                Py_BEGIN_ALLOW_THREADS
                copy_bytes(d.buf, s.buf, (size_t)d.len);
                Py_END_ALLOW_THREADS
            } else {
                copy_bytes(d.buf, s.buf, (size_t)d.len);
            }
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            ok = __atomic_load_n(ver, __ATOMIC_RELAXED) == expected;
        }
        result = PyBool_FromLong(ok);
    }
done:
    if (v.obj != NULL)
        PyBuffer_Release(&v);
    if (s.obj != NULL)
        PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return result;
}

/* copy_checked_many(items, versions, stamp_ns) -> list[bool]
 *     copy_checked for a batch, the GIL released once: items is a sequence of
 *     (dst, src, index, expected) (index: the slot's version word in versions). Before each
 *     copy, when stamp_ns > 0, u64 versions[index + 5] (the slot's access_ns) is set to
 *     stamp_ns + i for item i (the reader's recency stamp: items come a prefix's tail first,
 *     so the head gets the latest stamps). Raises
 *     TypeError / ValueError naming the item index and what was wrong. */
typedef struct {
    char *dst;
    const char *src;
    size_t len;
    Py_ssize_t index;
    uint64_t expected;
} chk_t;

static PyObject *copy_checked_many(PyObject *self, PyObject *args) {
    PyObject *items_o, *ver_o;
    unsigned long long stamp;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOK:copy_checked_many", &items_o, &ver_o, &stamp))
        return NULL;
    PyObject *seq = PySequence_Fast(items_o, "copy_checked_many: items must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer v = {0};
    Py_buffer *views = PyMem_Calloc((size_t)(2 * n + 1), sizeof(Py_buffer));
    chk_t *c = PyMem_Calloc((size_t)(n + 1), sizeof(chk_t));
    char *ok = PyMem_Calloc((size_t)(n + 1), 1);
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    if (views == NULL || c == NULL || ok == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyObject_GetBuffer(ver_o, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0 || ((uintptr_t)v.buf & 7)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "copy_checked_many: versions must be a writable 8-aligned buffer");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t index;
        unsigned long long expected;
        PyObject *d_o, *s_o;
        if (!PyTuple_Check(it) || !PyArg_ParseTuple(it, "OOnK", &d_o, &s_o, &index, &expected)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "copy_checked_many: item #%zd must be (dst, src, index, expected), got %.100s",
                         i, Py_TYPE(it)->tp_name);
            goto done;
        }
        if (PyObject_GetBuffer(d_o, &views[held], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "copy_checked_many: dst of item #%zd must be a writable buffer", i);
            goto done;
        }
        held++;
        if (PyObject_GetBuffer(s_o, &views[held], PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "copy_checked_many: src of item #%zd must be a C-contiguous buffer", i);
            goto done;
        }
        held++;
        if (views[held - 2].len != views[held - 1].len || index < 0 || (index + 6) * 8 > v.len) {
            PyErr_Format(PyExc_ValueError, "copy_checked_many: item #%zd: dst %zd bytes, src %zd, index %zd of %zd words",
                         i, views[held - 2].len, views[held - 1].len, index, v.len / 8);
            goto done;
        }
        c[i] = (chk_t){(char *)views[held - 2].buf, (const char *)views[held - 1].buf, (size_t)views[held - 2].len,
                       index, (uint64_t)expected};
    }
    Py_BEGIN_ALLOW_THREADS
    uint64_t *w = (uint64_t *)v.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t *ver = w + c[i].index;
        if ((c[i].expected & 1) || __atomic_load_n(ver, __ATOMIC_ACQUIRE) != c[i].expected)
            continue;
        if (stamp)
            __atomic_store_n(ver + 5, (uint64_t)stamp + (uint64_t)i, __ATOMIC_RELAXED);
        copy_bytes(c[i].dst, c[i].src, c[i].len);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        ok[i] = __atomic_load_n(ver, __ATOMIC_RELAXED) == c[i].expected;
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (result != NULL)
        for (Py_ssize_t i = 0; i < n; i++)
            PyList_SET_ITEM(result, i, PyBool_FromLong(ok[i]));
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    if (v.obj)
        PyBuffer_Release(&v);
    PyMem_Free(views);
    PyMem_Free(c);
    PyMem_Free(ok);
    Py_DECREF(seq);
    return result;
}

/* ---- the shared index, read by one-sided readers (kvstored/tiers/slots.py) ------------------ */

/* Whether slot s's header is even and carries ident (lo, hi) now: an acquire load of the
 * version, the ident, an acquire fence, the version re-loaded (the same value). */
static int header_holds(const uint64_t *sw, size_t ns, uint64_t s, uint64_t lo, uint64_t hi) {
    if (s >= ns)
        return 0;
    const uint64_t *h = sw + 16 * s;
    uint64_t hv = __atomic_load_n(&h[0], __ATOMIC_ACQUIRE);
    uint64_t hlo = __atomic_load_n(&h[2], __ATOMIC_RELAXED);
    uint64_t hhi = __atomic_load_n(&h[3], __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return !(hv & 1) && hlo == lo && hhi == hi && __atomic_load_n(&h[0], __ATOMIC_RELAXED) == hv;
}

/* The slot the index maps (lo, hi) to, if its header is even and carries that ident now,
 * else -1 (absent, a bucket or header changing: ask the node). Every bucket and header is
 * read under its version (acquire load, fields, acquire fence, re-load). */
static int64_t probe_one(const uint64_t *bk, size_t nb, const uint64_t *sw, size_t ns, uint64_t lo, uint64_t hi) {
    size_t i = (size_t)(lo & (nb - 1));
    for (size_t step = 0; step < nb; step++, i = (i + 1) & (nb - 1)) {
        const uint64_t *row = bk + 4 * i;
        uint64_t v1 = __atomic_load_n(&row[0], __ATOMIC_ACQUIRE);
        if (v1 & 1)
            return -1;
        uint64_t blo = __atomic_load_n(&row[1], __ATOMIC_RELAXED);
        uint64_t bhi = __atomic_load_n(&row[2], __ATOMIC_RELAXED);
        uint64_t s1 = __atomic_load_n(&row[3], __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&row[0], __ATOMIC_RELAXED) != v1 || s1 == 0)
            return -1;
        if (blo != lo || bhi != hi)
            continue;
        return header_holds(sw, ns, s1 - 1, lo, hi) ? (int64_t)(s1 - 1) : -1;
    }
    return -1;
}

/* ---- a reader's hint table (kvstored/tiers/slots.py SlotReader.hints) ----------------------
 * Private memory of one reader: nhints (a power of two) entries of 2 u64, (ident_lo, slot + 1),
 * entry (ident_hi & (nhints - 1)); 0 = empty. A hint only says which slot header to check
 * first, and that header is checked exactly as probe_one checks the slot a bucket names
 * (header_holds), so a stale, overwritten or torn hint costs an index probe, never a wrong
 * slot. What it spares is the index: 512 keys probe 512 buckets spread over ~500 pages of a
 * large index, one TLB miss each after any context switch (measured: 34 us warm, 110 us
 * after touching 4096 other pages), where the hints of a 2 MiB table sit in one huge page
 * and a prefix's slot headers are mostly contiguous. Written with the GIL held only. */
typedef struct {
    Py_buffer buf;
    uint64_t *h;
    size_t n;
} hints_t;

static void hints_release(hints_t *hs) {
    if (hs->buf.obj)
        PyBuffer_Release(&hs->buf);
}

/* Acquire the hints buffer (None: no hints); 0 on success, -1 with ValueError set. */
static int hints_acquire(hints_t *hs, PyObject *o, const char *fn) {
    memset(hs, 0, sizeof *hs);
    if (o == NULL || o == Py_None)
        return 0;
    if (PyObject_GetBuffer(o, &hs->buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: hints must be a writable C-contiguous buffer or None, got %.100s", fn,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    size_t n = (size_t)hs->buf.len / 16;
    if (n == 0 || (n & (n - 1)) != 0 || (size_t)hs->buf.len != 16 * n || ((uintptr_t)hs->buf.buf & 7)) {
        PyErr_Format(PyExc_ValueError, "%s: hints must hold a power of two of 16-byte entries and be 8-aligned "
                     "(got %zd bytes)", fn, hs->buf.len);
        hints_release(hs);
        return -1;
    }
    hs->h = (uint64_t *)hs->buf.buf;
    hs->n = n;
    return 0;
}

/* probe_one, the hinted slot's header checked first (see hints_t); a slot the index gave is
 * remembered in the hints. */
static int64_t probe_hinted(const uint64_t *bk, size_t nb, const uint64_t *sw, size_t ns, hints_t *hs, uint64_t lo,
                            uint64_t hi) {
    uint64_t *e = NULL;
    if (hs->n) {
        e = hs->h + 2 * (size_t)(hi & (hs->n - 1));
        if (e[0] == lo && e[1] != 0 && header_holds(sw, ns, e[1] - 1, lo, hi))
            return (int64_t)(e[1] - 1);
    }
    int64_t s = probe_one(bk, nb, sw, ns, lo, hi);
    if (s >= 0 && e != NULL) {
        e[0] = lo;
        e[1] = (uint64_t)s + 1;
    }
    return s;
}

/* ident(namespace_id, key) of kvstored/tiers/slots.py: xxh3_128(prefix + key), where prefix
 * is u8 len(namespace_id) + namespace_id; (0, 0) becomes (1, 0). */
static void ident_of(const char *prefix, size_t plen, const char *key, size_t klen, uint64_t *lo, uint64_t *hi) {
    char buf[1024];
    XXH128_hash_t h;
    if (plen + klen <= sizeof buf) {
        memcpy(buf, prefix, plen);
        memcpy(buf + plen, key, klen);
        h = XXH3_128bits(buf, plen + klen);
    } else {
        XXH3_state_t st;
        XXH3_INITSTATE(&st);
        XXH3_128bits_reset(&st);
        XXH3_128bits_update(&st, prefix, plen);
        XXH3_128bits_update(&st, key, klen);
        h = XXH3_128bits_digest(&st);
    }
    *lo = h.low64;
    *hi = h.high64;
    if (*lo == 0 && *hi == 0)
        *lo = 1;
}

typedef struct {
    Py_buffer b, s;
    const uint64_t *bk, *sw;
    size_t nb, ns;
} index_t;

static void index_release(index_t *ix) {
    if (ix->b.obj)
        PyBuffer_Release(&ix->b);
    if (ix->s.obj)
        PyBuffer_Release(&ix->s);
}

/* Acquire the bucket and slot-header buffers (0 on success; -1 with ValueError set). */
static int index_acquire(index_t *ix, PyObject *b_o, PyObject *s_o, const char *fn) {
    memset(ix, 0, sizeof *ix);
    if (PyObject_GetBuffer(b_o, &ix->b, PyBUF_C_CONTIGUOUS) < 0 || PyObject_GetBuffer(s_o, &ix->s, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: buckets and slots must be C-contiguous buffers", fn);
        return -1;
    }
    ix->nb = (size_t)ix->b.len / 32;
    ix->ns = (size_t)ix->s.len / 128;
    if (ix->nb == 0 || (ix->nb & (ix->nb - 1)) != 0 || ((uintptr_t)ix->b.buf & 7) || ((uintptr_t)ix->s.buf & 7)) {
        PyErr_Format(PyExc_ValueError, "%s: buckets must hold a power of two of 32-byte buckets (got %zd bytes) "
                     "and be 8-aligned, as slots", fn, ix->b.len);
        return -1;
    }
    ix->bk = (const uint64_t *)ix->b.buf;
    ix->sw = (const uint64_t *)ix->s.buf;
    return 0;
}

/* probe_keys(buckets, slots, prefix, keys, min_len, max_len, found=None, hints=None) -> int
 *     A whole prefix's lookup in one call: per key, its ident (xxh3_128(prefix + key)) and the
 *     shared index probe of probe_many (the hinted slot's header first when hints, a reader's
 *     hint table, is given: see hints_t). keys: a list of bytes. With found None it stops at
 *     the first key not found and returns how many leading keys were found (lookup_prefix);
 *     with found (a writable buffer of len(keys) bytes) it sets found[i] = 1 / 0 for every
 *     key and returns the leading count (exists). Every key is checked first: one that is not
 *     bytes of min_len..max_len bytes makes it return -1 - its index (the caller's checks
 *     then name it).
 *     Raises ValueError / TypeError naming a buffer or argument of the wrong kind. */
static PyObject *probe_keys(PyObject *self, PyObject *args) {
    PyObject *b_o, *s_o, *keys_o, *found_o = Py_None, *hints_o = Py_None;
    const char *prefix;
    Py_ssize_t plen, min_len, max_len;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOy#Onn|OO:probe_keys", &b_o, &s_o, &prefix, &plen, &keys_o, &min_len, &max_len,
                          &found_o, &hints_o))
        return NULL;
    if (!PyList_Check(keys_o)) {
        PyErr_Format(PyExc_TypeError, "probe_keys: keys must be a list of bytes, got %.100s", Py_TYPE(keys_o)->tp_name);
        return NULL;
    }
    index_t ix;
    hints_t hs;
    Py_buffer f = {0};
    PyObject *result = NULL;
    memset(&ix, 0, sizeof ix);
    if (hints_acquire(&hs, hints_o, "probe_keys") < 0 || index_acquire(&ix, b_o, s_o, "probe_keys") < 0)
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(keys_o);
    if (found_o != Py_None) {
        if (PyObject_GetBuffer(found_o, &f, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "probe_keys: found must be a writable buffer, got %.100s",
                         Py_TYPE(found_o)->tp_name);
            goto done;
        }
        if (f.len < n) {
            PyErr_Format(PyExc_ValueError, "probe_keys: found holds %zd bytes for %zd keys", f.len, n);
            goto done;
        }
    }
    {
        /* Three passes, so the cache misses of a cold index overlap instead of queueing one
         * by one (a neighbour's work often evicts it: 512 keys = 512 buckets + 512 headers):
         * 1. check and hash every key, prefetch its home bucket (its hint, with hints); 2. read
         * the home buckets (hints), prefetch the headers they name (a hint missing: the home
         * bucket); 3. probe (every load under its version, as ever). */
        uint64_t *ids = PyMem_Malloc((size_t)(2 * n + 2) * sizeof(uint64_t));
        if (ids == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        Py_ssize_t lead = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *key = PyList_GET_ITEM(keys_o, k);
            if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) < min_len || PyBytes_GET_SIZE(key) > max_len ||
                PyBytes_GET_SIZE(key) == 0) {
                lead = -1 - k;
                break;
            }
            ident_of(prefix, (size_t)plen, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), &ids[2 * k],
                     &ids[2 * k + 1]);
            if (hs.n)
                __builtin_prefetch(hs.h + 2 * (size_t)(ids[2 * k + 1] & (hs.n - 1)), 0, 0);
            else
                __builtin_prefetch(ix.bk + 4 * (size_t)(ids[2 * k] & (ix.nb - 1)), 0, 0);
        }
        if (lead == 0) {
            for (Py_ssize_t k = 0; k < n; k++) {
                uint64_t s1 = 0;
                if (hs.n) {
                    const uint64_t *e = hs.h + 2 * (size_t)(ids[2 * k + 1] & (hs.n - 1));
                    if (e[0] == ids[2 * k])
                        s1 = e[1];
                }
                if (s1 == 0) {
                    const uint64_t *row = ix.bk + 4 * (size_t)(ids[2 * k] & (ix.nb - 1));
                    if (hs.n)
                        __builtin_prefetch(row, 0, 0);
                    else
                        s1 = __atomic_load_n(&row[3], __ATOMIC_RELAXED);
                }
                if (s1 != 0 && s1 - 1 < ix.ns) /* a guess only: probe_hinted checks everything */
                    __builtin_prefetch(ix.sw + 16 * (s1 - 1), 0, 0);
            }
            int leading = 1;
            unsigned char *fo = (unsigned char *)f.buf;
            for (Py_ssize_t k = 0; k < n; k++) {
                int hit = probe_hinted(ix.bk, ix.nb, ix.sw, ix.ns, &hs, ids[2 * k], ids[2 * k + 1]) >= 0;
                if (fo != NULL)
                    fo[k] = (unsigned char)hit;
                leading = leading && hit;
                lead += leading;
                if (!leading && fo == NULL)
                    break;
            }
        }
        PyMem_Free(ids);
        result = PyLong_FromSsize_t(lead);
    }
done:
    if (f.obj)
        PyBuffer_Release(&f);
    index_release(&ix);
    hints_release(&hs);
    return result;
}

/* read_keys(buckets, slots, arena, prefix, keys, dsts, stamp_ns, mid=None, hints=None)
 *         -> (sizes, metas, values, num_fallbacks)
 *     A whole batch of one-sided reads in one call (kvstored/tiers/slots.py's protocol):
 *     per key, from the last to the first (a prefix's tail first), its ident, the index
 *     probe, the slot header (version v1 even, the same ident, meta inline, the block inside
 *     the arena and the destination), then, the GIL released once for the whole batch: its
 *     access_ns stamped (stamp_ns + the item's place in that order, when stamp_ns > 0), the
 *     bytes copied, an acquire fence, the version re-loaded: kept only if it is v1 again.
 *     keys: a list of bytes; dsts: a list of writable buffers (one per key; the block goes
 *     to its start) or None (each block into a new bytes object, in values). Returns lists
 *     of len(keys): sizes[i] the bytes kept, or None (ask the node: not in the index, a slot
 *     changing, a meta not inline, a buffer too small, or a check that failed); metas[i]
 *     the block's meta (b"" when none or not kept); values[i] the bytes (None when dsts is
 *     given, or not kept); num_fallbacks: keys whose header matched but whose version
 *     check failed (counted apart from misses). mid (tests only): called with the GIL
 *     between the plan and the copies. Raises TypeError / ValueError naming the
 *     item and what was wrong (no byte is copied then).
 *
 * read_all(buckets, slots, arena, prefix, keys, dsts, stamp_ns, hints, min_len, max_len,
 *          want_meta, mid) -> (out, num_bytes) | int
 *     The same reads, all or nothing (the sync client's one-call hit path,
 *     kvstored/client/_fastread.py): it also checks what the client checked in Python
 *     before (every key bytes of max(min_len, 1)..max_len bytes; every dst a flat, writable,
 *     C-contiguous buffer of unsigned bytes, format "B"), and it answers only when every
 *     key was kept: out is the list of values (dsts None), of sizes, or of (size, meta)
 *     tuples (want_meta), num_bytes the bytes kept. Otherwise it returns an int and the
 *     caller reads the whole call through its general path: -1 when an argument is not of
 *     that kind (checked before anything is read; the general path names it or casts it),
 *     else the number of failed version checks (0: a key not in the index, a slot changing,
 *     a meta not inline, a buffer too small). It stops at the first key that cannot be kept
 *     (nothing more is copied); bytes already copied into dsts are the caller's to rewrite,
 *     as the general path does. The version check is read_keys' own (the same code). */
typedef struct {
    char *dst;
    const char *src;
    size_t len;
    uint64_t *ver;
    uint64_t expected;
    Py_ssize_t key; /* index into keys */
    unsigned mlen;
    char meta[64];
} rd_t;

/* One batch's state, shared by read_keys and read_all (released by rk_release). */
typedef struct {
    index_t ix;
    hints_t hs;
    Py_buffer a, sw_w;
    Py_buffer *views;
    rd_t *items;
    PyObject **vals;
    char *ok;
    Py_ssize_t n, nitems, held, nfb;
    size_t total;
} rk_t;

static void rk_release(rk_t *r) {
    if (r->vals != NULL)
        for (Py_ssize_t k = 0; k < r->n; k++)
            Py_XDECREF(r->vals[k]);
    if (r->views != NULL)
        for (Py_ssize_t i = 0; i < r->held; i++)
            PyBuffer_Release(&r->views[i]);
    if (r->a.obj)
        PyBuffer_Release(&r->a);
    if (r->sw_w.obj)
        PyBuffer_Release(&r->sw_w);
    index_release(&r->ix);
    hints_release(&r->hs);
    PyMem_Free(r->views);
    PyMem_Free(r->items);
    PyMem_Free(r->vals);
    PyMem_Free(r->ok);
}

#define RK_ERROR (-1)   /* an exception is set */
#define RK_DONE 0       /* planned, copied and checked */
#define RK_BAD_ARG 1    /* all-or-nothing: an argument not of the checked kind (nothing read) */
#define RK_NOT_KEPT 2   /* all-or-nothing: a key could not be kept (stopped there) */

/* Plan, stamp, copy and check a batch (read_keys' phases 1 and 2). With all_or_nothing
 * (read_all), keys and dsts are checked as read_all says, and the first key that cannot be
 * kept ends it (RK_NOT_KEPT; r->nfb counts a failed version check); without, a key or dst
 * of the wrong kind raises and every other key is read. */
static int rk_run(rk_t *r, PyObject *b_o, PyObject *s_o, PyObject *a_o, const char *prefix, Py_ssize_t plen,
                  PyObject *keys_o, PyObject *dsts_o, unsigned long long stamp, PyObject *mid_o, PyObject *hints_o,
                  const char *fn, int all_or_nothing, Py_ssize_t min_len, Py_ssize_t max_len) {
    Py_ssize_t n = PyList_GET_SIZE(keys_o);
    memset(r, 0, sizeof *r);
    r->n = n;
    if (all_or_nothing) { /* the client's argument checks, before anything is acquired */
        if (min_len < 1)
            min_len = 1;
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *key = PyList_GET_ITEM(keys_o, k);
            if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) < min_len || PyBytes_GET_SIZE(key) > max_len)
                return RK_BAD_ARG;
        }
    }
    if (hints_acquire(&r->hs, hints_o, fn) < 0 || index_acquire(&r->ix, b_o, s_o, fn) < 0)
        return RK_ERROR;
    r->views = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    r->items = PyMem_Calloc((size_t)n + 1, sizeof(rd_t));
    r->vals = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    r->ok = PyMem_Calloc((size_t)n + 1, 1);
    if (r->views == NULL || r->items == NULL || r->vals == NULL || r->ok == NULL) {
        PyErr_NoMemory();
        return RK_ERROR;
    }
    /* the slot headers again, writable: readers stamp access_ns (word 5) */
    if (PyObject_GetBuffer(s_o, &r->sw_w, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: slots must be writable (readers stamp access_ns)", fn);
        return RK_ERROR;
    }
    if (PyObject_GetBuffer(a_o, &r->a, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: arena must be a C-contiguous buffer, got %.100s", fn,
                     Py_TYPE(a_o)->tp_name);
        return RK_ERROR;
    }
    const index_t *ix = &r->ix;
    /* phase 1, with the GIL: plan (tail first), take the destinations */
    for (Py_ssize_t k = n - 1; k >= 0; k--) {
        PyObject *key = PyList_GET_ITEM(keys_o, k);
        if (!PyBytes_CheckExact(key)) {
            PyErr_Format(PyExc_TypeError, "%s: key #%zd must be bytes, got %.100s", fn, k, Py_TYPE(key)->tp_name);
            return RK_ERROR;
        }
        uint64_t lo, hi;
        ident_of(prefix, (size_t)plen, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), &lo, &hi);
        int64_t slot = probe_hinted(ix->bk, ix->nb, ix->sw, ix->ns, &r->hs, lo, hi);
        if (slot < 0) {
            if (all_or_nothing)
                return RK_NOT_KEPT;
            continue;
        }
        uint64_t *h = (uint64_t *)r->sw_w.buf + 16 * slot;
        uint64_t v1 = __atomic_load_n(&h[0], __ATOMIC_ACQUIRE);
        uint64_t hlo = __atomic_load_n(&h[2], __ATOMIC_RELAXED);
        uint64_t hhi = __atomic_load_n(&h[3], __ATOMIC_RELAXED);
        uint64_t size = __atomic_load_n(&h[4], __ATOMIC_RELAXED);
        uint64_t lens = __atomic_load_n(&h[6], __ATOMIC_RELAXED);
        unsigned mlen = (unsigned)(lens >> 32);
        size_t off = (size_t)slot * 4096;
        if ((v1 & 1) || hlo != lo || hhi != hi || mlen > 64 || off > (size_t)r->a.len ||
            size > (size_t)r->a.len - off) {
            if (all_or_nothing)
                return RK_NOT_KEPT;
            continue; /* changing, another block now, meta not inline, or torn: the node's path */
        }
        rd_t *it = &r->items[r->nitems];
        it->mlen = mlen;
        memcpy(it->meta, (const char *)(h + 8), mlen); /* under v1: checked with the bytes */
        if (dsts_o != Py_None) {
            PyObject *d_o = PyList_GET_ITEM(dsts_o, k);
            Py_buffer *v = &r->views[r->held];
            int flags = PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | (all_or_nothing ? PyBUF_FORMAT : 0);
            if (PyObject_GetBuffer(d_o, v, flags) < 0) {
                PyErr_Clear();
                if (all_or_nothing)
                    return RK_BAD_ARG;
                PyErr_Format(PyExc_ValueError, "%s: dst #%zd must be a writable C-contiguous buffer, got %.100s", fn,
                             k, Py_TYPE(d_o)->tp_name);
                return RK_ERROR;
            }
            r->held++;
            if (all_or_nothing && (v->ndim != 1 || (v->format != NULL && strcmp(v->format, "B") != 0)))
                return RK_BAD_ARG;
            if (size > (size_t)v->len) {
                if (all_or_nothing)
                    return RK_NOT_KEPT;
                continue; /* too small: the node's path names it */
            }
            it->dst = (char *)v->buf;
        } else {
            PyObject *val = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
            if (val == NULL)
                return RK_ERROR;
            r->vals[k] = val; /* written below, before anyone else sees it */
            it->dst = PyBytes_AS_STRING(val);
        }
        it->src = (const char *)r->a.buf + off;
        it->len = (size_t)size;
        it->ver = h;
        it->expected = v1;
        it->key = k;
        r->total += (size_t)size;
        r->nitems++;
    }
    /* the test seam: mid() runs between the plan and the copies (tests hold the node there) */
    if (mid_o != Py_None) {
        PyObject *res = PyObject_CallNoArgs(mid_o);
        if (res == NULL)
            return RK_ERROR;
        Py_DECREF(res);
    }
    /* phase 2: stamp, copy, check (the GIL released once for a batch of >= 64 KiB) */
    int status = RK_DONE;
    {
        PyThreadState *ts = r->total >= (64u << 10) ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t i = 0; i < r->nitems; i++) {
            rd_t *it = &r->items[i];
            if (__atomic_load_n(it->ver, __ATOMIC_ACQUIRE) == it->expected) {
                if (stamp)
                    __atomic_store_n(it->ver + 5, (uint64_t)stamp + (uint64_t)i, __ATOMIC_RELAXED);
                copy_bytes(it->dst, it->src, it->len);
                __atomic_thread_fence(__ATOMIC_ACQUIRE);
                r->ok[i] = __atomic_load_n(it->ver, __ATOMIC_RELAXED) == it->expected;
            }
            if (!r->ok[i]) {
                r->nfb++;
                if (all_or_nothing) {
                    status = RK_NOT_KEPT;
                    break;
                }
            }
        }
        if (ts != NULL)
            PyEval_RestoreThread(ts);
    }
    return status;
}

static PyObject *read_keys(PyObject *self, PyObject *args) {
    PyObject *b_o, *s_o, *a_o, *keys_o, *dsts_o, *mid_o = Py_None, *hints_o = Py_None;
    const char *prefix;
    Py_ssize_t plen;
    unsigned long long stamp;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOy#OOK|OO:read_keys", &b_o, &s_o, &a_o, &prefix, &plen, &keys_o, &dsts_o, &stamp,
                          &mid_o, &hints_o))
        return NULL;
    if (!PyList_Check(keys_o) || (dsts_o != Py_None && !PyList_Check(dsts_o))) {
        PyErr_SetString(PyExc_TypeError, "read_keys: keys must be a list of bytes and dsts a list of buffers or None");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys_o);
    if (dsts_o != Py_None && PyList_GET_SIZE(dsts_o) != n) {
        PyErr_Format(PyExc_ValueError, "read_keys: %zd keys but %zd dsts", n, PyList_GET_SIZE(dsts_o));
        return NULL;
    }
    rk_t r;
    PyObject *result = NULL, *sizes = NULL, *metas = NULL, *values = NULL;
    if (rk_run(&r, b_o, s_o, a_o, prefix, plen, keys_o, dsts_o, stamp, mid_o, hints_o, "read_keys", 0, 0, 0) < 0)
        goto done;
    /* phase 3: the answer */
    sizes = PyList_New(n);
    metas = PyList_New(n);
    values = dsts_o == Py_None ? PyList_New(n) : (Py_INCREF(Py_None), Py_None);
    if (sizes == NULL || metas == NULL || values == NULL)
        goto done;
    {
        PyObject *empty = PyBytes_FromStringAndSize("", 0);
        if (empty == NULL)
            goto done;
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(sizes, k, Py_None);
            Py_INCREF(empty);
            PyList_SET_ITEM(metas, k, empty);
            if (values != Py_None) {
                Py_INCREF(Py_None);
                PyList_SET_ITEM(values, k, Py_None);
            }
        }
        Py_DECREF(empty);
        for (Py_ssize_t i = 0; i < r.nitems; i++) {
            rd_t *it = &r.items[i];
            if (!r.ok[i])
                continue;
            PyObject *sz = PyLong_FromSize_t(it->len);
            if (sz == NULL)
                goto done;
            PyList_SetItem(sizes, it->key, sz);
            if (it->mlen) {
                PyObject *m = PyBytes_FromStringAndSize(it->meta, it->mlen);
                if (m == NULL)
                    goto done;
                PyList_SetItem(metas, it->key, m);
            }
            if (values != Py_None) {
                PyList_SetItem(values, it->key, r.vals[it->key]); /* steals the reference */
                r.vals[it->key] = NULL;
            }
        }
    }
    result = Py_BuildValue("(OOOn)", sizes, metas, values, r.nfb);
done:
    Py_XDECREF(sizes);
    Py_XDECREF(metas);
    Py_XDECREF(values);
    rk_release(&r);
    return result;
}

static PyObject *read_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "read_all: takes 12 arguments (buckets, slots, arena, prefix, keys, dsts, "
                     "stamp_ns, hints, min_len, max_len, want_meta, mid), got %zd", nargs);
        return NULL;
    }
    PyObject *b_o = args[0], *s_o = args[1], *a_o = args[2], *prefix_o = args[3], *keys_o = args[4];
    PyObject *dsts_o = args[5], *hints_o = args[7], *mid_o = args[11];
    if (!PyBytes_Check(prefix_o)) {
        PyErr_Format(PyExc_TypeError, "read_all: prefix must be bytes, got %.100s", Py_TYPE(prefix_o)->tp_name);
        return NULL;
    }
    unsigned long long stamp = PyLong_AsUnsignedLongLong(args[6]);
    Py_ssize_t min_len = PyLong_AsSsize_t(args[8]), max_len = PyLong_AsSsize_t(args[9]);
    int want_meta = PyObject_IsTrue(args[10]);
    if (PyErr_Occurred() || want_meta < 0)
        return NULL; /* stamp_ns, min_len, max_len: ints; want_meta: a truth value */
    if (!PyList_Check(keys_o) || (dsts_o != Py_None && !PyList_Check(dsts_o)) ||
        (dsts_o != Py_None && PyList_GET_SIZE(dsts_o) != PyList_GET_SIZE(keys_o)))
        return PyLong_FromLong(-1);
    Py_ssize_t n = PyList_GET_SIZE(keys_o);
    rk_t r;
    PyObject *result = NULL, *out = NULL;
    int st = rk_run(&r, b_o, s_o, a_o, PyBytes_AS_STRING(prefix_o), PyBytes_GET_SIZE(prefix_o), keys_o, dsts_o,
                    stamp, mid_o, hints_o, "read_all", 1, min_len, max_len);
    if (st == RK_ERROR)
        goto done;
    if (st == RK_BAD_ARG) {
        result = PyLong_FromLong(-1);
        goto done;
    }
    if (st == RK_NOT_KEPT || r.nitems != n) {
        result = PyLong_FromSsize_t(r.nfb);
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        rd_t *it = &r.items[i];
        PyObject *x;
        if (dsts_o == Py_None) {
            x = r.vals[it->key]; /* the reference moves to the list */
            r.vals[it->key] = NULL;
        } else {
            x = PyLong_FromSize_t(it->len);
            if (x != NULL && want_meta) {
                PyObject *m = PyBytes_FromStringAndSize(it->meta, it->mlen);
                PyObject *pair = m == NULL ? NULL : PyTuple_Pack(2, x, m);
                Py_XDECREF(m);
                Py_DECREF(x);
                x = pair;
            }
            if (x == NULL)
                goto done;
        }
        PyList_SET_ITEM(out, it->key, x);
    }
    result = Py_BuildValue("(On)", out, (Py_ssize_t)r.total);
done:
    Py_XDECREF(out);
    rk_release(&r);
    return result;
}

/* probe_many(buckets, slots, idents, out) -> int
 *     The shared index lookup of kvstored/tiers/slots.py for a batch: idents holds 2 u64
 *     (ident_lo, ident_hi) per key; for each key out[i] (int64) becomes the slot whose header
 *     is even and carries that ident now, else -1 (absent, a bucket or slot changing: ask the
 *     node). Linear probing from bucket ident_lo & (nbuckets - 1); every bucket and header is
 *     read under its version (acquire load, fields, acquire fence, re-load). Returns the number
 *     of leading keys found. buckets: nbuckets x 4 u64 (nbuckets a power of two); slots:
 *     nslots x 16 u64. Raises ValueError naming a buffer of the wrong size or kind. */
static PyObject *probe_many(PyObject *self, PyObject *args) {
    PyObject *b_o, *s_o, *i_o, *o_o;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOO:probe_many", &b_o, &s_o, &i_o, &o_o))
        return NULL;
    Py_buffer b = {0}, sl = {0}, id = {0}, out = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(b_o, &b, PyBUF_C_CONTIGUOUS) < 0 || PyObject_GetBuffer(s_o, &sl, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(i_o, &id, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(o_o, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError,
                        "probe_many: buckets, slots and idents must be C-contiguous buffers, out a writable one");
        goto done;
    }
    size_t nb = (size_t)b.len / 32, ns = (size_t)sl.len / 128, n = (size_t)id.len / 16;
    if (nb == 0 || (nb & (nb - 1)) != 0 || ((uintptr_t)b.buf & 7) || ((uintptr_t)sl.buf & 7) ||
        ((uintptr_t)id.buf & 7) || ((uintptr_t)out.buf & 7)) {
        PyErr_Format(PyExc_ValueError, "probe_many: buckets must hold a power of two of 32-byte buckets "
                     "(got %zd bytes) and every buffer be 8-aligned", b.len);
        goto done;
    }
    if ((size_t)out.len < n * 8) {
        PyErr_Format(PyExc_ValueError, "probe_many: out holds %zd bytes, %zu keys need %zu", out.len, n, n * 8);
        goto done;
    }
    {
        const uint64_t *bk = (const uint64_t *)b.buf, *sw = (const uint64_t *)sl.buf, *ids = (const uint64_t *)id.buf;
        int64_t *o = (int64_t *)out.buf;
        size_t lead = 0;
        int leading = 1;
        for (size_t k = 0; k < n; k++) {
            uint64_t lo = ids[2 * k], hi = ids[2 * k + 1];
            int64_t found = -1;
            size_t i = (size_t)(lo & (nb - 1));
            for (size_t step = 0; step < nb; step++, i = (i + 1) & (nb - 1)) {
                const uint64_t *row = bk + 4 * i;
                uint64_t v1 = __atomic_load_n(&row[0], __ATOMIC_ACQUIRE);
                if (v1 & 1)
                    break;
                uint64_t blo = __atomic_load_n(&row[1], __ATOMIC_RELAXED);
                uint64_t bhi = __atomic_load_n(&row[2], __ATOMIC_RELAXED);
                uint64_t s1 = __atomic_load_n(&row[3], __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_ACQUIRE);
                if (__atomic_load_n(&row[0], __ATOMIC_RELAXED) != v1 || s1 == 0)
                    break;
                if (blo != lo || bhi != hi)
                    continue;
                if (s1 - 1 < ns) {
                    const uint64_t *h = sw + 16 * (s1 - 1);
                    uint64_t hv = __atomic_load_n(&h[0], __ATOMIC_ACQUIRE);
                    uint64_t hlo = __atomic_load_n(&h[2], __ATOMIC_RELAXED);
                    uint64_t hhi = __atomic_load_n(&h[3], __ATOMIC_RELAXED);
                    __atomic_thread_fence(__ATOMIC_ACQUIRE);
                    if (!(hv & 1) && hlo == lo && hhi == hi && __atomic_load_n(&h[0], __ATOMIC_RELAXED) == hv)
                        found = (int64_t)(s1 - 1);
                }
                break;
            }
            o[k] = found;
            if (found < 0)
                leading = 0;
            else if (leading)
                lead++;
        }
        result = PyLong_FromSize_t(lead);
    }
done:
    if (b.obj) PyBuffer_Release(&b);
    if (sl.obj) PyBuffer_Release(&sl);
    if (id.obj) PyBuffer_Release(&id);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

/* store_release(versions, index, value): a release store of u64 versions[index] followed by
 * a full fence: the node's side of the seqlock (make a slot odd before rewriting it, even after
 * its fields are written) on weakly ordered CPUs. */
static PyObject *store_release(PyObject *self, PyObject *args) {
    PyObject *ver_o;
    Py_ssize_t index;
    unsigned long long value;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnK:store_release", &ver_o, &index, &value))
        return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(ver_o, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "store_release: versions must be a writable buffer, got %.100s",
                     Py_TYPE(ver_o)->tp_name);
        return NULL;
    }
    if (((uintptr_t)v.buf & 7) != 0 || index < 0 || (index + 1) * 8 > v.len) {
        PyErr_Format(PyExc_ValueError, "store_release: index %zd outside the %zd u64 words of versions", index,
                     v.len / 8);
        PyBuffer_Release(&v);
        return NULL;
    }
    __atomic_store_n((uint64_t *)v.buf + index, (uint64_t)value, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

/* ---- the node's side of the slot region: the only writer of headers and of the index --------- */

/* The node's version store (as store_release): a release store, then a full fence, so the
 * stores that follow (a header's or bucket's fields) are ordered after an odd version, and the
 * fields before an even one. */
static inline void version_store(uint64_t *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* ident(namespace_id, key) of kvstored/tiers/slots.py: xxh3_128(u8 len(ns) + ns + key). */
static void ident_ns(const char *ns, size_t nslen, const char *key, size_t klen, uint64_t *lo, uint64_t *hi) {
    char prefix[256];
    prefix[0] = (char)(unsigned char)nslen;
    memcpy(prefix + 1, ns, nslen);
    ident_of(prefix, nslen + 1, key, klen, lo, hi);
}

/* SlotTable._write_bucket: bucket i odd, its fields, then even (two versions on). */
static void bucket_write(uint64_t *bk, size_t i, uint64_t lo, uint64_t hi, uint64_t slot1) {
    uint64_t *row = bk + 4 * i;
    uint64_t v = __atomic_load_n(&row[0], __ATOMIC_RELAXED);
    version_store(&row[0], v + 1);
    __atomic_store_n(&row[1], lo, __ATOMIC_RELAXED);
    __atomic_store_n(&row[2], hi, __ATOMIC_RELAXED);
    __atomic_store_n(&row[3], slot1, __ATOMIC_RELAXED);
    version_store(&row[0], v + 2);
}

/* SlotTable._find: the bucket holding (lo, hi), or -1 (an empty bucket ends the probe). */
static int64_t bucket_find(const uint64_t *bk, size_t nb, uint64_t lo, uint64_t hi) {
    size_t i = (size_t)(lo & (nb - 1));
    for (size_t step = 0; step < nb; step++, i = (i + 1) & (nb - 1)) {
        const uint64_t *row = bk + 4 * i;
        if (row[3] == 0)
            return -1;
        if (row[1] == lo && row[2] == hi)
            return (int64_t)i;
    }
    return -1;
}

typedef struct {
    size_t slot;
    uint64_t size, generation;
    const char *ns, *key, *meta;
    size_t nslen, klen, mlen;
} pub_t;

/* publish_many(slots, buckets, items, used_buckets) -> int
 *     SlotTable.publish of kvstored/tiers/slots.py for a batch, in order, byte for byte the
 *     same stores: per item (slot, size_bytes, namespace_id, key, generation, meta) the slot
 *     header is made odd (if it was even), its words 1..7 written (generation mod 2**64, the
 *     ident, the size, access_ns 0, key_len | meta_len << 32 or META_NOT_INLINE, 0) and the
 *     inline meta (zero-padded to 64 bytes; left alone when longer), then made even (the next
 *     even version); then its (namespace, key) is indexed (an existing bucket rewritten, else
 *     the first empty one of its probe sequence, unless that would fill more than 3/4 of the
 *     buckets). Every version store is a release store and a full fence. Returns the buckets
 *     in use after (used_buckets plus those taken). Every item is checked before any store:
 *     TypeError / ValueError name the item and what was wrong. The GIL is held (short). */
static PyObject *publish_many(PyObject *self, PyObject *args) {
    PyObject *s_o, *b_o, *items_o;
    Py_ssize_t used;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOn:publish_many", &s_o, &b_o, &items_o, &used))
        return NULL;
    if (!PyList_Check(items_o)) {
        PyErr_Format(PyExc_TypeError, "publish_many: items must be a list, got %.100s", Py_TYPE(items_o)->tp_name);
        return NULL;
    }
    Py_buffer s = {0}, b = {0};
    pub_t *pub = NULL;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(s_o, &s, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(b_o, &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "publish_many: slots and buckets must be writable C-contiguous buffers");
        goto done;
    }
    size_t ns = (size_t)s.len / 128, nb = (size_t)b.len / 32;
    if (nb == 0 || (nb & (nb - 1)) != 0 || ((uintptr_t)b.buf & 7) || ((uintptr_t)s.buf & 7)) {
        PyErr_Format(PyExc_ValueError, "publish_many: buckets must hold a power of two of 32-byte buckets "
                     "(got %zd bytes) and be 8-aligned, as slots", b.len);
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(items_o);
    pub = PyMem_Malloc((size_t)(n + 1) * sizeof(pub_t));
    if (pub == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) { /* every item checked before any store */
        PyObject *it = PyList_GET_ITEM(items_o, k);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 6) {
            PyErr_Format(PyExc_TypeError, "publish_many: item #%zd must be a tuple (slot, size_bytes, namespace_id, "
                         "key, generation, meta), got %.100s", k, Py_TYPE(it)->tp_name);
            goto done;
        }
        PyObject *nso = PyTuple_GET_ITEM(it, 2), *ko = PyTuple_GET_ITEM(it, 3), *mo = PyTuple_GET_ITEM(it, 5);
        if (!PyBytes_Check(nso) || !PyBytes_Check(ko) || !PyBytes_Check(mo)) {
            PyErr_Format(PyExc_TypeError, "publish_many: item #%zd: namespace_id, key and meta must be bytes", k);
            goto done;
        }
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(it, 0));
        unsigned long long size = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(it, 1));
        if (PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "publish_many: item #%zd: slot and size_bytes must be ints >= 0", k);
            goto done;
        }
        unsigned long long gen = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(it, 4));
        if (PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "publish_many: item #%zd: generation must be an int", k);
            goto done;
        }
        if (slot < 0 || (size_t)slot >= ns) {
            PyErr_Format(PyExc_ValueError, "publish_many: item #%zd: slot %zd outside the %zu slots", k, slot, ns);
            goto done;
        }
        if (PyBytes_GET_SIZE(nso) > 255 || PyBytes_GET_SIZE(ko) > 0xFFFFFFFFLL) {
            PyErr_Format(PyExc_ValueError, "publish_many: item #%zd: namespace_id is %zd bytes (at most 255)", k,
                         PyBytes_GET_SIZE(nso));
            goto done;
        }
        pub[k] = (pub_t){(size_t)slot, size, gen, PyBytes_AS_STRING(nso), PyBytes_AS_STRING(ko),
                         PyBytes_AS_STRING(mo), (size_t)PyBytes_GET_SIZE(nso), (size_t)PyBytes_GET_SIZE(ko),
                         (size_t)PyBytes_GET_SIZE(mo)};
    }
    {
        uint64_t *sw = (uint64_t *)s.buf, *bk = (uint64_t *)b.buf;
        size_t full = nb * 3 / 4;
        for (Py_ssize_t k = 0; k < n; k++) {
            const pub_t *p = &pub[k];
            uint64_t *h = sw + 16 * p->slot;
            uint64_t v = __atomic_load_n(&h[0], __ATOMIC_RELAXED);
            if (!(v & 1)) {
                v += 1;
                version_store(&h[0], v);
            }
            uint64_t lo, hi;
            ident_ns(p->ns, p->nslen, p->key, p->klen, &lo, &hi);
            int inline_meta = p->mlen <= 64;
            __atomic_store_n(&h[1], p->generation, __ATOMIC_RELAXED);
            __atomic_store_n(&h[2], lo, __ATOMIC_RELAXED);
            __atomic_store_n(&h[3], hi, __ATOMIC_RELAXED);
            __atomic_store_n(&h[4], p->size, __ATOMIC_RELAXED);
            __atomic_store_n(&h[5], 0, __ATOMIC_RELAXED);
            __atomic_store_n(&h[6], (uint64_t)p->klen | ((uint64_t)(inline_meta ? p->mlen : 0xFFFFFFFFu) << 32),
                             __ATOMIC_RELAXED);
            __atomic_store_n(&h[7], 0, __ATOMIC_RELAXED);
            if (inline_meta) {
                char *m = (char *)(h + 8);
                memcpy(m, p->meta, p->mlen);
                memset(m + p->mlen, 0, 64 - p->mlen);
            }
            version_store(&h[0], v + 1);
            /* SlotTable._index_put */
            int64_t at = bucket_find(bk, nb, lo, hi);
            if (at < 0) {
                if ((size_t)used + 1 > full)
                    continue; /* full (cannot happen: twice as many buckets as slots): node path */
                size_t i = (size_t)(lo & (nb - 1));
                while (bk[4 * i + 3] != 0)
                    i = (i + 1) & (nb - 1);
                at = (int64_t)i;
                used++;
            }
            bucket_write(bk, (size_t)at, lo, hi, (uint64_t)p->slot + 1);
        }
        result = PyLong_FromSsize_t(used);
    }
done:
    PyMem_Free(pub);
    if (s.obj) PyBuffer_Release(&s);
    if (b.obj) PyBuffer_Release(&b);
    return result;
}

/* unindex_many(buckets, items) -> int
 *     SlotTable.unindex of kvstored/tiers/slots.py for a batch, in order: per item
 *     (namespace_id, key) its bucket, if any, leaves the index by backward-shift deletion
 *     (linear probing), every step a bucket write under its version (odd, fields, even), the
 *     same stores as the Python code. Returns how many buckets were freed. TypeError /
 *     ValueError name an item of the wrong kind (checked before any store). */
static PyObject *unindex_many(PyObject *self, PyObject *args) {
    PyObject *b_o, *items_o;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO:unindex_many", &b_o, &items_o))
        return NULL;
    if (!PyList_Check(items_o)) {
        PyErr_Format(PyExc_TypeError, "unindex_many: items must be a list, got %.100s", Py_TYPE(items_o)->tp_name);
        return NULL;
    }
    Py_buffer b = {0};
    if (PyObject_GetBuffer(b_o, &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "unindex_many: buckets must be a writable C-contiguous buffer");
        return NULL;
    }
    PyObject *result = NULL;
    size_t nb = (size_t)b.len / 32;
    if (nb == 0 || (nb & (nb - 1)) != 0 || ((uintptr_t)b.buf & 7)) {
        PyErr_Format(PyExc_ValueError, "unindex_many: buckets must hold a power of two of 32-byte buckets "
                     "(got %zd bytes) and be 8-aligned", b.len);
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(items_o);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *it = PyList_GET_ITEM(items_o, k);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(it, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(it, 1)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(it, 0)) > 255) {
            PyErr_Format(PyExc_TypeError, "unindex_many: item #%zd must be a (namespace_id, key) tuple of bytes "
                         "(a namespace_id of at most 255 bytes), got %.100s", k, Py_TYPE(it)->tp_name);
            goto done;
        }
    }
    {
        uint64_t *bk = (uint64_t *)b.buf;
        size_t mask = nb - 1, freed = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *it = PyList_GET_ITEM(items_o, k);
            PyObject *nso = PyTuple_GET_ITEM(it, 0), *ko = PyTuple_GET_ITEM(it, 1);
            uint64_t lo, hi;
            ident_ns(PyBytes_AS_STRING(nso), (size_t)PyBytes_GET_SIZE(nso), PyBytes_AS_STRING(ko),
                     (size_t)PyBytes_GET_SIZE(ko), &lo, &hi);
            int64_t at = bucket_find(bk, nb, lo, hi);
            if (at < 0)
                continue;
            size_t i = (size_t)at, j = i;
            for (;;) { /* SlotTable._delete */
                j = (j + 1) & mask;
                if (bk[4 * j + 3] == 0)
                    break;
                size_t home = (size_t)(bk[4 * j + 1] & mask);
                if ((i <= j && (home <= i || home > j)) || (i > j && home <= i && home > j)) {
                    bucket_write(bk, i, bk[4 * j + 1], bk[4 * j + 2], bk[4 * j + 3]);
                    i = j;
                }
            }
            bucket_write(bk, i, 0, 0, 0);
            freed++;
        }
        result = PyLong_FromSize_t(freed);
    }
done:
    PyBuffer_Release(&b);
    return result;
}

/* copy_at(dst, offsets, srcs, stream=False) -> int
 *     A put's copy into its slots: srcs[i] (any C-contiguous buffer) into the writable
 *     buffer dst (the arena) at byte offset offsets[i], for every i: one call for the batch,
 *     with no slice object per block. Every offset and buffer is checked (and every buffer
 *     acquired) before any byte is copied; then the GIL is released and the copies run as
 *     in copy_many (stream: non-temporal stores for pieces of 64 KiB and more, one thread).
 *     Returns the bytes copied. Raises TypeError (offsets or srcs not sequences, an offset
 *     not an int, a src without the buffer protocol), ValueError (lengths of offsets and
 *     srcs differ, dst read-only or not contiguous, a range outside dst), naming the item's
 *     index and what was received. Fallback: kvstored/native.py py_copy_at. */
static PyObject *copy_at(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dst", "offsets", "srcs", "stream", NULL};
    PyObject *dst_obj, *offs_obj, *srcs_obj;
    int stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|p:copy_at", kwlist, &dst_obj, &offs_obj, &srcs_obj,
                                     &stream))
        return NULL;
    (void)self;
    Py_buffer dst;
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "copy_at: dst must be a writable C-contiguous buffer, got %.100s",
                     Py_TYPE(dst_obj)->tp_name);
        return NULL;
    }
    PyObject *offs = NULL, *srcs = NULL, *result = NULL;
    Py_buffer *views = NULL;
    seg_t *segs = NULL;
    Py_ssize_t held = 0, n = 0;
    size_t total = 0;
    offs = PySequence_Fast(offs_obj, "copy_at: offsets must be a sequence of ints");
    if (offs == NULL)
        goto done;
    srcs = PySequence_Fast(srcs_obj, "copy_at: srcs must be a sequence of buffers");
    if (srcs == NULL)
        goto done;
    n = PySequence_Fast_GET_SIZE(srcs);
    if (PySequence_Fast_GET_SIZE(offs) != n) {
        PyErr_Format(PyExc_ValueError, "copy_at: %zd offsets for %zd srcs; pass one offset per src",
                     PySequence_Fast_GET_SIZE(offs), n);
        goto done;
    }
    views = PyMem_Calloc((size_t)(n + 1), sizeof(Py_buffer));
    segs = PyMem_Calloc((size_t)(n + 1), sizeof(seg_t));
    if (views == NULL || segs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(offs, i);
        if (!PyLong_Check(o)) {
            PyErr_Format(PyExc_TypeError, "copy_at: offset #%zd must be an int, got %.100s", i, Py_TYPE(o)->tp_name);
            goto done;
        }
        Py_ssize_t off = PyLong_AsSsize_t(o);
        if (off == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            off = -1;
        }
        PyObject *src = PySequence_Fast_GET_ITEM(srcs, i);
        if (PyObject_GetBuffer(src, &views[held], PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "copy_at: src #%zd must be a C-contiguous buffer, got %.100s", i,
                         Py_TYPE(src)->tp_name);
            goto done;
        }
        Py_buffer *s = &views[held++];
        if (off < 0 || off > dst.len || s->len > dst.len - off) {
            PyErr_Format(PyExc_ValueError, "copy_at: item #%zd: range [%R, +%zd) is outside the %zd-byte dst", i, o,
                         s->len, dst.len);
            goto done;
        }
        segs[i] = (seg_t){(char *)dst.buf + off, (const char *)s->buf, (size_t)s->len};
        total += (size_t)s->len;
    }
    Py_BEGIN_ALLOW_THREADS
    copy_all(segs, (size_t)n, total, 1, stream);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSize_t(total);
done:
    if (views != NULL)
        for (Py_ssize_t i = 0; i < held; i++)
            PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(segs);
    Py_XDECREF(offs);
    Py_XDECREF(srcs);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_checked", (PyCFunction)copy_checked, METH_VARARGS,
     "copy_checked(dst, src, versions, index, expected) -> bool: a version-checked one-sided copy."},
    {"copy_checked_many", (PyCFunction)copy_checked_many, METH_VARARGS,
     "copy_checked_many(items, versions, stamp_ns) -> list[bool]: copy_checked for a batch."},
    {"probe_many", (PyCFunction)probe_many, METH_VARARGS,
     "probe_many(buckets, slots, idents, out) -> int: batch lookup in the shared slot index."},
    {"probe_keys", (PyCFunction)probe_keys, METH_VARARGS,
     "probe_keys(buckets, slots, prefix, keys, min_len, max_len, found=None, hints=None) -> int: hash and look up a "
     "prefix."},
    {"read_keys", (PyCFunction)read_keys, METH_VARARGS,
     "read_keys(buckets, slots, arena, prefix, keys, dsts, stamp_ns, mid=None, hints=None) -> (sizes, metas, "
     "values, num_fallbacks)."},
    {"read_all", (PyCFunction)(void (*)(void))read_all, METH_FASTCALL,
     "read_all(buckets, slots, arena, prefix, keys, dsts, stamp_ns, hints, min_len, max_len, want_meta, mid) -> "
     "(out, num_bytes) | int: read_keys, all or nothing, with the client's argument checks."},
    {"store_release", (PyCFunction)store_release, METH_VARARGS,
     "store_release(versions, index, value): release-store a u64 slot version, then fence."},
    {"publish_many", (PyCFunction)publish_many, METH_VARARGS,
     "publish_many(slots, buckets, items, used_buckets) -> int: the node's SlotTable.publish for a batch."},
    {"unindex_many", (PyCFunction)unindex_many, METH_VARARGS,
     "unindex_many(buckets, items) -> int: the node's SlotTable.unindex for a batch."},
    {"copy_many", (PyCFunction)(void (*)(void))copy_many, METH_VARARGS | METH_KEYWORDS,
     "copy_many(pairs, threads=0, stream=False) -> int: memcpy each (dst, src) pair with the GIL released."},
    {"copy_at", (PyCFunction)(void (*)(void))copy_at, METH_VARARGS | METH_KEYWORDS,
     "copy_at(dst, offsets, srcs, stream=False) -> int: copy each src into dst at its offset (a put's slots)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvstored._native", "GIL-free batch copies (see native/README.md).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
