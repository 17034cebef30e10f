/* The master's lookups in C: part of kvstored._native_master (module and method table in
 * native/master.c; see native/README.md).
 *
 *   ranked_rows   ranking.ranked_rows: each block's readable replicas on distinct holders,
 *                 best first (a read's alternates; avoided holders last)
 *   lookup_wire   MasterService.LookupPrefix from request bytes to the response's columns:
 *                 the keys read from the serialized request, probed in the key table, each
 *                 block ranked (best_rows' walk, or ranked_rows' when alternates or avoided
 *                 holders are asked), the distinct holders numbered, and the response's
 *                 packed repeated fields written as protobuf wire bytes; the keys taken 32
 *                 at a time, each group's buckets, head entries and rows prefetched stage by
 *                 stage (group prefetching: master_buffers.h)
 *
 * Both read the numpy columns' own buffers (no copy) and follow the numpy code of
 * kvstored/master/ranking.py and index.py step by step: the same scores, the same order
 * (score, then the lowest holder, then the newest row), the same stopping rules; that code is
 * the fallback and the reference a test compares against (tests/unit/master/test_master_native.py).
 * Not thread-safe (the master's event loop only); the GIL is held (calls are short).
 */
#include "master_lookup.h"

#include <math.h>
#include <stdlib.h>

#include "master_buffers.h"

#define LK_MAX_RANKED 8  /* ranking.MAX_RANKED_REPLICAS: the most levels ranked_rows reads */
#define LK_KEY_BYTES 16
#define LK_GROUP MB_PREFETCH_GROUP /* keys per stage of the group prefetching (lookup_wire) */

/* The index's columns and one lookup's ranking parameters. */
typedef struct {
    const int32_t *head, *next;
    const uint32_t *holder, *size;
    const uint8_t *state, *tier, *readable;
    const double *load;
    const uint64_t *gen;
    Py_ssize_t n_head, n_rows, n_holders;
    const int64_t *avoid;
    Py_ssize_t n_avoid;
    int64_t local;
    int committed, state_mask, copy_bit, ssd, max_ranked;
    double rank_score, load_clip, avoid_score;
    const char *bad; /* set when the columns are inconsistent (then bad_value says what) */
    long long bad_value;
} Cols;

/* cols: (head, next, holder, state, tier, readable, load, size, gen); consts: (committed,
 * state_mask, copy_bit, ssd, rank_score, load_clip, avoid_score, max_ranked). */
static int take_cols(MBufs *b, PyObject *cols, PyObject *consts, const char *fn, Cols *c) {
    memset(c, 0, sizeof(*c));
    if (!PyTuple_Check(cols) || PyTuple_GET_SIZE(cols) != 9) {
        mb_release(b);
        PyErr_Format(PyExc_ValueError, "%s: cols must be a tuple of 9 columns", fn);
        return -1;
    }
    if (!PyArg_ParseTuple(consts, "iiiidddi", &c->committed, &c->state_mask, &c->copy_bit, &c->ssd, &c->rank_score,
                          &c->load_clip, &c->avoid_score, &c->max_ranked)) {
        mb_release(b);
        return -1;
    }
    Py_ssize_t n_head, n_next, n_holder, n_state, n_tier, n_read, n_load, n_size, n_gen;
    if (!(c->head = mb_take(b, PyTuple_GET_ITEM(cols, 0), 4, MB_I32, 0, fn, "head", &n_head))) return -1;
    if (!(c->next = mb_take(b, PyTuple_GET_ITEM(cols, 1), 4, MB_I32, 0, fn, "next", &n_next))) return -1;
    if (!(c->holder = mb_take(b, PyTuple_GET_ITEM(cols, 2), 4, MB_U32, 0, fn, "holder", &n_holder))) return -1;
    if (!(c->state = mb_take(b, PyTuple_GET_ITEM(cols, 3), 1, MB_U8, 0, fn, "state", &n_state))) return -1;
    if (!(c->tier = mb_take(b, PyTuple_GET_ITEM(cols, 4), 1, MB_U8, 0, fn, "tier", &n_tier))) return -1;
    if (!(c->readable = mb_take(b, PyTuple_GET_ITEM(cols, 5), 1, MB_BOOL, 0, fn, "readable", &n_read))) return -1;
    if (!(c->load = mb_take(b, PyTuple_GET_ITEM(cols, 6), 8, MB_F64, 0, fn, "load", &n_load))) return -1;
    if (!(c->size = mb_take(b, PyTuple_GET_ITEM(cols, 7), 4, MB_U32, 0, fn, "size", &n_size))) return -1;
    if (!(c->gen = mb_take(b, PyTuple_GET_ITEM(cols, 8), 8, MB_U64, 0, fn, "gen", &n_gen))) return -1;
    if (n_holder != n_next || n_state != n_next || n_tier != n_next || n_size != n_next || n_gen != n_next ||
        n_load != n_read) {
        mb_release(b);
        PyErr_Format(PyExc_ValueError,
                     "%s: sizes disagree: row columns next %zd, holder %zd, state %zd, tier %zd, size %zd, gen %zd; "
                     "holder columns readable %zd, load %zd",
                     fn, n_next, n_holder, n_state, n_tier, n_size, n_gen, n_read, n_load);
        return -1;
    }
    if (c->max_ranked < 1 || c->max_ranked > LK_MAX_RANKED) {
        mb_release(b);
        PyErr_Format(PyExc_ValueError, "%s: max_ranked must be in 1..%d, got %d", fn, LK_MAX_RANKED, c->max_ranked);
        return -1;
    }
    c->n_head = n_head;
    c->n_rows = n_next;
    c->n_holders = n_read;
    return 0;
}

/* One row's score (score_rows of ranking.py): sets *ok (readable COMMITTED) and *h; 0, or -1
 * with c->bad set when the row or its holder lies outside the columns. */
static int score_row(Cols *c, int64_t r, int *ok, int64_t *h, double *score) {
    if (r >= c->n_rows) {
        c->bad = "a row outside the row columns";
        c->bad_value = r;
        return -1;
    }
    *h = c->holder[r];
    if (*h >= c->n_holders) {
        c->bad = "a holder outside the holder columns";
        c->bad_value = *h;
        return -1;
    }
    uint8_t st = c->state[r];
    *ok = ((st & c->state_mask) == c->committed) && c->readable[*h];
    double rank = (*h == c->local ? 0.0 : 2.0) + (c->tier[r] == c->ssd ? 1.0 : 0.0) + 0.5 * (st >= c->copy_bit ? 1.0 : 0.0);
    double l = c->load[*h];
    *score = rank * c->rank_score + (isnan(l) ? l : (l < c->load_clip ? l : c->load_clip)); /* np.minimum */
    return 0;
}

static int check_slot(Cols *c, int64_t s) {
    if (s < 0 || s >= c->n_head) {
        c->bad = "a slot outside head";
        c->bad_value = s;
        return -1;
    }
    return 0;
}

/* The walk of ranking.py best_rows (and master.c best_rows) for one slot: the best row or -1,
 * *out_holder its holder (none readable: the first row's; no row at all: -1). */
static int64_t best_walk(Cols *c, int64_t s, int64_t *out_holder) {
    int64_t r = c->head[s], best_row = -1, best_holder = -1;
    double best_score = INFINITY;
    int level = 0;
    while (r >= 0) {
        int ok;
        int64_t h;
        double score;
        if (score_row(c, r, &ok, &h, &score) != 0) return -1;
        if (level == 0) {
            best_row = ok ? r : -1;
            best_score = ok ? score : INFINITY;
            best_holder = h;
        } else if (ok && (score < best_score || (score == best_score && h < best_holder))) {
            best_row = r;
            best_score = score;
            best_holder = h;
        }
        r = c->next[r];
        level++;
        if (!(best_score >= c->rank_score)) break; /* a local DRAM replica cannot be beaten */
        if (level >= 2 && level >= c->max_ranked && best_row >= 0) break;
    }
    *out_holder = best_holder;
    return best_row;
}

typedef struct {
    int64_t row, holder;
    double score;
    int level;
} Cand;

static int cand_before(const Cand *a, const Cand *b) { /* np.lexsort((holders, scores)): stable */
    if (a->score != b->score) return a->score < b->score;
    if (a->holder != b->holder) return a->holder < b->holder;
    return a->level < b->level;
}

/* ranked_rows of ranking.py for one slot: up to ``width`` rows (best first, distinct holders)
 * into rows[0..width) and holders[0..width), -1 padded. Returns how many are valid (0 with
 * rows[0] from best_walk when none of the first max_ranked rows is readable and the chain
 * goes on; -1 when the columns are inconsistent). */
static int rank_walk(Cols *c, int64_t s, int width, int64_t *rows, int64_t *holders) {
    Cand cand[LK_MAX_RANKED];
    int m = 0, level = 0;
    int64_t r = c->head[s];
    while (r >= 0 && level < c->max_ranked) {
        int ok;
        int64_t h;
        double score;
        if (score_row(c, r, &ok, &h, &score) != 0) return -1;
        if (ok) {
            for (Py_ssize_t a = 0; a < c->n_avoid; a++) {
                if (c->avoid[a] == h) {
                    score += c->avoid_score;
                    break;
                }
            }
            if (isfinite(score)) { /* np.isfinite: what numpy keeps valid */
                Cand x = {r, h, score, level};
                int j = m++;
                while (j > 0 && cand_before(&x, &cand[j - 1])) { /* insertion sort: at most 8 */
                    cand[j] = cand[j - 1];
                    j--;
                }
                cand[j] = x;
            }
        }
        r = c->next[r];
        level++;
    }
    int k = 0;
    for (int i = 0; i < m && k < width; i++) { /* a holder's second row (its other tier): no alternate */
        int dup = 0;
        for (int j = 0; j < i && !dup; j++) dup = cand[j].holder == cand[i].holder;
        if (dup) continue;
        rows[k] = cand[i].row;
        holders[k] = cand[i].holder;
        k++;
    }
    for (int i = k; i < width; i++) rows[i] = holders[i] = -1;
    if (k == 0 && r >= 0) { /* none readable among the first rows, more rows: best_rows walks on */
        int64_t h;
        int64_t best = best_walk(c, s, &h);
        if (c->bad) return -1;
        rows[0] = best;
        holders[0] = best >= 0 ? h : -1;
    }
    return k;
}

static PyObject *bad_columns(const char *fn, Cols *c) {
    PyErr_Format(PyExc_ValueError, "%s: the columns are inconsistent: %s (%lld)", fn, c->bad, c->bad_value);
    return NULL;
}

PyObject *lk_ranked_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_cols, *o_consts, *o_slots, *o_avoid, *o_rows, *o_holders;
    long long local;
    int width;
    if (!PyArg_ParseTuple(args, "O!O!OLOiOO:ranked_rows", &PyTuple_Type, &o_cols, &PyTuple_Type, &o_consts, &o_slots,
                          &local, &o_avoid, &width, &o_rows, &o_holders))
        return NULL;
    const char *fn = "ranked_rows";
    MBufs b = {.n = 0};
    Cols c;
    if (take_cols(&b, o_cols, o_consts, fn, &c) != 0) return NULL;
    c.local = local;
    Py_ssize_t n_slots, n_rows, n_holders;
    const int64_t *slots = mb_take(&b, o_slots, 8, MB_I64, 0, fn, "slots", &n_slots);
    if (!slots) return NULL;
    if (!(c.avoid = mb_take(&b, o_avoid, 8, MB_I64, 0, fn, "avoid", &c.n_avoid))) return NULL;
    int64_t *rows = mb_take(&b, o_rows, 8, MB_I64, 1, fn, "out_rows", &n_rows);
    if (!rows) return NULL;
    int64_t *holders = mb_take(&b, o_holders, 8, MB_I64, 1, fn, "out_holders", &n_holders);
    if (!holders) return NULL;
    if (width < 1 || width > c.max_ranked || n_rows != n_slots * width || n_holders != n_slots * width) {
        mb_release(&b);
        PyErr_Format(PyExc_ValueError, "%s: width must be in 1..%d (got %d) and the outputs hold %zd x width items "
                     "(got %zd and %zd)", fn, c.max_ranked, width, n_slots, n_rows, n_holders);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n_slots; i++) {
        if (check_slot(&c, slots[i]) != 0 || rank_walk(&c, slots[i], width, rows + i * width, holders + i * width) < 0)
            break;
    }
    mb_release(&b);
    if (c.bad) return bad_columns(fn, &c);
    Py_RETURN_NONE;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t index_of(const int64_t *uniq, Py_ssize_t n, int64_t h) { /* h is in uniq */
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (uniq[mid] < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (uint64_t)lo;
}

PyObject *lk_lookup_wire(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_table, *o_cols, *o_consts, *o_req, *o_avoid;
    PyObject *o_bk;
    int bits, alternates, every_key, use_ranked;
    long long local;
    if (!PyArg_ParseTuple(args, "O!O!O!OLOiii:lookup_wire", &PyTuple_Type, &o_table, &PyTuple_Type, &o_cols,
                          &PyTuple_Type, &o_consts, &o_req, &local, &o_avoid, &alternates, &use_ranked, &every_key))
        return NULL;
    if (!PyArg_ParseTuple(o_table, "Oi:lookup_wire table", &o_bk, &bits)) return NULL;
    const char *fn = "lookup_wire";
    if (bits < 1 || bits > 40) {
        PyErr_Format(PyExc_ValueError, "%s: bits must be in 1..40, got %d", fn, bits);
        return NULL;
    }
    MBufs b = {.n = 0};
    Cols c;
    if (take_cols(&b, o_cols, o_consts, fn, &c) != 0) return NULL;
    c.local = local;
    int width = 1 + alternates;
    if (alternates < 0 || width > c.max_ranked) {
        mb_release(&b);
        PyErr_Format(PyExc_ValueError, "%s: alternates must be in 0..%d, got %d", fn, c.max_ranked - 1, alternates);
        return NULL;
    }
    if (alternates > 0) use_ranked = 1;
    Py_ssize_t n_bk, n_req;
    const MbBucket *bk_t = mb_take(&b, o_bk, 1, MB_U8, 0, fn, "buckets", &n_bk);
    if (!bk_t) return NULL;
    if (!(c.avoid = mb_take(&b, o_avoid, 8, MB_I64, 0, fn, "avoid", &c.n_avoid))) return NULL;
    const uint8_t *req = mb_take(&b, o_req, 1, MB_U8 "bc", 0, fn, "request", &n_req);
    if (!req) return NULL;
    if (mb_check_buckets(bk_t, n_bk, bits, fn) != 0) {
        mb_release(&b);
        return NULL;
    }
    /* the keys (field 2 of MasterLookupPrefixRequest), each exactly 16 bytes, else None */
    Py_ssize_t n = 0;
    MbRd rd = {req, req + n_req};
    while (rd.p < rd.end) {
        uint64_t tag;
        if (mb_varint(&rd, &tag) != 0) goto not_fast;
        if (tag == ((2 << 3) | 2)) {
            uint64_t len;
            if (mb_varint(&rd, &len) != 0 || len != LK_KEY_BYTES || rd.end - rd.p < LK_KEY_BYTES) goto not_fast;
            rd.p += LK_KEY_BYTES;
            n++;
        } else if (mb_skip(&rd, (int)(tag & 7)) != 0) {
            goto not_fast;
        }
    }
    /* per answered block: best row, holder, position; alternates' rows and holders (width - 1
     * per block, -1 padded) */
    size_t cap = n ? (size_t)n : 1;
    int64_t *best = PyMem_Malloc(cap * sizeof(int64_t) * 3);
    int64_t *ranked = PyMem_Malloc(cap * (size_t)width * sizeof(int64_t) * 2);
    uint64_t *vals = PyMem_Malloc(cap * (size_t)width * sizeof(uint64_t));
    int64_t *uniq = PyMem_Malloc(cap * (size_t)width * sizeof(int64_t));
    uint8_t *wire = PyMem_Malloc(cap * (size_t)width * 50 + 200);
    uint64_t *words = PyMem_Malloc(cap * 2 * sizeof(uint64_t));
    PyObject *out = NULL;
    if (!best || !ranked || !vals || !uniq || !wire || !words) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *bholder = best + cap, *bpos = best + 2 * cap;
    int64_t *rrows = ranked, *rholders = ranked + cap * (size_t)width;
    Py_ssize_t k = 0, num_alt = 0;
    rd.p = req;
    Py_ssize_t nk = 0;
    while (rd.p < rd.end) { /* the keys' words, in order (the first pass checked the fields) */
        uint64_t tag = 0;
        mb_varint(&rd, &tag);
        if (tag != ((2 << 3) | 2)) {
            mb_skip(&rd, (int)(tag & 7));
            continue;
        }
        rd.p += 1; /* the length: 16 */
        memcpy(&words[2 * nk], rd.p, 8); /* little-endian words, as keys_to_words reads them (x86, arm64) */
        memcpy(&words[2 * nk + 1], rd.p + 8, 8);
        rd.p += LK_KEY_BYTES;
        nk++;
    }
    /* Group prefetching (master_buffers.h; Chen et al., ICDE 2004; MICA, NSDI 2014): a group of
     * LK_GROUP keys in stages, each stage issuing the next one's loads for the whole group
     * before any is used: 1. hash, prefetch the home buckets; 2. probe, prefetch the head
     * entries; 3. prefetch the first rows (and the columns the answer reads of them); 4. their
     * links, prefetch the second rows; 5. rank and answer each key in order, exactly as one key
     * at a time did (the stages only read within the columns, and the first key that ends the
     * answer stops it at the same point). */
    int stop = 0;
    for (Py_ssize_t g0 = 0; g0 < nk && !stop; g0 += LK_GROUP) {
        Py_ssize_t gn = nk - g0 < LK_GROUP ? nk - g0 : LK_GROUP;
        const uint64_t *gw = words + 2 * g0;
        int64_t gslot[LK_GROUP], grow[LK_GROUP];
        for (Py_ssize_t j = 0; j < gn; j++)
            mb_prefetch_bucket(bk_t, mb_home(gw[2 * j], bits));
        for (Py_ssize_t j = 0; j < gn; j++) { /* the probe of KeyTable._probe (mb_kt_probe) */
            int64_t pos, slot = mb_kt_probe(bk_t, bits, gw[2 * j], gw[2 * j + 1], &pos);
            gslot[j] = slot;
            if (slot >= 0 && slot < c.n_head) __builtin_prefetch(c.head + slot);
        }
        for (Py_ssize_t j = 0; j < gn; j++) {
            int64_t r = gslot[j] >= 0 && gslot[j] < c.n_head ? c.head[gslot[j]] : -1;
            grow[j] = r >= 0 && r < c.n_rows ? r : -1;
            if (grow[j] < 0) continue;
            mb_prefetch_row(c.next, c.holder, c.state, c.tier, r);
            __builtin_prefetch(c.size + r);
            __builtin_prefetch(c.gen + r);
        }
        for (Py_ssize_t j = 0; j < gn; j++) {
            int64_t r = grow[j] >= 0 ? c.next[grow[j]] : -1;
            if (r >= 0 && r < c.n_rows) mb_prefetch_row(c.next, c.holder, c.state, c.tier, r);
        }
        for (Py_ssize_t j = 0; j < gn; j++) {
            Py_ssize_t i = g0 + j;
            int64_t slot = gslot[j];
            if (slot < 0) {
                if (every_key) continue;
                stop = 1; /* the prefix ends at its first block missing cluster-wide */
                break;
            }
            if (check_slot(&c, slot) != 0) break;
            int64_t row, h;
            int64_t *rr = rrows + k * width, *rh = rholders + k * width;
            if (use_ranked) {
                if (rank_walk(&c, slot, width, rr, rh) < 0) break;
                row = rr[0];
                h = rh[0];
            } else {
                row = best_walk(&c, slot, &h);
                if (c.bad) break;
            }
            if (row < 0) {
                if (every_key) continue;
                stop = 1; /* nothing readable: the prefix ends here */
                break;
            }
            best[k] = row;
            bholder[k] = h;
            bpos[k] = i;
            for (int j2 = 1; j2 < width; j2++) num_alt += rr[j2] >= 0;
            k++;
        }
        if (c.bad) stop = 1;
    }
    if (c.bad) {
        bad_columns(fn, &c);
        goto done;
    }
    /* the distinct holders, ascending (np.unique), and each block's index among them */
    Py_ssize_t nu = 0;
    for (Py_ssize_t q = 0; q < k; q++) {
        uniq[nu++] = bholder[q];
        for (int j = 1; j < width; j++)
            if (rrows[q * width + j] >= 0) uniq[nu++] = rholders[q * width + j];
    }
    qsort(uniq, (size_t)nu, sizeof(int64_t), cmp_i64);
    Py_ssize_t nd = 0;
    for (Py_ssize_t q = 0; q < nu; q++)
        if (nd == 0 || uniq[nd - 1] != uniq[q]) uniq[nd++] = uniq[q];
    uint8_t *p = wire;
    for (Py_ssize_t q = 0; q < k; q++) vals[q] = index_of(uniq, nd, bholder[q]);
    p = mb_put_packed(p, 2, vals, k); /* node_index */
    for (Py_ssize_t q = 0; q < k; q++) vals[q] = c.tier[best[q]];
    p = mb_put_packed(p, 3, vals, k); /* tier */
    for (Py_ssize_t q = 0; q < k; q++) vals[q] = c.size[best[q]];
    p = mb_put_packed(p, 4, vals, k); /* size_bytes */
    for (Py_ssize_t q = 0; q < k; q++) vals[q] = c.gen[best[q]];
    p = mb_put_packed(p, 5, vals, k); /* generation */
    if (every_key) {
        for (Py_ssize_t q = 0; q < k; q++) vals[q] = (uint64_t)bpos[q];
        p = mb_put_packed(p, 7, vals, k); /* key_index */
    }
    if (width > 1 && k > 0) {
        for (Py_ssize_t q = 0; q < k; q++) {
            uint64_t m = 0;
            for (int j = 1; j < width; j++) m += rrows[q * width + j] >= 0;
            vals[q] = m;
        }
        p = mb_put_packed(p, 10, vals, k); /* num_alternates */
        for (int field = 11; field <= 14; field++) {
            Py_ssize_t a = 0;
            for (Py_ssize_t q = 0; q < k; q++) {
                for (int j = 1; j < width; j++) {
                    int64_t r = rrows[q * width + j];
                    if (r < 0) continue; /* ranked rows pack the valid ones first */
                    vals[a++] = field == 11 ? index_of(uniq, nd, rholders[q * width + j])
                              : field == 12 ? (uint64_t)c.tier[r]
                              : field == 13 ? (uint64_t)c.size[r] : c.gen[r];
                }
            }
            p = mb_put_packed(p, field, vals, a);
        }
    }
    PyObject *o_wire = PyBytes_FromStringAndSize((const char *)wire, p - wire);
    PyObject *o_holders = PyList_New(nd);
    PyObject *o_best = PyBytes_FromStringAndSize((const char *)bholder, k * (Py_ssize_t)sizeof(int64_t));
    PyObject *o_pos = PyBytes_FromStringAndSize((const char *)bpos, k * (Py_ssize_t)sizeof(int64_t));
    if (o_wire && o_holders && o_best && o_pos) {
        int ok = 1;
        for (Py_ssize_t q = 0; q < nd && ok; q++) {
            PyObject *v = PyLong_FromLongLong(uniq[q]);
            if (!v) ok = 0;
            else PyList_SET_ITEM(o_holders, q, v);
        }
        if (ok) out = Py_BuildValue("(OOnOO)", o_wire, o_holders, k, o_best, o_pos);
    }
    Py_XDECREF(o_wire);
    Py_XDECREF(o_holders);
    Py_XDECREF(o_best);
    Py_XDECREF(o_pos);
done:
    PyMem_Free(best);
    PyMem_Free(ranked);
    PyMem_Free(vals);
    PyMem_Free(uniq);
    PyMem_Free(wire);
    PyMem_Free(words);
    mb_release(&b);
    return out;
not_fast:
    mb_release(&b);
    Py_RETURN_NONE;
}
