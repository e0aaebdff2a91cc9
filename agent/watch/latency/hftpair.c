/* hftpair: watch --attach's always-on read of its uprobe hits, in C (issue #38: watch's own
 * CPU). Loaded with ctypes by agent/watch/latency/native_pair.py; the Python pairing in
 * attached.py is the reference and the fallback, and gives the same rows (tests/
 * test_native_pair.py compares them on random and crafted pages).
 *
 * hft_decode: the calls instance's ring-buffer pages (kernel/trace/ring_buffer.c; the walk of
 *   agent/trace/pages.py _records, branch for branch) -> hits (ts, cpu, tid, code) of the
 *   event ids the code table names, merged in time order across CPUs (a stable order: equal
 *   times keep the pages' order, as Python's sort does).
 * hft_unknown: the distinct threads of hits that are not among the process's known ones.
 * hft_pair: per thread, the outermost entry to its return is one call (attached.py's module
 *   docstring: a nested entry of another probed function, a lost return, an unpaired return),
 *   written as whole rows of agent.client.FIELDS (-1 where unknown).
 *
 * Codes: an entry event call<k-1> is k (1..31), its return ret<k-1> is -k, 0 is not ours.
 * State: a table of the threads seen (their open entries as a bit mask and the outermost
 * entry's time and CPU), kept between reads in a buffer the caller owns.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PADDING 29
#define TIME_EXTEND 30
#define TIME_STAMP 31
#define TS_MSB (0xF8ULL << 56)
#define RB_FLAGS ((1U << 31) | (1U << 30))

typedef struct { int64_t ts; int32_t cpu; int32_t tid; int32_t code; int32_t order; } hit_t;
typedef struct { int32_t tid; uint32_t open; int64_t t0; int32_t c0; int32_t pad; } slot_t;
typedef struct {
    int64_t n;                /* slots in use */
    int64_t unpaired_returns; /* a return without its entry (began before the attach) */
    int64_t lost_returns;     /* an entry again before its return: the return was lost */
    int64_t overflow;         /* hits of a thread past the table's size (never expected) */
    int64_t cap;              /* slots the buffer holds */
    int64_t reserved[3];
    slot_t s[];
} state_t;

static uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static uint64_t abs_ts(uint64_t ts, uint64_t a) {
    if (ts & TS_MSB) {
        a |= ts & TS_MSB;
        if (a < ts) a += 1ULL << 59;
    }
    return a;
}

static int by_time(const void *a, const void *b) {
    const hit_t *x = a, *y = b;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* npages pages of page_size bytes each, one after the other in buf, pages[p] of CPU
 * cpus[p]. Returns the hits written (at most cap; -1: more than cap). */
int64_t hft_decode(const uint8_t *buf, int64_t page_size, const int32_t *cpus,
                   int32_t npages, int32_t ts_off, int32_t commit_off, int32_t data_off,
                   const int8_t *codes, hit_t *out, int64_t cap) {
    int64_t n = 0;
    int sorted = 1, cpu0 = npages ? cpus[0] : 0;
    for (int32_t p = 0; p < npages; p++) {
        const uint8_t *pg = buf + p * page_size;
        int64_t plen = page_size;
        if (plen < data_off || ts_off + 8 > plen || commit_off + 8 > plen) continue;
        uint64_t ts = u64(pg + ts_off);
        uint64_t size = u64(pg + commit_off) & 0xFFFFFFFFULL & ~(uint64_t)RB_FLAGS;
        int64_t pos = data_off, end = data_off + (int64_t)size;
        if (end > plen) end = plen;
        if (cpus[p] != cpu0) sorted = 0;
        while (pos + 4 <= end) {
            uint32_t hdr = u32(pg + pos), t = hdr & 0x1F, delta = hdr >> 5;
            int64_t start, length, nxt;
            if (t == PADDING) {
                if (delta == 0 || pos + 8 > end) break;
                pos += 4 + (int64_t)u32(pg + pos + 4);
                continue;
            }
            if (t == TIME_EXTEND || t == TIME_STAMP) {
                if (pos + 8 > end) break;
                uint64_t v = ((uint64_t)u32(pg + pos + 4) << 27) | delta;
                ts = t == TIME_EXTEND ? ts + v : abs_ts(ts, v);
                pos += 8;
                continue;
            }
            if (t == 0) {
                if (pos + 8 > end) break;
                uint32_t rlen = u32(pg + pos + 4);
                if (rlen < 4) break;
                start = pos + 8;
                length = (int64_t)rlen - 4;
                nxt = pos + 4 + (int64_t)rlen;
            } else {
                start = pos + 4;
                length = 4 * (int64_t)t;
                nxt = start + length;
            }
            if (nxt > end) break;
            ts += delta;
            pos = nxt;
            if (length < 8) continue;
            int8_t code = codes[pg[start] | (pg[start + 1] << 8)];
            if (!code) continue;
            if (n >= cap) return -1;
            out[n].ts = (int64_t)ts;
            out[n].cpu = cpus[p];
            out[n].tid = (int32_t)u32(pg + start + 4);
            out[n].code = code;
            out[n].order = (int32_t)n;
            n++;
        }
    }
    if (!sorted && n > 1) qsort(out, (size_t)n, sizeof(hit_t), by_time);
    return n;
}

static int known(const int32_t *tids, int32_t n, int32_t tid) {  /* tids sorted */
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (tids[mid] < tid) lo = mid + 1; else hi = mid;
    }
    return lo < n && tids[lo] == tid;
}

/* The distinct threads of hits not in tids (at most cap of them); returns their count. */
int32_t hft_unknown(const hit_t *hits, int64_t n, const int32_t *tids, int32_t ntids,
                    int32_t *out, int32_t cap) {
    int32_t k = 0, last = 0, have_last = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t tid = hits[i].tid;
        if ((have_last && tid == last) || known(tids, ntids, tid)) continue;
        int seen = 0;
        for (int32_t j = 0; j < k; j++) if (out[j] == tid) { seen = 1; break; }
        last = tid, have_last = 1;
        if (!seen && k < cap) out[k++] = tid;
    }
    return k;
}

static slot_t *slot_of(state_t *st, int32_t tid, int make) {
    for (int64_t i = 0; i < st->n; i++) if (st->s[i].tid == tid) return &st->s[i];
    if (!make || st->n >= st->cap) return NULL;
    slot_t *s = &st->s[st->n++];
    memset(s, 0, sizeof *s);
    s->tid = tid;
    return s;
}

/* fields: the columns of seq, seq2, start_ns, end_ns, pid, tid, cpu_start, cpu_end. Rows are
 * nf int64 each, -1 where not written. Returns the rows written (calls made); a call past
 * cap is not made (the caller gives cap >= the returns among the hits). */
int64_t hft_pair(state_t *st, const hit_t *hits, int64_t n, const int32_t *tids,
                 int32_t ntids, int64_t pid, int64_t seq0, const int32_t *fields, int32_t nf,
                 int64_t *rows, int64_t cap) {
    int64_t k = 0;
    slot_t *s = NULL;
    for (int64_t i = 0; i < n; i++) {
        const hit_t *h = &hits[i];
        if (!known(tids, ntids, h->tid)) continue;  /* another process mapping the library */
        if (s == NULL || s->tid != h->tid) {
            s = slot_of(st, h->tid, 1);
            if (s == NULL) { st->overflow++; continue; }
        }
        if (h->code < 0) {
            uint32_t bit = 1U << (-h->code);
            if (!(s->open & bit)) { st->unpaired_returns++; continue; }
            s->open &= ~bit;
            if (!s->open && k < cap) {  /* the outermost call returned */
                int64_t *r = rows + k * nf;
                for (int32_t f = 0; f < nf; f++) r[f] = -1;
                r[fields[0]] = r[fields[1]] = seq0 + k + 1;
                r[fields[2]] = s->t0;
                r[fields[3]] = h->ts;
                r[fields[4]] = pid;
                r[fields[5]] = h->tid;
                r[fields[6]] = s->c0;
                r[fields[7]] = h->cpu;
                k++;
            }
        } else {
            uint32_t bit = 1U << h->code;
            if (s->open & bit) { st->lost_returns++; s->open = 0; }
            if (!s->open) { s->t0 = h->ts; s->c0 = h->cpu; }
            s->open |= bit;
        }
    }
    return k;
}

/* A read in one call (each call from Python is paid cold, once a loop step): decode, then,
 * when every hit's thread is known, pair into rows (rcap of them: the caller gives
 * rcap >= the hits: a call is completed by a return record here). Returns the rows made; or -1 - k when k (> 0) threads are not known:
 * they are in unknown[] (at most ucap) and the hits, decoded, wait in out for hft_pair
 * once the caller has looked at them. *nhits: the hits decoded. */
int64_t hft_read(state_t *st, const uint8_t *buf, int64_t page_size, const int32_t *cpus,
                 int32_t npages, int32_t ts_off, int32_t commit_off, int32_t data_off,
                 const int8_t *codes, hit_t *out, int64_t cap, int64_t *nhits,
                 const int32_t *tids, int32_t ntids, int32_t *unknown, int32_t ucap,
                 int64_t pid, int64_t seq0, const int32_t *fields, int32_t nf, int64_t *rows,
                 int64_t rcap) {
    int64_t n = hft_decode(buf, page_size, cpus, npages, ts_off, commit_off, data_off, codes,
                           out, cap);
    if (n < 0) n = 0;
    *nhits = n;
    int32_t k = hft_unknown(out, n, tids, ntids, unknown, ucap);
    if (k > 0) return -1 - (int64_t)k;
    return hft_pair(st, out, n, tids, ntids, pid, seq0, fields, nf, rows, rcap);
}

/* Forget every thread; returns how many had a call open. */
int64_t hft_clear(state_t *st) {
    int64_t open = 0;
    for (int64_t i = 0; i < st->n; i++) open += st->s[i].open != 0;
    st->n = 0;
    return open;
}

/* Forget the threads not in tids (sorted; they ended); returns how many had a call open. */
int64_t hft_keep(state_t *st, const int32_t *tids, int32_t ntids) {
    int64_t open = 0, j = 0;
    for (int64_t i = 0; i < st->n; i++) {
        if (known(tids, ntids, st->s[i].tid)) { st->s[j++] = st->s[i]; continue; }
        open += st->s[i].open != 0;
    }
    st->n = j;
    return open;
}

/* Forget the threads in tids (sorted; their process left); returns how many had a call
 * open. */
int64_t hft_drop(state_t *st, const int32_t *tids, int32_t ntids) {
    int64_t open = 0, j = 0;
    for (int64_t i = 0; i < st->n; i++) {
        if (!known(tids, ntids, st->s[i].tid)) { st->s[j++] = st->s[i]; continue; }
        open += st->s[i].open != 0;
    }
    st->n = j;
    return open;
}

/* Set a thread's open calls (the Python pairing's state handed over); 0 when it is full. */
int32_t hft_set(state_t *st, int32_t tid, uint32_t open, int64_t t0, int32_t c0) {
    slot_t *s = slot_of(st, tid, 1);
    if (s == NULL) return 0;
    s->open = open, s->t0 = t0, s->c0 = c0;
    return 1;
}

/* Threads with a call open now. */
int64_t hft_open(const state_t *st) {
    int64_t open = 0;
    for (int64_t i = 0; i < st->n; i++) open += st->s[i].open != 0;
    return open;
}
