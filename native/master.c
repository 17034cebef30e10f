/* The master block index's hot loops in C: kvstored._native_master (see native/README.md).
 *
 * Each function works on the numpy columns' own buffers (the buffer protocol: no copy), so
 * the numpy code in kvstored/master/ (keytable.py, ranking.py, columns.py) and this code
 * read and write the same data; that numpy code is the fallback (and the reference a test
 * compares against: tests/unit/master/test_master_native.py).
 *
 *   keytable_get_many  KeyTable.get_many: a batch of 16-byte keys -> block slots
 *   best_rows          ranking.best_rows: the best readable replica of each block
 *   find_rows          IndexColumns.find_rows: a holder's row (per tier) in each chain
 *   unlink_rows        IndexColumns.unlink of many rows (chains without hot maps)
 *   parse_events       service.event_columns: a ReportEventsRequest's events from its wire bytes
 *   (native/master_lookup.c: ranked_rows, lookup_wire; MASTER_LOOKUP_METHODS below)
 *
 * Why: each of these is a walk of a few levels per key that numpy runs as ~10 calls per
 * level of 2-10 us each; in C one call per batch costs about a cache miss per row visited.
 * Not thread-safe (the master's event loop only); the GIL is held (calls are short).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "master_lookup.h"

/* One buffer argument: C-contiguous, of the given item size and format class. */
static int get_buf(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *formats, int writable,
                   const char *fn, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: %s must be a %sC-contiguous buffer, got %s", fn, name,
                     writable ? "writable " : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    while (*f == '@' || *f == '=' || *f == '<') f++;
    if (view->itemsize != itemsize || f[0] == 0 || f[1] != 0 || strchr(formats, f[0]) == NULL) {
        PyErr_Format(PyExc_ValueError, "%s: %s must hold %zd-byte items of format '%s', got format '%s'",
                     fn, name, itemsize, formats, view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

#define NBUF_MAX 12
typedef struct {
    Py_buffer v[NBUF_MAX];
    int n;
} Bufs;

static void release_all(Bufs *b) {
    for (int i = 0; i < b->n; i++) PyBuffer_Release(&b->v[i]);
    b->n = 0;
}

/* Take one buffer into bufs; returns its data or NULL (error set, all released). */
static void *take(Bufs *b, PyObject *obj, Py_ssize_t itemsize, const char *formats, int writable, const char *fn,
                  const char *name, Py_ssize_t *count) {
    if (get_buf(obj, &b->v[b->n], itemsize, formats, writable, fn, name) != 0) {
        release_all(b);
        return NULL;
    }
    Py_buffer *v = &b->v[b->n++];
    *count = v->len / itemsize;
    return v->buf;
}

#define U64 "LQ"
#define I64 "lq"
#define I32 "i"
#define U32 "I"
#define U8 "B"
#define BOOL "?B"
#define F64 "d"
#define KT_WAYS 8
#define KT_MULT 0x9E3779B97F4A7C15ULL

/* keytable_get_many(lo, hi, sl, over, bits, words, out) -> int
 * lo, hi: u64 [2**bits x 8]; sl: i32 [2**bits x 8] (-1 free); over: bool [2**bits];
 * words: u64 [n x 2] (the keys' little-endian words); out: writable i64 [n].
 * out[i] = the slot of key i, or -1. Returns how many leading keys were found. The probe of
 * KeyTable._probe: from the home bucket (Fibonacci hash of the low word), a live entry with
 * both words equal; a bucket without its overflow flag ends the search. */
static PyObject *keytable_get_many(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_lo, *o_hi, *o_sl, *o_over, *o_words, *o_out;
    int bits;
    if (!PyArg_ParseTuple(args, "OOOOiOO:keytable_get_many", &o_lo, &o_hi, &o_sl, &o_over, &bits, &o_words, &o_out))
        return NULL;
    if (bits < 1 || bits > 40) {
        PyErr_Format(PyExc_ValueError, "keytable_get_many: bits must be in 1..40, got %d", bits);
        return NULL;
    }
    const char *fn = "keytable_get_many";
    Bufs b = {.n = 0};
    Py_ssize_t n_lo, n_hi, n_sl, n_over, n_words, n_out;
    const uint64_t *lo_t = take(&b, o_lo, 8, U64, 0, fn, "lo", &n_lo);
    if (!lo_t) return NULL;
    const uint64_t *hi_t = take(&b, o_hi, 8, U64, 0, fn, "hi", &n_hi);
    if (!hi_t) return NULL;
    const int32_t *sl_t = take(&b, o_sl, 4, I32, 0, fn, "sl", &n_sl);
    if (!sl_t) return NULL;
    const uint8_t *over = take(&b, o_over, 1, BOOL, 0, fn, "over", &n_over);
    if (!over) return NULL;
    const uint64_t *words = take(&b, o_words, 8, U64, 0, fn, "words", &n_words);
    if (!words) return NULL;
    int64_t *out = take(&b, o_out, 8, I64, 1, fn, "out", &n_out);
    if (!out) return NULL;
    Py_ssize_t nb = (Py_ssize_t)1 << bits;
    if (n_lo != nb * KT_WAYS || n_hi != nb * KT_WAYS || n_sl != nb * KT_WAYS || n_over != nb ||
        n_words % 2 != 0 || n_out != n_words / 2) {
        release_all(&b);
        PyErr_Format(PyExc_ValueError,
                     "%s: sizes disagree: %zd buckets (bits %d) need lo, hi, sl of %zd entries and over of %zd; "
                     "got %zd, %zd, %zd, %zd; words %zd u64 for out %zd",
                     fn, nb, bits, nb * KT_WAYS, nb, n_lo, n_hi, n_sl, n_over, n_words, n_out);
        return NULL;
    }
    Py_ssize_t n = n_out, lead = -1;
    uint64_t mask = (uint64_t)nb - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t lo = words[2 * i], hi = words[2 * i + 1];
        uint64_t bk = (lo * KT_MULT) >> (64 - bits);
        int64_t slot = -1;
        for (Py_ssize_t step = 0; step < nb; step++) { /* bounded: at most every bucket once */
            const uint64_t *rl = lo_t + bk * KT_WAYS;
            for (int w = 0; w < KT_WAYS; w++) {
                if (rl[w] == lo && hi_t[bk * KT_WAYS + w] == hi && sl_t[bk * KT_WAYS + w] >= 0) {
                    slot = sl_t[bk * KT_WAYS + w];
                    goto done;
                }
            }
            if (!over[bk]) break;
            bk = (bk + 1) & mask;
        }
    done:
        out[i] = slot;
        if (slot < 0 && lead < 0) lead = i;
    }
    release_all(&b);
    return PyLong_FromSsize_t(lead < 0 ? n : lead);
}

/* best_rows(head, next, holder, state, tier, readable, load, slots, local_holder,
 *           out_rows, out_holders, committed, state_mask, copy_bit, ssd, rank_score,
 *           load_clip, max_ranked) -> None
 * The walk of kvstored/master/ranking.py best_rows, per block, with the same scores and the
 * same stopping rules (see there); int64 outputs. A slot without a row gets (-1, -1). */
static PyObject *best_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_head, *o_next, *o_holder, *o_state, *o_tier, *o_readable, *o_load, *o_slots, *o_orow, *o_ohold;
    long long local;
    int committed, state_mask, copy_bit, ssd, max_ranked;
    double rank_score, load_clip;
    if (!PyArg_ParseTuple(args, "OOOOOOOOLOOiiiiddi:best_rows", &o_head, &o_next, &o_holder, &o_state, &o_tier,
                          &o_readable, &o_load, &o_slots, &local, &o_orow, &o_ohold, &committed, &state_mask,
                          &copy_bit, &ssd, &rank_score, &load_clip, &max_ranked))
        return NULL;
    const char *fn = "best_rows";
    Bufs b = {.n = 0};
    Py_ssize_t n_head, n_next, n_holder, n_state, n_tier, n_read, n_load, n_slots, n_orow, n_ohold;
    const int32_t *head = take(&b, o_head, 4, I32, 0, fn, "head", &n_head);
    if (!head) return NULL;
    const int32_t *next = take(&b, o_next, 4, I32, 0, fn, "next", &n_next);
    if (!next) return NULL;
    const uint32_t *holder = take(&b, o_holder, 4, U32, 0, fn, "holder", &n_holder);
    if (!holder) return NULL;
    const uint8_t *state = take(&b, o_state, 1, U8, 0, fn, "state", &n_state);
    if (!state) return NULL;
    const uint8_t *tier = take(&b, o_tier, 1, U8, 0, fn, "tier", &n_tier);
    if (!tier) return NULL;
    const uint8_t *readable = take(&b, o_readable, 1, BOOL, 0, fn, "readable", &n_read);
    if (!readable) return NULL;
    const double *load = take(&b, o_load, 8, F64, 0, fn, "load", &n_load);
    if (!load) return NULL;
    const int64_t *slots = take(&b, o_slots, 8, I64, 0, fn, "slots", &n_slots);
    if (!slots) return NULL;
    int64_t *orow = take(&b, o_orow, 8, I64, 1, fn, "out_rows", &n_orow);
    if (!orow) return NULL;
    int64_t *ohold = take(&b, o_ohold, 8, I64, 1, fn, "out_holders", &n_ohold);
    if (!ohold) return NULL;
    Py_ssize_t nrows = n_next;
    if (n_holder != nrows || n_state != nrows || n_tier != nrows || n_load != n_read || n_orow != n_slots ||
        n_ohold != n_slots) {
        release_all(&b);
        PyErr_Format(PyExc_ValueError,
                     "%s: sizes disagree: row columns next %zd, holder %zd, state %zd, tier %zd; holder columns "
                     "readable %zd, load %zd; slots %zd, outputs %zd and %zd",
                     fn, n_next, n_holder, n_state, n_tier, n_read, n_load, n_slots, n_orow, n_ohold);
        return NULL;
    }
    const double local_ssd = rank_score; /* a local DRAM replica scores below this: unbeatable */
    const char *bad = NULL;
    long long bad_value = 0;
    for (Py_ssize_t i = 0; i < n_slots; i++) {
        int64_t s = slots[i];
        if (s < 0 || s >= n_head) {
            bad = "a slot outside head";
            bad_value = s;
            break;
        }
        int64_t r = head[s];
        int64_t best_row = -1, best_holder = -1;
        double best_score = INFINITY;
        int level = 0;
        while (r >= 0) {
            if (r >= nrows) {
                bad = "a row outside the row columns";
                bad_value = r;
                break;
            }
            int64_t h = holder[r];
            if (h >= n_read) {
                bad = "a holder outside the holder columns";
                bad_value = h;
                break;
            }
            uint8_t st = state[r];
            int ok = ((st & state_mask) == committed) && readable[h];
            double rank = (h == local ? 0.0 : 2.0) + (tier[r] == ssd ? 1.0 : 0.0) + 0.5 * (st >= copy_bit ? 1.0 : 0.0);
            double l = load[h];
            double score = rank * rank_score + (isnan(l) ? l : (l < load_clip ? l : load_clip)); /* np.minimum */
            if (level == 0) { /* the first row: taken as it is (score inf when unreadable) */
                best_row = ok ? r : -1;
                best_score = ok ? score : INFINITY;
                best_holder = h;
            } else if (ok && (score < best_score || (score == best_score && h < best_holder))) {
                best_row = r;
                best_score = score;
                best_holder = h;
            }
            r = next[r];
            level++;
            if (!(best_score >= local_ssd)) break; /* a local DRAM replica cannot be beaten */
            if (level >= 2 && level >= max_ranked && best_row >= 0) break; /* as ranking.py counts */
        }
        if (bad) break;
        orow[i] = best_row;
        ohold[i] = best_holder;
    }
    release_all(&b);
    if (bad) {
        PyErr_Format(PyExc_ValueError, "%s: the columns are inconsistent: %s (%lld)", fn, bad, bad_value);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* find_rows(head, next, holder, tier, slots, holder_id, tiers, hot, max_depth, out) -> int
 * IndexColumns.find_rows: per slot, the row of (holder_id, tiers[i]) in its chain, or -1.
 * A slot in ``hot`` (dict slot -> HotChain) answers from its ``rows`` map (holder * 4 + tier);
 * a chain walked past ``max_depth`` rows without a match gets -2 (the caller gives it its
 * HotChain and asks the map, as the numpy code does). Returns how many got -2. */
static PyObject *find_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_head, *o_next, *o_holder, *o_tier, *o_slots, *o_tiers, *hot, *o_out;
    long long holder_id;
    int max_depth;
    if (!PyArg_ParseTuple(args, "OOOOOLOO!iO:find_rows", &o_head, &o_next, &o_holder, &o_tier, &o_slots,
                          &holder_id, &o_tiers, &PyDict_Type, &hot, &max_depth, &o_out))
        return NULL;
    const char *fn = "find_rows";
    Bufs b = {.n = 0};
    Py_ssize_t n_head, n_next, n_holder, n_tier, n_slots, n_tiers, n_out;
    const int32_t *head = take(&b, o_head, 4, I32, 0, fn, "head", &n_head);
    if (!head) return NULL;
    const int32_t *next = take(&b, o_next, 4, I32, 0, fn, "next", &n_next);
    if (!next) return NULL;
    const uint32_t *holder = take(&b, o_holder, 4, U32, 0, fn, "holder", &n_holder);
    if (!holder) return NULL;
    const uint8_t *tier = take(&b, o_tier, 1, U8, 0, fn, "tier", &n_tier);
    if (!tier) return NULL;
    const int64_t *slots = take(&b, o_slots, 8, I64, 0, fn, "slots", &n_slots);
    if (!slots) return NULL;
    const int64_t *tiers = take(&b, o_tiers, 8, I64, 0, fn, "tiers", &n_tiers);
    if (!tiers) return NULL;
    int64_t *out = take(&b, o_out, 8, I64, 1, fn, "out", &n_out);
    if (!out) return NULL;
    Py_ssize_t nrows = n_next;
    if (n_holder != nrows || n_tier != nrows || n_tiers != n_slots || n_out != n_slots) {
        release_all(&b);
        PyErr_Format(PyExc_ValueError,
                     "%s: sizes disagree: next %zd, holder %zd, tier %zd rows; slots %zd, tiers %zd, out %zd", fn,
                     n_next, n_holder, n_tier, n_slots, n_tiers, n_out);
        return NULL;
    }
    int use_hot = PyDict_GET_SIZE(hot) > 0;
    Py_ssize_t num_long = 0;
    const char *bad = NULL;
    long long bad_value = 0;
    for (Py_ssize_t i = 0; i < n_slots && !bad; i++) {
        int64_t s = slots[i];
        if (s < 0 || s >= n_head) {
            bad = "a slot outside head";
            bad_value = s;
            break;
        }
        int64_t t = tiers[i], found = -1;
        if (use_hot) {
            PyObject *key = PyLong_FromLongLong(s);
            if (!key) goto error;
            PyObject *hc = PyDict_GetItemWithError(hot, key); /* borrowed */
            Py_DECREF(key);
            if (hc == NULL && PyErr_Occurred()) goto error;
            if (hc != NULL) {
                PyObject *rows = PyObject_GetAttrString(hc, "rows");
                if (!rows) goto error;
                if (!PyDict_Check(rows)) {
                    Py_DECREF(rows);
                    PyErr_Format(PyExc_TypeError, "%s: a hot chain's rows must be a dict", fn);
                    goto error;
                }
                PyObject *ht = PyLong_FromLongLong(holder_id * 4 + t);
                if (!ht) {
                    Py_DECREF(rows);
                    goto error;
                }
                PyObject *row = PyDict_GetItemWithError(rows, ht);
                Py_DECREF(ht);
                if (row == NULL && PyErr_Occurred()) {
                    Py_DECREF(rows);
                    goto error;
                }
                found = row ? PyLong_AsLongLong(row) : -1;
                Py_DECREF(rows);
                if (found == -1 && PyErr_Occurred()) goto error;
                out[i] = found;
                continue;
            }
        }
        int64_t r = head[s];
        int depth = 0;
        while (r >= 0) {
            if (r >= nrows) {
                bad = "a row outside the row columns";
                bad_value = r;
                break;
            }
            if ((long long)holder[r] == holder_id && (int64_t)tier[r] == t) {
                found = r;
                break;
            }
            r = next[r];
            depth++;
            if (depth > max_depth && r >= 0) {
                found = -2;
                num_long++;
                break;
            }
        }
        out[i] = found;
    }
    release_all(&b);
    if (bad) {
        PyErr_Format(PyExc_ValueError, "%s: the columns are inconsistent: %s (%lld)", fn, bad, bad_value);
        return NULL;
    }
    return PyLong_FromSsize_t(num_long);
error:
    release_all(&b);
    return NULL;
}


/* unlink_rows(head, next, block, holder, state, hnext, hprev, holder_head, rows, emptied) -> int
 * IndexColumns.unlink of many rows of chains without HotChain maps (the caller keeps hot
 * chains, free lists, key tables and counters): per row, in order, its predecessor is found
 * by walking its block's chain from head[block[row]], then the row leaves its holder's list
 * and its block's chain, and gets state 0 and no links. emptied (writable u8, one per row) is
 * set to 1 where the row was its block's last. Every row is checked first (live: in a chain,
 * distinct); nothing changes when one is not. Returns how many blocks were emptied. */
#define SEEN_BIT 0x40
static PyObject *unlink_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_head, *o_next, *o_block, *o_holder, *o_state, *o_hnext, *o_hprev, *o_hhead, *o_rows, *o_empt;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO:unlink_rows", &o_head, &o_next, &o_block, &o_holder, &o_state, &o_hnext,
                          &o_hprev, &o_hhead, &o_rows, &o_empt))
        return NULL;
    const char *fn = "unlink_rows";
    Bufs b = {.n = 0};
    Py_ssize_t n_head, n_next, n_block, n_holder, n_state, n_hnext, n_hprev, n_hhead, n_rows, n_empt;
    int32_t *head = take(&b, o_head, 4, I32, 1, fn, "head", &n_head);
    if (!head) return NULL;
    int32_t *next = take(&b, o_next, 4, I32, 1, fn, "next", &n_next);
    if (!next) return NULL;
    int32_t *block = take(&b, o_block, 4, I32, 1, fn, "block", &n_block);
    if (!block) return NULL;
    const uint32_t *holder = take(&b, o_holder, 4, U32, 0, fn, "holder", &n_holder);
    if (!holder) return NULL;
    uint8_t *state = take(&b, o_state, 1, U8, 1, fn, "state", &n_state);
    if (!state) return NULL;
    int32_t *hnext = take(&b, o_hnext, 4, I32, 1, fn, "hnext", &n_hnext);
    if (!hnext) return NULL;
    int32_t *hprev = take(&b, o_hprev, 4, I32, 1, fn, "hprev", &n_hprev);
    if (!hprev) return NULL;
    int64_t *hhead = take(&b, o_hhead, 8, I64, 1, fn, "holder_head", &n_hhead);
    if (!hhead) return NULL;
    const int64_t *rows = take(&b, o_rows, 8, I64, 0, fn, "rows", &n_rows);
    if (!rows) return NULL;
    uint8_t *emptied = take(&b, o_empt, 1, BOOL, 1, fn, "emptied", &n_empt);
    if (!emptied) return NULL;
    Py_ssize_t nrows = n_next;
    if (n_block != nrows || n_holder != nrows || n_state != nrows || n_hnext != nrows || n_hprev != nrows ||
        n_empt != n_rows) {
        release_all(&b);
        PyErr_Format(PyExc_ValueError,
                     "%s: sizes disagree: next %zd, block %zd, holder %zd, state %zd, hnext %zd, hprev %zd rows; "
                     "%zd rows to unlink, emptied %zd",
                     fn, n_next, n_block, n_holder, n_state, n_hnext, n_hprev, n_rows, n_empt);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n_rows; i++) { /* all checked before any change */
        int64_t r = rows[i];
        const char *why = NULL;
        if (r < 0 || r >= nrows || block[r] < 0 || block[r] >= n_head || holder[r] >= n_hhead || state[r] == 0)
            why = "is not a live row of a block";
        else if (state[r] & SEEN_BIT) /* marked below: live states never carry it (WRITING 1, COMMITTED 2) */
            why = "is repeated";
        if (why) {
            for (Py_ssize_t j = 0; j < i; j++) state[rows[j]] &= (uint8_t)~SEEN_BIT;
            release_all(&b);
            PyErr_Format(PyExc_ValueError, "%s: row %lld (#%zd) %s", fn, (long long)r, i, why);
            return NULL;
        }
        state[r] |= SEEN_BIT;
    }
    Py_ssize_t num_emptied = 0;
    for (Py_ssize_t i = 0; i < n_rows; i++) {
        int64_t r = rows[i], s = block[r];
        int64_t prev = -1, cur = head[s];
        while (cur >= 0 && cur != r) {
            prev = cur;
            cur = next[cur];
        }
        /* out of its holder's list */
        int32_t hn = hnext[r], hp = hprev[r];
        if (hp < 0)
            hhead[holder[r]] = hn;
        else
            hnext[hp] = hn;
        if (hn >= 0) hprev[hn] = hp;
        hnext[r] = hprev[r] = -1;
        /* out of its block's chain */
        int32_t nx = next[r];
        if (cur == r) { /* (always: a live row is in its block's chain) */
            if (prev < 0)
                head[s] = nx;
            else
                next[prev] = nx;
        }
        state[r] = 0;
        next[r] = -1;
        block[r] = -1;
        emptied[i] = head[s] < 0;
        num_emptied += emptied[i];
    }
    release_all(&b);
    return PyLong_FromSsize_t(num_emptied);
}

/* ---- ReportEventsRequest wire bytes -> event columns ------------------------------------ */
typedef struct {
    const uint8_t *p, *end;
} Rd;

static int rd_varint(Rd *r, uint64_t *out) {
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
static int rd_skip(Rd *r, int wt) {
    uint64_t v;
    switch (wt) {
    case 0: return rd_varint(r, &v);
    case 1: if (r->end - r->p < 8) return -1; r->p += 8; return 0;
    case 5: if (r->end - r->p < 4) return -1; r->p += 4; return 0;
    case 2:
        if (rd_varint(r, &v) != 0 || v > (uint64_t)(r->end - r->p)) return -1;
        r->p += v;
        return 0;
    default: return -1;
    }
}

/* A length-delimited field's bytes; -1 when malformed. */
static int rd_len(Rd *r, Rd *sub) {
    uint64_t v;
    if (rd_varint(r, &v) != 0 || v > (uint64_t)(r->end - r->p)) return -1;
    sub->p = r->p;
    sub->end = r->p + v;
    r->p += v;
    return 0;
}

typedef struct {
    uint64_t seq, size, gen;
    int64_t kind, tier, replicas;
    int copy;
    const uint8_t *ns, *key;
    Py_ssize_t ns_len, key_len;
} Event;

/* One BlockRef: 0 parsed, 1 not in the canonical form (a field repeated, a known field of
 * another wire type, a value the numpy columns would not take): let protobuf read it. */
static int parse_ref(Rd r, Event *e) {
    unsigned seen = 0;
    while (r.p < r.end) {
        uint64_t tag, v;
        if (rd_varint(&r, &tag) != 0) return 1;
        int field = (int)(tag >> 3), wt = (int)(tag & 7);
        if (field >= 1 && field <= 7) {
            if (seen & (1u << field)) return 1;
            seen |= 1u << field;
        }
        if ((field == 1 || field == 2) && wt == 2) {
            Rd sub;
            if (rd_len(&r, &sub) != 0) return 1;
            if (field == 1) { e->ns = sub.p; e->ns_len = sub.end - sub.p; }
            else { e->key = sub.p; e->key_len = sub.end - sub.p; }
        } else if (field >= 3 && field <= 7 && wt == 0) {
            if (rd_varint(&r, &v) != 0) return 1;
            switch (field) {
            case 3: e->tier = (int32_t)(uint32_t)v; break; /* an enum: int32 */
            case 4: if (v >> 63) return 1; e->size = v; break;
            case 5: e->gen = v; break;
            case 6: e->copy = v != 0; break;
            case 7: e->replicas = (uint32_t)v; break;
            }
        } else if (field >= 1 && field <= 7) {
            return 1;
        } else if (rd_skip(&r, wt) != 0) {
            return 1;
        }
    }
    return 0;
}

static int parse_event(Rd r, Event *e) {
    unsigned seen = 0;
    while (r.p < r.end) {
        uint64_t tag, v;
        if (rd_varint(&r, &tag) != 0) return 1;
        int field = (int)(tag >> 3), wt = (int)(tag & 7);
        if (field >= 1 && field <= 3) {
            if (seen & (1u << field)) return 1;
            seen |= 1u << field;
        }
        if (field == 1 && wt == 0) {
            if (rd_varint(&r, &v) != 0) return 1;
            e->seq = v;
        } else if (field == 2 && wt == 0) {
            if (rd_varint(&r, &v) != 0) return 1;
            e->kind = (int32_t)(uint32_t)v;
        } else if (field == 3 && wt == 2) {
            Rd sub;
            if (rd_len(&r, &sub) != 0 || parse_ref(sub, e) != 0) return 1;
        } else if (field >= 1 && field <= 3) {
            return 1;
        } else if (rd_skip(&r, wt) != 0) {
            return 1;
        }
    }
    return 0;
}

/* parse_events(data, max_key_bytes, max_replicas, kind_a, kind_b, tier_a, tier_b) -> tuple | None
 * The events of a serialized ReportEventsRequest (field 3: BlockEvent{seq 1, kind 2,
 * block 3: BlockRef{namespace_id 1, key 2, tier 3, size_bytes 4, generation 5, copy 6,
 * replicas 7}}) as columns: (seqs, kinds, namespace_ids, keys: lists; tiers, sizes: int64,
 * generations: uint64, copies: bool, replicas: int64 as bytes of n items; clean: every key of
 * 1..max_key_bytes bytes, kind and tier one of the two given, generation < 2**63, replicas
 * <= max_replicas: when False the caller's checks name the bad event). None when the
 * bytes are not in the form this reads exactly as protobuf would (a field repeated or of
 * another wire type, a size >= 2**63, malformed): the caller reads the message instead. */
static PyObject *parse_events(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arg;
    long long max_key, max_replicas, kind_a, kind_b, tier_a, tier_b;
    if (!PyArg_ParseTuple(args, "OLLLLLL:parse_events", &arg, &max_key, &max_replicas, &kind_a, &kind_b, &tier_a,
                          &tier_b))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    Rd r = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
    Py_ssize_t n = 0;
    { /* count the events first */
        Rd c = r;
        while (c.p < c.end) {
            uint64_t tag;
            if (rd_varint(&c, &tag) != 0) goto not_canonical;
            if ((tag >> 3) == 3) {
                if ((tag & 7) != 2) goto not_canonical;
                n++;
            }
            if (rd_skip(&c, (int)(tag & 7)) != 0) goto not_canonical;
        }
    }
    Event *evs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Event));
    if (!evs) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Py_ssize_t i = 0;
    while (r.p < r.end) {
        uint64_t tag = 0;
        rd_varint(&r, &tag); /* checked by the count */
        if ((tag >> 3) == 3) {
            Rd sub;
            rd_len(&r, &sub);
            if (parse_event(sub, &evs[i++]) != 0) {
                PyMem_Free(evs);
                goto not_canonical;
            }
        } else {
            rd_skip(&r, (int)(tag & 7));
        }
    }
    PyObject *seqs = PyList_New(n), *kinds = PyList_New(n), *nss = PyList_New(n), *keys = PyList_New(n);
    PyObject *tiers = PyBytes_FromStringAndSize(NULL, 8 * n), *sizes = PyBytes_FromStringAndSize(NULL, 8 * n);
    PyObject *gens = PyBytes_FromStringAndSize(NULL, 8 * n), *copies = PyBytes_FromStringAndSize(NULL, n);
    PyObject *reps = PyBytes_FromStringAndSize(NULL, 8 * n);
    PyObject *out = NULL, *last_ns = NULL;
    if (!seqs || !kinds || !nss || !keys || !tiers || !sizes || !gens || !copies || !reps) goto done;
    int64_t *t = (int64_t *)PyBytes_AS_STRING(tiers), *sz = (int64_t *)PyBytes_AS_STRING(sizes);
    uint64_t *g = (uint64_t *)PyBytes_AS_STRING(gens);
    int64_t *rp = (int64_t *)PyBytes_AS_STRING(reps);
    char *cp = PyBytes_AS_STRING(copies);
    for (i = 0; i < n; i++) {
        Event *e = &evs[i];
        PyObject *q = PyLong_FromUnsignedLongLong(e->seq), *k = PyLong_FromLongLong(e->kind);
        static const uint8_t none[1] = {0}; /* an absent field: empty bytes */
        const uint8_t *kp = e->key ? e->key : none, *np = e->ns ? e->ns : none;
        PyObject *key = PyBytes_FromStringAndSize((const char *)kp, e->key_len);
        PyObject *ns;
        if (last_ns && PyBytes_GET_SIZE(last_ns) == e->ns_len &&
            memcmp(PyBytes_AS_STRING(last_ns), np, (size_t)e->ns_len) == 0) {
            ns = last_ns; /* one object for a namespace repeated event after event */
            Py_INCREF(ns);
        } else {
            ns = PyBytes_FromStringAndSize((const char *)np, e->ns_len);
        }
        if (!q || !k || !key || !ns) {
            Py_XDECREF(q); Py_XDECREF(k); Py_XDECREF(key); Py_XDECREF(ns);
            goto done;
        }
        last_ns = ns;
        PyList_SET_ITEM(seqs, i, q);
        PyList_SET_ITEM(kinds, i, k);
        PyList_SET_ITEM(keys, i, key);
        PyList_SET_ITEM(nss, i, ns);
        t[i] = e->tier;
        sz[i] = (int64_t)e->size;
        g[i] = e->gen;
        cp[i] = (char)e->copy;
        rp[i] = e->replicas;
    }
    int clean = 1; /* every value within what the checks of service.py accept */
    for (i = 0; i < n && clean; i++) {
        Event *e = &evs[i];
        clean = e->key_len >= 1 && e->key_len <= max_key && (e->kind == kind_a || e->kind == kind_b) &&
                (e->tier == tier_a || e->tier == tier_b) && !(e->gen >> 63) && e->replicas <= max_replicas;
    }
    out = Py_BuildValue("(OOOOOOOOOO)", seqs, kinds, nss, keys, tiers, sizes, gens, copies, reps,
                        clean ? Py_True : Py_False);
done:
    Py_XDECREF(seqs); Py_XDECREF(kinds); Py_XDECREF(nss); Py_XDECREF(keys); Py_XDECREF(tiers);
    Py_XDECREF(sizes); Py_XDECREF(gens); Py_XDECREF(copies); Py_XDECREF(reps);
    PyMem_Free(evs);
    PyBuffer_Release(&view);
    return out;
not_canonical:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"keytable_get_many", keytable_get_many, METH_VARARGS,
     "keytable_get_many(lo, hi, sl, over, bits, words, out) -> int: slots of a batch of keys (-1 absent); "
     "returns the leading count found."},
    {"best_rows", best_rows, METH_VARARGS,
     "best_rows(head, next, holder, state, tier, readable, load, slots, local_holder, out_rows, out_holders, "
     "committed, state_mask, copy_bit, ssd, rank_score, load_clip, max_ranked): the ranking walk."},
    {"find_rows", find_rows, METH_VARARGS,
     "find_rows(head, next, holder, tier, slots, holder_id, tiers, hot, max_depth, out) -> int: a holder's row "
     "per chain (-1 none, -2 chain too long: make it hot); returns the count of -2."},
    {"unlink_rows", unlink_rows, METH_VARARGS,
     "unlink_rows(head, next, block, holder, state, hnext, hprev, holder_head, rows, emptied) -> int: unlink rows of "
     "chains without hot maps; returns the count of blocks emptied."},
    {"parse_events", parse_events, METH_VARARGS,
     "parse_events(data) -> tuple | None: a serialized ReportEventsRequest's events as columns (None: not in "
     "the canonical form; read the message)."},
    MASTER_LOOKUP_METHODS
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvstored._native_master",
    "The master block index's hot loops (see native/README.md and kvstored/native.py).", -1, methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native_master(void) { return PyModule_Create(&module); }
