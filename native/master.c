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
 *   unlink_rows        IndexColumns.unlink_many: many rows unlinked (hot chains' through their maps)
 *   HotChains          the hot chains' maps (native/master_hot.h; columns.py PyHotChains in Python)
 *   parse_events       service.event_columns: a ReportEventsRequest's events from its wire bytes
 *   apply_events       Membership._apply_run: a ReportEvents run of one namespace applied
 *                      (the batch methods of BlockIndex: add, remove, copies to promote)
 *   (native/master_lookup.c: ranked_rows, lookup_wire; MASTER_LOOKUP_METHODS below)
 *
 * Why: each of these is a walk of a few levels per key that numpy runs as ~10 calls per
 * level of 2-10 us each; in C one call per batch costs about a cache miss per row visited,
 * and keytable_get_many, best_rows and lookup_wire overlap those misses 32 keys at a time
 * (group prefetching: master_buffers.h).
 * Not thread-safe (the master's event loop only); the GIL is held (calls are short).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "master_buffers.h"
#include "master_lookup.h"
#include "master_hot.h"

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

#define NBUF_MAX 32
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
#define KT_GROUP MB_PREFETCH_GROUP /* keys (blocks) per stage of the group prefetching below */

/* keytable_get_many(buckets, bits, words, out) -> int
 * buckets: u8 [2**bits x 64], 64-byte aligned (MbBucket, master_buffers.h; KeyTable.probe_buffers);
 * words: u64 [n x 2] (the keys' little-endian words); out: writable i64 [n].
 * out[i] = the slot of key i, or -1. Returns how many leading keys were found. The probe of
 * KeyTable._probe (mb_kt_probe). */
static PyObject *keytable_get_many(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_bk, *o_words, *o_out;
    int bits;
    if (!PyArg_ParseTuple(args, "OiOO:keytable_get_many", &o_bk, &bits, &o_words, &o_out)) return NULL;
    const char *fn = "keytable_get_many";
    Bufs b = {.n = 0};
    Py_ssize_t n_bk, n_words, n_out;
    const MbBucket *bk_t = take(&b, o_bk, 1, U8, 0, fn, "buckets", &n_bk);
    if (!bk_t) return NULL;
    const uint64_t *words = take(&b, o_words, 8, U64, 0, fn, "words", &n_words);
    if (!words) return NULL;
    int64_t *out = take(&b, o_out, 8, I64, 1, fn, "out", &n_out);
    if (!out) return NULL;
    if (mb_check_buckets(bk_t, n_bk, bits, fn) != 0) {
        release_all(&b);
        return NULL;
    }
    if (n_words % 2 != 0 || n_out != n_words / 2) {
        release_all(&b);
        PyErr_Format(PyExc_ValueError, "%s: sizes disagree: words %zd u64 for out %zd", fn, n_words, n_out);
        return NULL;
    }
    Py_ssize_t n = n_out, lead = -1;
    /* Group prefetching (Chen, Ailamaki, Gibbons, Mowry, "Improving Hash Join Performance
     * through Prefetching", ICDE 2004; the batched lookups of MICA, Lim et al., NSDI 2014): the
     * home buckets (one line each) of KT_GROUP keys are fetched ahead, then probed, so their
     * cache misses overlap instead of one after the other (a 10M-block table is hundreds of MB). */
    for (Py_ssize_t g0 = 0; g0 < n; g0 += KT_GROUP) {
        Py_ssize_t g1 = g0 + KT_GROUP < n ? g0 + KT_GROUP : n;
        for (Py_ssize_t i = g0; i < g1; i++) mb_prefetch_bucket(bk_t, mb_home(words[2 * i], bits));
        for (Py_ssize_t i = g0; i < g1; i++) {
            int64_t pos, slot = mb_kt_probe(bk_t, bits, words[2 * i], words[2 * i + 1], &pos);
            out[i] = slot;
            if (slot < 0 && lead < 0) lead = i;
        }
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
    /* group prefetching (master_buffers.h): a group's head entries, then their first two rows,
     * fetched ahead of the walks; the walks below read the same data in the same order */
    for (Py_ssize_t g0 = 0; g0 < n_slots && !bad; g0 += KT_GROUP) {
        Py_ssize_t g1 = g0 + KT_GROUP < n_slots ? g0 + KT_GROUP : n_slots;
        for (Py_ssize_t i = g0; i < g1; i++)
            if (slots[i] >= 0 && slots[i] < n_head) __builtin_prefetch(head + slots[i]);
        for (Py_ssize_t i = g0; i < g1; i++) {
            int64_t r = slots[i] >= 0 && slots[i] < n_head ? head[slots[i]] : -1;
            if (r >= 0 && r < nrows) mb_prefetch_row(next, holder, state, tier, r);
        }
        for (Py_ssize_t i = g0; i < g1; i++) {
            int64_t r = slots[i] >= 0 && slots[i] < n_head ? head[slots[i]] : -1;
            r = r >= 0 && r < nrows ? next[r] : -1;
            if (r >= 0 && r < nrows) mb_prefetch_row(next, holder, state, tier, r);
        }
        for (Py_ssize_t i = g0; i < g1; i++) {
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
                double rank = (h == local ? 0.0 : 2.0) + (tier[r] == ssd ? 1.0 : 0.0) +
                              0.5 * (st >= copy_bit ? 1.0 : 0.0);
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
 * A slot hot in ``hot`` (a HotChains: native/master_hot.h) answers from its maps (holder * 4
 * + tier); a chain walked past ``max_depth`` rows without a match gets its maps here (as
 * IndexColumns.make_hot) and asks them, as the numpy code does. Returns how many chains
 * became hot. */
static PyObject *find_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_head, *o_next, *o_holder, *o_tier, *o_slots, *o_tiers, *o_out;
    HotObj *hot;
    long long holder_id;
    int max_depth;
    if (!PyArg_ParseTuple(args, "OOOOOLOO!iO:find_rows", &o_head, &o_next, &o_holder, &o_tier, &o_slots,
                          &holder_id, &o_tiers, &HotChainsType, &hot, &max_depth, &o_out))
        return NULL;
    const char *fn = "find_rows";
    if (holder_id < 0 || holder_id >= ((long long)1 << 30)) {
        PyErr_Format(PyExc_ValueError, "%s: holder_id must be in [0, 2**30), got %lld", fn, holder_id);
        return NULL;
    }
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
        if (t < 0 || t > 3) {
            bad = "a tier outside 0..3";
            bad_value = t;
            break;
        }
        if (ht_count(hot, s) >= 0) {
            out[i] = ht_find(hot, s, holder_id * 4 + t, NULL);
            continue;
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
            if (depth > max_depth && r >= 0) { /* a long chain: hot from now on */
                if (ht_make(hot, s, head, next, holder, tier, nrows) != 0) goto error;
                found = ht_find(hot, s, holder_id * 4 + t, NULL);
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


/* unlink_rows(head, next, block, holder, tier, state, hnext, hprev, holder_head, hot, hot_rows, rows,
 *             emptied) -> int
 * IndexColumns.unlink of many rows (the caller keeps free lists, key tables and counters):
 * per row, in order, its predecessor is found in its block's maps when the block is hot in
 * ``hot`` (a HotChains), else by walking its block's chain from head[block[row]]; then the
 * row leaves its holder's list, its block's chain and its maps (which are dropped when the
 * chain is left empty or with fewer than hot_rows / 2 rows), and gets state 0 and no links.
 * emptied (writable u8, one per row) is set to 1 where the row was its block's last. Every
 * row is checked first (live: in a chain, distinct); nothing changes when one is not.
 * Returns how many blocks were emptied. */
#define SEEN_BIT 0x40
static PyObject *unlink_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_head, *o_next, *o_block, *o_holder, *o_tier, *o_state, *o_hnext, *o_hprev, *o_hhead, *o_rows,
        *o_empt;
    HotObj *hot;
    int hot_rows;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO!iOO:unlink_rows", &o_head, &o_next, &o_block, &o_holder, &o_tier,
                          &o_state, &o_hnext, &o_hprev, &o_hhead, &HotChainsType, &hot, &hot_rows, &o_rows, &o_empt))
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
    Py_ssize_t n_tier;
    const uint8_t *tier = take(&b, o_tier, 1, U8, 0, fn, "tier", &n_tier);
    if (!tier) return NULL;
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
    if (n_block != nrows || n_holder != nrows || n_tier != nrows || n_state != nrows || n_hnext != nrows ||
        n_hprev != nrows || n_empt != n_rows) {
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
        int is_hot = ht_count(hot, s) >= 0;
        if (is_hot) {
            int64_t pi = hm_find(&hot->prev, (uint64_t)r);
            if (pi < 0) {
                for (Py_ssize_t j = i; j < n_rows; j++) state[rows[j]] &= (uint8_t)~SEEN_BIT;
                release_all(&b);
                PyErr_Format(PyExc_RuntimeError, "%s: row %lld of hot slot %lld is not in its maps", fn, (long long)r,
                             (long long)s);
                return NULL;
            }
            prev = hot->prev.vals[pi];
            cur = r;
        } else {
            while (cur >= 0 && cur != r) {
                prev = cur;
                cur = next[cur];
            }
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
        if (is_hot) { /* HotChain.remove; the maps go when the chain is empty or short again */
            int64_t left = ht_remove(hot, s, r, nx, (int64_t)holder[r] * 4 + tier[r]);
            if (left < 0) {
                for (Py_ssize_t j = i; j < n_rows; j++) state[rows[j]] &= (uint8_t)~SEEN_BIT;
                release_all(&b);
                return NULL;
            }
            if ((nx < 0 && prev < 0) || left < hot_rows / 2) ht_drop(hot, s, head, next, holder, tier);
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
/* (the wire reader, MbRd / mb_varint / mb_skip, is master_buffers.h's, shared with
   master_lookup.c) */

/* A length-delimited field's bytes; -1 when malformed. */
static int rd_len(MbRd *r, MbRd *sub) {
    uint64_t v;
    if (mb_varint(r, &v) != 0 || v > (uint64_t)(r->end - r->p)) return -1;
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
static int parse_ref(MbRd r, Event *e) {
    unsigned seen = 0;
    while (r.p < r.end) {
        uint64_t tag, v;
        if (mb_varint(&r, &tag) != 0) return 1;
        int field = (int)(tag >> 3), wt = (int)(tag & 7);
        if (field >= 1 && field <= 7) {
            if (seen & (1u << field)) return 1;
            seen |= 1u << field;
        }
        if ((field == 1 || field == 2) && wt == 2) {
            MbRd sub;
            if (rd_len(&r, &sub) != 0) return 1;
            if (field == 1) { e->ns = sub.p; e->ns_len = sub.end - sub.p; }
            else { e->key = sub.p; e->key_len = sub.end - sub.p; }
        } else if (field >= 3 && field <= 7 && wt == 0) {
            if (mb_varint(&r, &v) != 0) return 1;
            switch (field) {
            case 3: e->tier = (int32_t)(uint32_t)v; break; /* an enum: int32 */
            case 4: if (v >> 63) return 1; e->size = v; break;
            case 5: e->gen = v; break;
            case 6: e->copy = v != 0; break;
            case 7: e->replicas = (uint32_t)v; break;
            }
        } else if (field >= 1 && field <= 7) {
            return 1;
        } else if (mb_skip(&r, wt) != 0) {
            return 1;
        }
    }
    return 0;
}

static int parse_event(MbRd r, Event *e) {
    unsigned seen = 0;
    while (r.p < r.end) {
        uint64_t tag, v;
        if (mb_varint(&r, &tag) != 0) return 1;
        int field = (int)(tag >> 3), wt = (int)(tag & 7);
        if (field >= 1 && field <= 3) {
            if (seen & (1u << field)) return 1;
            seen |= 1u << field;
        }
        if (field == 1 && wt == 0) {
            if (mb_varint(&r, &v) != 0) return 1;
            e->seq = v;
        } else if (field == 2 && wt == 0) {
            if (mb_varint(&r, &v) != 0) return 1;
            e->kind = (int32_t)(uint32_t)v;
        } else if (field == 3 && wt == 2) {
            MbRd sub;
            if (rd_len(&r, &sub) != 0 || parse_ref(sub, e) != 0) return 1;
        } else if (field >= 1 && field <= 3) {
            return 1;
        } else if (mb_skip(&r, wt) != 0) {
            return 1;
        }
    }
    return 0;
}

/* parse_events(data, max_key_bytes, max_replicas, kind_a, kind_b, tier_a, tier_b[, field]) -> tuple | None
 * The events of a serialized ReportEventsRequest (field 3, or `field`: HeartbeatRequest's are
 * field 7: BlockEvent{seq 1, kind 2,
 * block 3: BlockRef{namespace_id 1, key 2, tier 3, size_bytes 4, generation 5, copy 6,
 * replicas 7}}) as columns: (seqs, kinds, namespace_ids, keys: lists; tiers, sizes: int64,
 * generations: uint64, copies: bool, replicas: int64 as bytes of n items; clean: every key of
 * 1..max_key_bytes bytes, kind and tier one of the two given, generation < 2**63, replicas
 * <= max_replicas: when False the caller's checks name the bad event; consecutive: each seq
 * is the one before + 1; distinct: no (namespace_id, key) pair twice; rest: with `strip`,
 * the message's other fields' bytes, in order (what parses as the message without its
 * events), else None). None when the
 * bytes are not in the form this reads exactly as protobuf would (a field repeated or of
 * another wire type, a size >= 2**63, malformed): the caller reads the message instead. */
static PyObject *parse_events(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arg;
    long long max_key, max_replicas, kind_a, kind_b, tier_a, tier_b;
    int field = 3; /* ReportEventsRequest.events; HeartbeatRequest.events is 7 */
    int strip = 0; /* also answer the message's bytes without the events (the rest of a heartbeat) */
    if (!PyArg_ParseTuple(args, "OLLLLLL|ip:parse_events", &arg, &max_key, &max_replicas, &kind_a, &kind_b, &tier_a,
                          &tier_b, &field, &strip))
        return NULL;
    if (field < 1 || field > 536870911) {
        PyErr_Format(PyExc_ValueError, "parse_events: field must be a protobuf field number, got %d", field);
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    MbRd r = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
    Py_ssize_t n = 0;
    { /* count the events first */
        MbRd c = r;
        while (c.p < c.end) {
            uint64_t tag;
            if (mb_varint(&c, &tag) != 0) goto not_canonical;
            if ((tag >> 3) == (uint64_t)field) {
                if ((tag & 7) != 2) goto not_canonical;
                n++;
            }
            if (mb_skip(&c, (int)(tag & 7)) != 0) goto not_canonical;
        }
    }
    Event *evs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Event));
    if (!evs) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    uint8_t *rest = NULL; /* strip: every other field's bytes, in order */
    Py_ssize_t rest_len = 0;
    if (strip && !(rest = PyMem_Malloc(view.len ? (size_t)view.len : 1))) {
        PyMem_Free(evs);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Py_ssize_t i = 0;
    while (r.p < r.end) {
        uint64_t tag = 0;
        const uint8_t *at = r.p;
        mb_varint(&r, &tag); /* checked by the count */
        if ((tag >> 3) == (uint64_t)field) {
            MbRd sub;
            rd_len(&r, &sub);
            if (parse_event(sub, &evs[i++]) != 0) {
                PyMem_Free(evs);
                PyMem_Free(rest);
                goto not_canonical;
            }
        } else {
            mb_skip(&r, (int)(tag & 7));
            if (rest) {
                memcpy(rest + rest_len, at, (size_t)(r.p - at));
                rest_len += r.p - at;
            }
        }
    }
    PyObject *seqs = PyList_New(n), *kinds = PyList_New(n), *nss = PyList_New(n), *keys = PyList_New(n);
    /* the value columns as bytearrays: numpy takes them as its own writable arrays
       (np.frombuffer, no copy) */
    PyObject *tiers = PyByteArray_FromStringAndSize(NULL, 8 * n), *sizes = PyByteArray_FromStringAndSize(NULL, 8 * n);
    PyObject *gens = PyByteArray_FromStringAndSize(NULL, 8 * n), *copies = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *reps = PyByteArray_FromStringAndSize(NULL, 8 * n);
    PyObject *out = NULL, *last_ns = NULL;
    PyObject *rest_obj = rest ? PyBytes_FromStringAndSize((const char *)rest, rest_len) : Py_NewRef(Py_None);
    PyMem_Free(rest);
    if (!seqs || !kinds || !nss || !keys || !tiers || !sizes || !gens || !copies || !reps || !rest_obj) goto done;
    int64_t *t = (int64_t *)PyByteArray_AS_STRING(tiers), *sz = (int64_t *)PyByteArray_AS_STRING(sizes);
    uint64_t *g = (uint64_t *)PyByteArray_AS_STRING(gens);
    int64_t *rp = (int64_t *)PyByteArray_AS_STRING(reps);
    char *cp = PyByteArray_AS_STRING(copies);
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
    /* what membership.report_events checks of every batch: seqs consecutive, (namespace, key)
       pairs distinct (an open-addressing set of event indexes, at most half full) */
    int consecutive = 1, distinct = 1;
    for (i = 1; i < n && consecutive; i++) consecutive = evs[i].seq == evs[i - 1].seq + 1;
    if (n > 1) {
        size_t cap = 4;
        while (cap < 2 * (size_t)n) cap <<= 1;
        Py_ssize_t *set = PyMem_Malloc(cap * sizeof(Py_ssize_t));
        if (!set) {
            PyErr_NoMemory();
            goto done;
        }
        for (size_t j = 0; j < cap; j++) set[j] = -1;
        for (i = 0; i < n && distinct; i++) {
            const Event *e = &evs[i];
            uint64_t h = 1469598103934665603ULL; /* FNV-1a of the key, then the namespace */
            for (Py_ssize_t j = 0; j < e->key_len; j++) h = (h ^ e->key[j]) * 1099511628211ULL;
            h = (h ^ (uint64_t)e->key_len) * 1099511628211ULL;
            for (Py_ssize_t j = 0; j < e->ns_len; j++) h = (h ^ e->ns[j]) * 1099511628211ULL;
            size_t pos = (size_t)(h ^ (h >> 29)) & (cap - 1);
            for (;;) {
                Py_ssize_t o = set[pos];
                if (o < 0) {
                    set[pos] = i;
                    break;
                }
                const Event *f = &evs[o];
                if (f->key_len == e->key_len && f->ns_len == e->ns_len &&
                    (e->key_len == 0 || memcmp(f->key, e->key, (size_t)e->key_len) == 0) &&
                    (e->ns_len == 0 || memcmp(f->ns, e->ns, (size_t)e->ns_len) == 0)) {
                    distinct = 0;
                    break;
                }
                pos = (pos + 1) & (cap - 1);
            }
        }
        PyMem_Free(set);
    }
    int clean = 1; /* every value within what the checks of service.py accept */
    for (i = 0; i < n && clean; i++) {
        Event *e = &evs[i];
        clean = e->key_len >= 1 && e->key_len <= max_key && (e->kind == kind_a || e->kind == kind_b) &&
                (e->tier == tier_a || e->tier == tier_b) && !(e->gen >> 63) && e->replicas <= max_replicas;
    }
    out = Py_BuildValue("(OOOOOOOOOOOOO)", seqs, kinds, nss, keys, tiers, sizes, gens, copies, reps,
                        clean ? Py_True : Py_False, consecutive ? Py_True : Py_False,
                        distinct ? Py_True : Py_False, rest_obj);
done:
    Py_XDECREF(seqs); Py_XDECREF(kinds); Py_XDECREF(nss); Py_XDECREF(keys); Py_XDECREF(tiers);
    Py_XDECREF(sizes); Py_XDECREF(gens); Py_XDECREF(copies); Py_XDECREF(reps); Py_XDECREF(rest_obj);
    PyMem_Free(evs);
    PyBuffer_Release(&view);
    return out;
not_canonical:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* ---- apply_events: a ReportEvents run applied in one call -------------------------------- */

/* A key table's buckets (kvstored/master/keytable.py KeyTable), probed and changed in place. */
typedef struct {
    MbBucket *bk;
    int bits;
    uint64_t mask;
} KT;

static void kt_probe(const KT *t, uint64_t lo, uint64_t hi, int64_t *pos, int64_t *slot) {
    *slot = mb_kt_probe(t->bk, t->bits, lo, hi, pos);
}

/* Entry ``pos`` (bucket * MB_BUCKET_WAYS + way, from kt_probe) freed. */
static void kt_free(KT *t, int64_t pos) { t->bk[pos / MB_BUCKET_WAYS].sl[pos % MB_BUCKET_WAYS] = -1; }

/* KeyTable.insert_words: the first free entry from the key's home bucket on. */
static void kt_insert(KT *t, uint64_t lo, uint64_t hi, int32_t slot) {
    uint64_t bk = mb_home(lo, t->bits);
    for (;;) {
        MbBucket *e = t->bk + bk;
        for (int w = 0; w < MB_BUCKET_WAYS; w++) {
            if (e->sl[w] < 0) {
                e->lo[w] = lo;
                e->hi[w] = hi;
                e->sl[w] = slot;
                return;
            }
        }
        e->over = 1;
        bk = (bk + 1) & t->mask;
    }
}

/* A Python list of ints used as a stack (IndexColumns.free_rows / free_blocks). */
static int64_t list_pop(PyObject *l) {
    Py_ssize_t n = PyList_GET_SIZE(l);
    int64_t v = PyLong_AsLongLong(PyList_GET_ITEM(l, n - 1));
    if (v == -1 && PyErr_Occurred()) return -2;
    if (PyList_SetSlice(l, n - 1, n, NULL) != 0) return -2;
    return v;
}

static int list_push(PyObject *l, int64_t v) {
    PyObject *o = PyLong_FromLongLong(v);
    if (!o) return -1;
    int rc = PyList_Append(l, o);
    Py_DECREF(o);
    return rc;
}

/* The index's columns and the Python objects apply_events keeps in step with them. */
typedef struct {
    int32_t *head, *next, *block, *hnext, *hprev;
    uint16_t *block_ns;
    uint64_t *bkey, *gen;
    uint8_t *factor, *tier, *state;
    uint32_t *holder, *size;
    const uint8_t *readable, *retired;
    int64_t *holder_rows, *holder_head;
    Py_ssize_t n_head, n_rows, n_holders;
    HotObj *hot;
    PyObject *free_rows, *free_blocks, *recent, *long_keys;
    int64_t num_rows_used, num_slots, max_recent, live_delta;
    int hot_rows, ns;
    KT kt;
} Ix;

/* IndexColumns.find_rows for one slot: the row of (holder, tier) or -1; -2 on an error.
 * With want_prev, *prev gets its predecessor in the chain; *is_hot whether the chain has
 * maps (a chain walked past hot_rows rows gets them here: IndexColumns.make_hot). */
static int64_t find_row(Ix *x, int64_t slot, int64_t holder, int64_t t, int want_prev, int64_t *prev,
                        int64_t *is_hot) {
    *prev = -1;
    *is_hot = ht_count(x->hot, slot) >= 0;
    if (!*is_hot) {
        int depth = 0;
        int64_t p = -1;
        for (int64_t r = x->head[slot]; r >= 0;) {
            if ((int64_t)x->holder[r] == holder && (int64_t)x->tier[r] == t) {
                *prev = p;
                return r;
            }
            p = r;
            r = x->next[r];
            if (++depth > x->hot_rows && r >= 0) { /* a long chain: hot from now on */
                if (ht_make(x->hot, slot, x->head, x->next, x->holder, x->tier, x->n_rows) != 0) return -2;
                *is_hot = 1;
                break;
            }
        }
        if (!*is_hot) return -1;
    }
    return ht_find(x->hot, slot, holder * 4 + t, want_prev ? prev : NULL);
}

/* IndexColumns._free_block: the slot leaves its key table (its factor kept when > 1). */
static int free_block(Ix *x, int64_t slot) {
    uint64_t lo = x->bkey[2 * slot], hi = x->bkey[2 * slot + 1];
    if (x->factor[slot] > 1 || PyDict_GET_SIZE(x->long_keys)) {
        char kb[16];
        memcpy(kb, &x->bkey[2 * slot], 16);
        PyObject *k = Py_BuildValue("(iy#)", x->ns, kb, (Py_ssize_t)16);
        if (!k) return -1;
        int rc = 0;
        if (x->factor[slot] > 1) {
            if (PyDict_GET_SIZE(x->recent) >= x->max_recent) {
                Py_ssize_t pos = 0;
                PyObject *first, *v;
                if (PyDict_Next(x->recent, &pos, &first, &v)) {
                    Py_INCREF(first);
                    rc = PyDict_DelItem(x->recent, first);
                    Py_DECREF(first);
                }
            }
            PyObject *f = PyLong_FromLong(x->factor[slot]);
            rc = rc || !f || PyDict_SetItem(x->recent, k, f);
            Py_XDECREF(f);
        }
        if (rc == 0 && PyDict_GET_SIZE(x->long_keys)) {
            PyObject *got = PyDict_GetItemWithError(x->long_keys, k);
            if (got) rc = PyDict_DelItem(x->long_keys, k);
            else if (PyErr_Occurred()) rc = -1;
        }
        Py_DECREF(k);
        if (rc) return -1;
    }
    int64_t pos, s;
    kt_probe(&x->kt, lo, hi, &pos, &s);
    if (pos < 0 || s != slot) {
        PyErr_Format(PyExc_RuntimeError, "apply_events: block slot %lld is not in its key table", (long long)slot);
        return -1;
    }
    kt_free(&x->kt, pos);
    x->live_delta--;
    return list_push(x->free_blocks, slot);
}

/* IndexColumns.unlink: row (after prev in its block's chain) out of its holder's list and
 * its chain, freed; a block left without rows freed too. */
static int unlink_row(Ix *x, int64_t slot, int64_t row, int64_t prev, int64_t is_hot) {
    int32_t hn = x->hnext[row], hp = x->hprev[row];
    if (hp < 0)
        x->holder_head[x->holder[row]] = hn;
    else
        x->hnext[hp] = hn;
    if (hn >= 0) x->hprev[hn] = hp;
    x->hnext[row] = x->hprev[row] = -1;
    int32_t nx = x->next[row];
    if (prev < 0)
        x->head[slot] = nx;
    else
        x->next[prev] = nx;
    if (is_hot) { /* HotChain.remove, then the chain's maps go when it is empty or short again */
        int64_t left = ht_remove(x->hot, slot, row, nx, (int64_t)x->holder[row] * 4 + x->tier[row]);
        if (left < 0) return -1;
        if ((nx < 0 && prev < 0) || left < x->hot_rows / 2) ht_drop(x->hot, slot, x->head, x->next, x->holder, x->tier);
    }
    x->state[row] = 0;
    x->next[row] = -1;
    x->block[row] = -1;
    if (list_push(x->free_rows, row) != 0) return -1;
    if (nx < 0 && prev < 0) return free_block(x, slot);
    return 0;
}

#define GET_ATTR_BUF(obj, name, isz, fmt, wr, dst, cnt)                                            \
    do {                                                                                           \
        PyObject *a_ = PyObject_GetAttrString(obj, name);                                          \
        if (!a_) goto fail;                                                                        \
        void *p_ = take(&b, a_, isz, fmt, wr, fn, name, cnt);                                      \
        Py_DECREF(a_); /* the buffer view keeps the array alive */                                 \
        if (!p_) goto fail_released;                                                               \
        dst = p_;                                                                                  \
    } while (0)

/* apply_events(cols, table, ns, holder, idx, kinds, keys, tiers, sizes, gens, copies, reps,
 *              gen_next, codes, consts) -> tuple | None
 * Membership._apply_run for one namespace group in one call: events idx (int64, in order)
 * of a ReportEvents batch's columns (kinds and keys lists; tiers, sizes int64, gens u64,
 * copies bool, reps int64 arrays, one per event) applied to ``holder``'s rows in namespace
 * ``ns`` of ``cols`` (an IndexColumns) and its key ``table``, with the outcome of the
 * fallback's BlockIndex.add_replicas_batch of the ADDED events, then
 * remove_replicas_batch of the REMOVED ones, then copy_holders_to_promote of the blocks
 * that lost a row: same rows, chains, holder lists, hot maps (cols.hot, a HotChains),
 * free lists, key tables, recent factors. An ADDED event with generation 0 takes gen_next,
 * gen_next + 1, ... in order. codes (writable int8, one per idx entry) gets the fallback's codes:
 * ADDED 1 a row added, 2 an uncommitted row committed, 0 already indexed; REMOVED 0 not
 * indexed, 1 an uncommitted row dropped, 2 a COMMITTED row dropped. consts = (ADDED, REMOVED, COMMITTED, STATE_MASK, COPY_BIT,
 * MAX_SIZE_BYTES, MAX_REPLICAS, HOT_CHAIN_ROWS, MAX_RECENT_FACTORS).
 * Returns (fresh rows taken, fresh slots taken, generations taken, key-table live delta,
 * [(event, holder) to promote]); None, with nothing changed, when the run is not one this
 * reads (a key not of 16 bytes, a kind, tier, size or factor out of range, a retired
 * holder, a key table or columns too full for the ADDED events): run the fallback. */
static PyObject *apply_events(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_cols, *o_table, *o_idx, *kinds, *keys, *o_tiers, *o_sizes, *o_gens, *o_copies, *o_reps,
        *o_codes;
    int ns;
    long long holder, gen_next, k_add, k_rem, committed, state_mask, copy_bit, max_size, max_reps, hot_rows, max_recent;
    if (!PyArg_ParseTuple(args, "OOiLOO!O!OOOOOLO(LLLLLLLLL):apply_events", &o_cols, &o_table, &ns, &holder,
                          &o_idx, &PyList_Type, &kinds, &PyList_Type, &keys, &o_tiers, &o_sizes, &o_gens, &o_copies,
                          &o_reps, &gen_next, &o_codes, &k_add, &k_rem, &committed, &state_mask, &copy_bit, &max_size,
                          &max_reps, &hot_rows, &max_recent))
        return NULL;
    const char *fn = "apply_events";
    Bufs b = {.n = 0};
    Ix x;
    memset(&x, 0, sizeof x);
    x.ns = ns;
    x.hot_rows = (int)hot_rows;
    x.max_recent = max_recent;
    PyObject *promote = NULL, *out = NULL;
    int64_t *evs = NULL; /* per event of idx: its slot, then its row (or -1) */
    Py_ssize_t cnt, n_bkey, n_factor, n_bns, c2;
    GET_ATTR_BUF(o_cols, "head", 4, I32, 1, x.head, &x.n_head);
    GET_ATTR_BUF(o_cols, "block_ns", 2, "H", 1, x.block_ns, &n_bns);
    GET_ATTR_BUF(o_cols, "bkey", 8, U64, 1, x.bkey, &n_bkey);
    GET_ATTR_BUF(o_cols, "factor", 1, U8, 1, x.factor, &n_factor);
    GET_ATTR_BUF(o_cols, "next", 4, I32, 1, x.next, &x.n_rows);
    GET_ATTR_BUF(o_cols, "holder", 4, U32, 1, x.holder, &cnt);
    if (cnt != x.n_rows) goto sizes;
    GET_ATTR_BUF(o_cols, "block", 4, I32, 1, x.block, &cnt);
    if (cnt != x.n_rows) goto sizes;
    GET_ATTR_BUF(o_cols, "size", 4, U32, 1, x.size, &cnt);
    if (cnt != x.n_rows) goto sizes;
    GET_ATTR_BUF(o_cols, "gen", 8, U64, 1, x.gen, &cnt);
    if (cnt != x.n_rows) goto sizes;
    GET_ATTR_BUF(o_cols, "tier", 1, U8, 1, x.tier, &cnt);
    if (cnt != x.n_rows) goto sizes;
    GET_ATTR_BUF(o_cols, "state", 1, U8, 1, x.state, &cnt);
    if (cnt != x.n_rows) goto sizes;
    GET_ATTR_BUF(o_cols, "hnext", 4, I32, 1, x.hnext, &cnt);
    if (cnt != x.n_rows) goto sizes;
    GET_ATTR_BUF(o_cols, "hprev", 4, I32, 1, x.hprev, &cnt);
    if (cnt != x.n_rows) goto sizes;
    GET_ATTR_BUF(o_cols, "readable", 1, BOOL, 0, x.readable, &x.n_holders);
    GET_ATTR_BUF(o_cols, "retired", 1, BOOL, 0, x.retired, &cnt);
    if (cnt != x.n_holders) goto sizes;
    GET_ATTR_BUF(o_cols, "holder_rows", 8, I64, 1, x.holder_rows, &cnt);
    if (cnt != x.n_holders) goto sizes;
    GET_ATTR_BUF(o_cols, "holder_head", 8, I64, 1, x.holder_head, &cnt);
    if (cnt != x.n_holders) goto sizes;
    if (n_bns != x.n_head || n_factor != x.n_head || n_bkey != 2 * x.n_head) goto sizes;
    Py_ssize_t n_bk;
    GET_ATTR_BUF(o_table, "_buckets", 1, U8, 1, x.kt.bk, &n_bk);
    {
        PyObject *a = PyObject_GetAttrString(o_table, "_bits");
        long bits = a ? PyLong_AsLong(a) : -1;
        Py_XDECREF(a);
        if (PyErr_Occurred()) goto fail;
        if (mb_check_buckets(x.kt.bk, n_bk, (int)bits, fn) != 0) goto fail;
        x.kt.bits = (int)bits;
        x.kt.mask = ((uint64_t)1 << bits) - 1;
    }
    Py_ssize_t n_entries = n_bk / (Py_ssize_t)sizeof(MbBucket) * MB_BUCKET_WAYS;
    Py_ssize_t n_idx, n_ev;
    const int64_t *idx, *tiers, *sizes, *reps;
    const uint64_t *gens;
    const uint8_t *copies;
    idx = take(&b, o_idx, 8, I64, 0, fn, "idx", &n_idx);
    if (!idx) goto fail_released;
    tiers = take(&b, o_tiers, 8, I64, 0, fn, "tiers", &n_ev);
    if (!tiers) goto fail_released;
    sizes = take(&b, o_sizes, 8, I64, 0, fn, "sizes", &cnt);
    if (!sizes) goto fail_released;
    if (cnt != n_ev) goto sizes;
    gens = take(&b, o_gens, 8, U64, 0, fn, "gens", &cnt);
    if (!gens) goto fail_released;
    if (cnt != n_ev) goto sizes;
    copies = take(&b, o_copies, 1, BOOL, 0, fn, "copies", &cnt);
    if (!copies) goto fail_released;
    if (cnt != n_ev) goto sizes;
    reps = take(&b, o_reps, 8, I64, 0, fn, "reps", &c2);
    if (!reps) goto fail_released;
    if (c2 != n_ev || PyList_GET_SIZE(kinds) != n_ev || PyList_GET_SIZE(keys) != n_ev) goto sizes;
    int8_t *codes = take(&b, o_codes, 1, "b", 1, fn, "codes", &c2);
    if (!codes) goto fail_released;
    if (c2 != n_idx) goto sizes;
    memset(codes, 0, (size_t)n_idx);
    {
        PyObject *l;
#define GET_OBJ(name, dst, check)                                                                  \
        l = PyObject_GetAttrString(o_cols, name);                                                  \
        if (!l) goto fail;                                                                         \
        dst = l;                                                                                   \
        Py_DECREF(l); /* borrowed from cols for the call */
        GET_OBJ("hot", l, 1);
        if (!PyObject_TypeCheck(l, &HotChainsType)) goto not_mine; /* PyHotChains: the fallback's */
        x.hot = (HotObj *)l;
        GET_OBJ("free_rows", x.free_rows, 1);
        GET_OBJ("free_blocks", x.free_blocks, 1);
        GET_OBJ("recent_factors", x.recent, 1);
        GET_OBJ("long_keys", x.long_keys, 1);
#undef GET_OBJ
        if (!PyList_Check(x.free_rows) || !PyList_Check(x.free_blocks) ||
            !PyDict_Check(x.recent) || !PyDict_Check(x.long_keys)) {
            PyErr_Format(PyExc_TypeError, "%s: cols has hot, free lists or factor maps of the wrong type", fn);
            goto fail;
        }
        PyObject *a = PyObject_GetAttrString(o_cols, "num_rows_used");
        x.num_rows_used = a ? PyLong_AsLongLong(a) : -1;
        Py_XDECREF(a);
        a = PyObject_GetAttrString(o_cols, "num_slots");
        x.num_slots = a ? PyLong_AsLongLong(a) : -1;
        Py_XDECREF(a);
        if (PyErr_Occurred()) goto fail;
    }
    /* ---- checks: nothing changes before they pass ---- */
    if (holder < 0 || holder >= x.n_holders || x.retired[holder] || ns < 0 || ns > 0xFFFF) goto not_mine;
    Py_ssize_t n_add = 0;
    for (Py_ssize_t i = 0; i < n_idx; i++) {
        int64_t e = idx[i];
        if (e < 0 || e >= n_ev) goto not_mine;
        long k = PyLong_AsLong(PyList_GET_ITEM(kinds, e));
        if (k == -1 && PyErr_Occurred()) goto fail;
        PyObject *key = PyList_GET_ITEM(keys, e);
        if ((k != k_add && k != k_rem) || !PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) != 16) goto not_mine;
        if (tiers[e] != 1 && tiers[e] != 2) goto not_mine;
        if (k == k_add) {
            if (sizes[e] < 0 || sizes[e] > max_size || reps[e] < 0 || reps[e] > max_reps || (gens[e] >> 63))
                goto not_mine;
            n_add++;
        }
        { /* the key's home bucket, fetched ahead: the probes below then overlap their misses */
            const uint64_t *w = (const uint64_t *)PyBytes_AS_STRING(key);
            mb_prefetch_bucket(x.kt.bk, mb_home(w[0], x.kt.bits));
        }
    }
    if ((Py_ssize_t)PyList_GET_SIZE(x.free_rows) + (x.n_rows - x.num_rows_used) < n_add ||
        (Py_ssize_t)PyList_GET_SIZE(x.free_blocks) + (x.n_head - x.num_slots) < n_add)
        goto not_mine;
    evs = PyMem_Calloc((size_t)(5 * n_idx + 1), sizeof(int64_t));
    if (!evs) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t *ev_slot = evs, *ev_row = evs + n_idx, *ev_kind = evs + 2 * n_idx, *ev_prev = evs + 3 * n_idx;
    int64_t *ev_hot = evs + 4 * n_idx; /* whether the event's block has maps */
    for (Py_ssize_t i = 0; i < n_idx; i++) ev_kind[i] = PyLong_AsLong(PyList_GET_ITEM(kinds, idx[i])); /* checked */
    Py_ssize_t n_absent = 0;
    for (Py_ssize_t i = 0; i < n_idx; i++) {
        int64_t e = idx[i], pos;
        const uint64_t *w = (const uint64_t *)PyBytes_AS_STRING(PyList_GET_ITEM(keys, e));
        if (ev_kind[i] != k_add) continue;
        kt_probe(&x.kt, w[0], w[1], &pos, &ev_slot[i]);
        n_absent += ev_slot[i] < 0;
        if (ev_slot[i] >= 0) __builtin_prefetch(&x.head[ev_slot[i]]);
    }
    { /* the table's live entries, counted as KeyTable does */
        PyObject *a = PyObject_GetAttrString(o_table, "_num_live");
        long long live = a ? PyLong_AsLongLong(a) : -1;
        Py_XDECREF(a);
        if (PyErr_Occurred()) goto fail;
        if (2 * (live + n_absent) > (long long)n_entries) goto not_mine; /* KeyTable.has_room */
    }
    /* ---- ADDED: new blocks, factors, existing rows, new rows ---- */
    int64_t gens_taken = 0, fresh_rows = 0, fresh_slots = 0;
    Py_ssize_t n_new = 0;
    int use_recent = PyDict_GET_SIZE(x.recent) > 0;
    for (Py_ssize_t i = 0; i < n_idx; i++) {
        int64_t e = idx[i];
        if (ev_kind[i] != k_add || ev_slot[i] >= 0) continue;
        int64_t s;
        if (PyList_GET_SIZE(x.free_blocks)) {
            s = list_pop(x.free_blocks);
            if (s < 0) goto fail;
        } else {
            s = x.num_slots++;
            fresh_slots++;
        }
        PyObject *key = PyList_GET_ITEM(keys, e);
        const uint64_t *w = (const uint64_t *)PyBytes_AS_STRING(key);
        x.head[s] = -1;
        x.block_ns[s] = (uint16_t)ns;
        x.factor[s] = 0;
        x.bkey[2 * s] = w[0];
        x.bkey[2 * s + 1] = w[1];
        if (use_recent) {
            PyObject *k = Py_BuildValue("(iO)", ns, key);
            if (!k) goto fail;
            PyObject *f = PyDict_GetItemWithError(x.recent, k);
            if (f) {
                x.factor[s] = (uint8_t)PyLong_AsLong(f);
                if (PyDict_DelItem(x.recent, k) != 0) {
                    Py_DECREF(k);
                    goto fail;
                }
            }
            Py_DECREF(k);
            if (PyErr_Occurred()) goto fail;
        }
        kt_insert(&x.kt, w[0], w[1], (int32_t)s);
        x.live_delta++;
        ev_slot[i] = s;
        ev_row[i] = -1;
    }
    for (Py_ssize_t i = 0; i < n_idx; i++) { /* factors (raise-only), then present blocks' rows */
        int64_t e = idx[i];
        if (ev_kind[i] != k_add) continue;
        if (reps[e] > x.factor[ev_slot[i]]) x.factor[ev_slot[i]] = (uint8_t)reps[e];
        ht_prefetch(x.hot, ev_slot[i], holder * 4 + tiers[e], x.head[ev_slot[i]]); /* overlaps the misses */
    }
    for (Py_ssize_t i = 0; i < n_idx; i++) {
        int64_t e = idx[i];
        if (ev_kind[i] != k_add) continue;
        uint64_t g = gens[e];
        if (g == 0) {
            g = (uint64_t)(gen_next + gens_taken);
            gens_taken++;
        }
        ev_row[i] = -1;
        int64_t s = ev_slot[i];
        int64_t pv, hot0;
        int64_t r = x.head[s] >= 0 ? find_row(&x, s, holder, tiers[e], 0, &pv, &hot0) : -1;
        if (r == -2) goto fail;
        uint8_t st_new = (uint8_t)(copies[e] ? (committed | copy_bit) : committed);
        if (r >= 0) {
            if ((x.state[r] & state_mask) != committed) codes[i] = 2;
            if ((x.state[r] & state_mask) != committed || gens[e] != 0) {
                x.state[r] = st_new;
                x.size[r] = (uint32_t)sizes[e];
                x.gen[r] = g;
            }
            ev_row[i] = -3; /* an existing row */
            continue;
        }
        ev_row[i] = (int64_t)g; /* (reused below: the generation of a new row) */
        n_new++;
    }
    if (n_new) {
        int64_t first = -1, last = -1;
        for (Py_ssize_t i = 0; i < n_idx; i++) {
            int64_t e = idx[i];
            if (ev_kind[i] != k_add || ev_row[i] == -3) continue;
            int64_t s = ev_slot[i], r;
            if (PyList_GET_SIZE(x.free_rows)) {
                r = list_pop(x.free_rows);
                if (r < 0) goto fail;
            } else {
                r = x.num_rows_used++;
                fresh_rows++;
            }
            x.holder[r] = (uint32_t)holder;
            x.tier[r] = (uint8_t)tiers[e];
            x.state[r] = (uint8_t)(copies[e] ? (committed | copy_bit) : committed);
            x.size[r] = (uint32_t)sizes[e];
            x.gen[r] = (uint64_t)ev_row[i];
            codes[i] = 1;
            int32_t old = x.head[s];
            x.block[r] = (int32_t)s;
            x.next[r] = old;
            x.head[s] = (int32_t)r;
            if (ht_count(x.hot, s) >= 0 && ht_add_head(x.hot, s, r, old, holder * 4 + tiers[e]) != 0) goto fail;
            /* the holder's list: new rows in event order, before its old rows */
            x.hprev[r] = (int32_t)last;
            x.hnext[r] = -1;
            if (last >= 0)
                x.hnext[last] = (int32_t)r;
            else
                first = r;
            last = r;
        }
        int64_t old = x.holder_head[holder];
        x.hnext[last] = (int32_t)old;
        if (old >= 0) x.hprev[old] = (int32_t)last;
        x.holder_head[holder] = first;
        x.holder_rows[holder] += n_new;
    }
    /* ---- REMOVED: find every row first (long chains become hot), then unlink: rows of
     * chains without hot maps first, then those of hot chains (IndexColumns.unlink_many) ---- */
    Py_ssize_t n_gone = 0;
    for (Py_ssize_t i = 0; i < n_idx; i++) {
        int64_t e = idx[i], pos;
        ev_slot[i] = ev_row[i] = -1;
        ev_hot[i] = 0;
        if (ev_kind[i] != k_rem) continue;
        const uint64_t *w = (const uint64_t *)PyBytes_AS_STRING(PyList_GET_ITEM(keys, e));
        kt_probe(&x.kt, w[0], w[1], &pos, &ev_slot[i]);
        if (ev_slot[i] >= 0) __builtin_prefetch(&x.head[ev_slot[i]]);
    }
    for (Py_ssize_t i = 0; i < n_idx; i++) /* hot slots' map entries fetched ahead too */
        if (ev_kind[i] == k_rem && ev_slot[i] >= 0) ht_prefetch(x.hot, ev_slot[i], holder * 4 + tiers[idx[i]], -1);
    for (Py_ssize_t i = 0; i < n_idx; i++) { /* (a second pass: the heads fetched meanwhile) */
        int64_t e = idx[i];
        if (ev_kind[i] != k_rem || ev_slot[i] < 0) continue;
        ev_row[i] = find_row(&x, ev_slot[i], holder, tiers[e], 1, &ev_prev[i], &ev_hot[i]);
        if (ev_row[i] == -2) goto fail;
        if (ev_row[i] >= 0) codes[i] = (x.state[ev_row[i]] & state_mask) == committed ? 2 : 1;
        n_gone += ev_row[i] >= 0;
    }
    /* unlinked in IndexColumns.unlink_many's order: rows of chains without hot maps first
     * (as the chains are after the finds), then those of hot chains; a run's blocks are
     * distinct, so each row's predecessor found above is still its predecessor */
    x.holder_rows[holder] -= n_gone;
    for (int pass = 0; pass < 2 && n_gone; pass++) {
        for (Py_ssize_t i = 0; i < n_idx; i++) {
            if (ev_row[i] < 0 || (ev_hot[i] != 0) != pass) continue;
            if (unlink_row(&x, ev_slot[i], ev_row[i], ev_prev[i], ev_hot[i]) != 0) goto fail;
        }
    }
    /* ---- copies to promote: blocks that lost a row and keep only committed copies ---- */
    promote = PyList_New(0);
    if (!promote) goto fail;
    for (Py_ssize_t i = 0; i < n_idx; i++) {
        if (ev_row[i] < 0) continue;
        int64_t s = ev_slot[i], best = -1;
        int bad = 0;
        for (int64_t r = x.head[s]; r >= 0 && !bad; r = x.next[r]) {
            int64_t h = x.holder[r];
            if (x.retired[h]) continue;
            uint8_t st = x.state[r];
            if ((st & state_mask) != committed || !(st & copy_bit))
                bad = 1;
            else if (x.readable[h] && (best < 0 || h < best))
                best = h;
        }
        if (!bad && best >= 0) {
            PyObject *t = Py_BuildValue("(LL)", (long long)idx[i], (long long)best);
            if (!t || PyList_Append(promote, t) != 0) {
                Py_XDECREF(t);
                goto fail;
            }
            Py_DECREF(t);
        }
    }
    out = Py_BuildValue("(LLLLO)", (long long)fresh_rows, (long long)fresh_slots, (long long)gens_taken,
                        (long long)x.live_delta, promote);
fail:
    release_all(&b);
fail_released:
    PyMem_Free(evs);
    Py_XDECREF(promote);
    return out;
sizes:
    PyErr_Format(PyExc_ValueError, "%s: the columns' sizes disagree", fn);
    goto fail;
not_mine:
    release_all(&b);
    PyMem_Free(evs);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"keytable_get_many", keytable_get_many, METH_VARARGS,
     "keytable_get_many(buckets, bits, words, out) -> int: slots of a batch of keys (-1 absent); "
     "returns the leading count found."},
    {"best_rows", best_rows, METH_VARARGS,
     "best_rows(head, next, holder, state, tier, readable, load, slots, local_holder, out_rows, out_holders, "
     "committed, state_mask, copy_bit, ssd, rank_score, load_clip, max_ranked): the ranking walk."},
    {"find_rows", find_rows, METH_VARARGS,
     "find_rows(head, next, holder, tier, slots, holder_id, tiers, hot, max_depth, out) -> int: a holder's row "
     "per chain (-1 none; a chain longer than max_depth gets hot maps); returns the count of chains made hot."},
    {"unlink_rows", unlink_rows, METH_VARARGS,
     "unlink_rows(head, next, block, holder, tier, state, hnext, hprev, holder_head, hot, hot_rows, rows, emptied) "
     "-> int: unlink rows (hot chains' through their maps); returns the count of blocks emptied."},
    {"parse_events", parse_events, METH_VARARGS,
     "parse_events(data, ...[, field]) -> tuple | None: a serialized ReportEventsRequest's (or, field 7, "
     "HeartbeatRequest's) events as columns (None: not in "
     "the canonical form; read the message)."},
    {"apply_events", apply_events, METH_VARARGS,
     "apply_events(cols, table, ns, holder, idx, kinds, keys, tiers, sizes, gens, copies, reps, gen_next, "
     "codes, consts) -> tuple | None: a ReportEvents run applied to the index (None: not applied, run the fallback)."},
    MASTER_LOOKUP_METHODS
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvstored._native_master",
    "The master block index's hot loops (see native/README.md and kvstored/native.py).", -1, methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native_master(void) {
    if (PyType_Ready(&HotChainsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&HotChainsType);
    if (PyModule_AddObject(m, "HotChains", (PyObject *)&HotChainsType) < 0) {
        Py_DECREF(&HotChainsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
