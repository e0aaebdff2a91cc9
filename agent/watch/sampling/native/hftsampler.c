/*
 * hftsampler: the native reader behind `hftagent watch --sampler native`.
 *
 * Reads the hot /proc and /sys files that watch's hot sources sample at 20-100 Hz, with pread
 * on descriptors kept open, and appends one record per round (the round number, its
 * CLOCK_MONOTONIC time and the raw bytes of every file due that round) to a byte ring in a
 * shared-memory file. The Python side (feed.py, next to this file) owns the file: it lists the
 * files to read in a slot table, and replays each round's bytes through the same Python
 * sources in batches (plans.py). The collector modules' parsers stay the one source of truth:
 * the only parsing here is mechanical. A slot may carry a file's token layout
 * (collectors/layout.py: the token and line counts, the name tokens that must sit at given
 * positions, the positions of its values); while a read matches the layout exactly and each
 * value is a number as collectors/parsers.py takes one (1-20 ASCII digits, after one "-" in
 * a signed layout), the record carries the values as doubles after the raw bytes, and the
 * Python side appends them without parsing. Any mismatch ("nan", "+7", an IRQ that came or
 * went) and the record has the raw bytes only: the parser reads them and says why.
 *
 * Why: in Python each 100 Hz wake-up runs with cold caches and TLBs, and on a VM that costs
 * more than the reads themselves (measured on a 2-CPU KVM guest: 5 % of one CPU for the Python
 * sampler at 100 Hz, 1.3 % for this loop doing the same reads, docs/benchmarks.md).
 *
 * Usage: hftsampler SHM_FILE CPU,CPU,...|- PARENT_PID [WATCH_FD]
 *        (pins itself to the CPUs, "-" = do not pin; exits when PARENT_PID is no longer its
 *        parent — checked against the pid given, so it also works under a PID-1 parent;
 *        WATCH_FD: the read end of a pipe whose write end only the parent holds, which a
 *        thread blocked in read() sees reach EOF when the parent is gone however it ended,
 *        even where PR_SET_PDEATHSIG does not fire: collectors/native.py, "lifeline")
 * Layout of SHM_FILE: struct header (4 KiB), NSLOTS struct slot, NSLOTS token layouts
 * (LAYOUT_BYTES each), then the data ring. Every
 * field the other side reads is written with a release store after the data it publishes.
 * It exits when the header's stop flag is set, on SIGTERM/SIGINT, or when its parent dies.
 * SIGUSR1 asks for a round now (watch: a spike waits for the round after it).
 * Reads only the paths in the slot table, opened O_RDONLY; writes only SHM_FILE.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x31534648u      /* "HFS1" */
#define VERSION 4u
#define NSLOTS 256
#define PATH_LEN 224
#define HEADER_BYTES 4096
#define REC_MAGIC 0x20444e52u  /* "RND " */
#define PAD_MAGIC 0x20444150u  /* "PAD " */
#define LAYOUT_BYTES 8192
#define F_VALUES 1u            /* frec.flags bit 0: flags >> 1 doubles (the layout's nvals)
                                * follow the (padded) raw bytes */
#define L_SIGNED 1u            /* lhead.flags bit 0: a value may start with "-" */
#define MAX_DIGITS 20          /* collectors.parsers.parse_uint: at most 20 digits (a u64) */
#define NO_LINES 0xffffffffu   /* lhead.lines: the line count is not checked */

/* The structs below are mirrored in feed.py (HEADER_FIELDS, the struct.Struct formats and
 * their *_FIELDS names); tests/test_native_sampler.py compiles them with
 * -DHFTSAMPLER_LAYOUT_ONLY and compares every offset and size. */
struct header {
    uint32_t magic;           /* 0 */
    uint32_t version;         /* 4 */
    uint64_t period_ns;       /* 8    python: read again after every round */
    uint64_t table_gen;       /* 16   python: bumped after any slot change */
    uint64_t stop;            /* 24   python: 1 = exit */
    uint64_t capacity;        /* 32   python: data ring bytes */
    uint64_t write_pos;       /* 40   helper: bytes ever written to the ring */
    uint64_t rounds;          /* 48   helper */
    uint64_t late_rounds;     /* 56   helper */
    uint64_t cpu_ns;          /* 64   helper: its utime + stime */
    int64_t pid;              /* 72   helper */
    uint64_t state;           /* 80   helper: 1 running, 2 exited, 3 failed */
    char error[256];          /* 88   helper: why it failed */
    uint64_t reserve_pos;     /* 344  helper: write_pos once the record being copied is in:
                               *      stored before the copy, so a reader that finds
                               *      reserve_pos - its start > capacity knows its bytes may
                               *      have been overwritten while it copied them */
    uint64_t dropped_rounds;  /* 352  helper: rounds larger than half the ring (not written) */
};

struct slot {                 /* 256 bytes */
    uint32_t state;           /* 0    python: 0 free, 1 read */
    uint32_t div;             /* 4    python: read on rounds where round % div == 0 */
    uint32_t gen;             /* 8    python: bumped on every change of this slot */
    int32_t err;              /* 12   helper: errno of the last open/read, 0 = ok */
    uint64_t reads;           /* 16   helper */
    uint64_t read_ns;         /* 24   helper: time inside open/pread */
    char path[PATH_LEN];      /* 32 */
};

struct rec {                  /* a round: 32 bytes, then nfiles × (struct frec + bytes) */
    uint32_t magic;
    uint32_t len;             /* whole record, 8-aligned */
    uint64_t round;
    uint64_t t_ns;
    uint32_t nfiles;
    uint32_t pad;
};

struct frec {                 /* 16 bytes, then n bytes padded to 8 [, nvals doubles] */
    uint16_t slot;
    uint16_t flags;           /* F_VALUES | nvals << 1: the read matched the slot's layout */
    int32_t n;                /* >= 0: bytes; < 0: -errno */
    uint32_t gen;             /* the slot's gen when read */
    uint32_t lgen;            /* with F_VALUES: the layout's generation */
};

/* A slot's token layout, as Python writes it (LAYOUT_BYTES each, after the slot table):
 * struct lhead, nvals + nnames struct lref (values first), then the heap (names, prefixes).
 * Python stores lgen = 0, writes the rest, stores the new lgen, then bumps table_gen. */
struct lhead {
    uint32_t lgen;            /* 0: no layout */
    uint32_t ntok;            /* the read must split into exactly this many tokens */
    uint32_t nvals;
    uint32_t nnames;
    uint32_t heap_len;
    uint32_t flags;           /* L_SIGNED */
    uint32_t lines;           /* the read must hold exactly this many '\n' (NO_LINES: any) */
    uint32_t pad;
};

struct lref {                 /* a value: token pos, prefix (len, off); a name: pos, bytes */
    uint32_t pos;
    uint16_t len;
    uint16_t off;
};

#ifndef HFTSAMPLER_LAYOUT_ONLY

struct layout {               /* the helper's private copy */
    uint32_t lgen, ntok, nvals, nnames, flags, lines;
    const struct lref *vals, *names;
    const char *heap;
    char *mem;
};

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) { (void)sig; stop_signal = 1; }

static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static uint64_t self_cpu_ns(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

static struct header *H;

static int fail(const char *what) {
    if (H) {
        snprintf(H->error, sizeof H->error, "%s: %s", what, strerror(errno));
        __atomic_store_n(&H->state, 3, __ATOMIC_RELEASE);
    }
    fprintf(stderr, "hftsampler: %s: %s\n", what, strerror(errno));
    return 1;
}

/* Copy slot i's layout when its generation changed. A copy torn by a concurrent rewrite
 * (the generation differs after the copy) is dropped: Python bumps table_gen once it is
 * done, and the copy is made again then. A layout that does not check out is no layout. */
static void load_layout(struct layout *L, const char *src) {
    const struct lhead *h = (const struct lhead *)src;
    uint32_t g = __atomic_load_n(&h->lgen, __ATOMIC_ACQUIRE);
    if (g == L->lgen) return;
    free(L->mem);
    memset(L, 0, sizeof *L);
    if (!g) return;
    struct lhead hd;
    memcpy(&hd, src, sizeof hd);
    size_t nref = (size_t)hd.nvals + hd.nnames;
    size_t need = sizeof hd + nref * sizeof(struct lref) + hd.heap_len;
    if (!hd.nvals || hd.nvals >= 0x8000 || nref > LAYOUT_BYTES || need > LAYOUT_BYTES)
        return;
    char *mem = malloc(need);
    if (!mem) return;
    memcpy(mem, src, need);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->lgen, __ATOMIC_ACQUIRE) != g) { free(mem); return; }
    const struct lref *r = (const struct lref *)(mem + sizeof hd);
    for (size_t k = 0; k < nref; k++) {
        if (r[k].pos >= hd.ntok || (size_t)r[k].off + r[k].len > hd.heap_len) {
            free(mem);
            return;
        }
    }
    L->lgen = g;
    L->ntok = hd.ntok;
    L->nvals = hd.nvals;
    L->nnames = hd.nnames;
    L->flags = hd.flags;
    L->lines = hd.lines;
    L->vals = r;
    L->names = r + hd.nvals;
    L->heap = mem + sizeof hd + nref * sizeof(struct lref);
    L->mem = mem;
}

/* Token starts and lengths of one read (bytes.split(): runs of non-ASCII-whitespace). */
static uint32_t *tstart, *tlen;
static size_t tcap;

static int is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* A number token as collectors/parsers.py reads it: 1 to MAX_DIGITS ASCII digits
 * (parse_uint), after one "-" when the layout is signed (parse_int); as a double rounded as
 * Python's float(int(token)). -1 for anything else ("+7", "nan", "1e9", "--1", 21 digits):
 * the record then carries the raw bytes only and the collector's parser says why. */
static int parse_num(const char *s, size_t len, int sign_ok, double *v) {
    size_t i = 0;
    int neg = 0;
    if (sign_ok && len && s[0] == '-') { neg = 1; i = 1; }
    if (i >= len || len - i > MAX_DIGITS) return -1;
    for (size_t k = i; k < len; k++)
        if ((unsigned)(s[k] - '0') > 9) return -1;
    if (len - i > 19) { /* beyond exact uint64 accumulation: let strtod round it */
        char tmp[MAX_DIGITS + 1];
        memcpy(tmp, s + i, len - i);
        tmp[len - i] = 0;
        *v = strtod(tmp, NULL);
    } else {
        uint64_t a = 0;
        for (; i < len; i++) a = a * 10 + (uint64_t)(s[i] - '0');
        *v = (double)a;
    }
    if (neg && *v != 0) *v = -*v; /* "-0" is 0, as int("-0") */
    return 0;
}

/* The layout's values of buf[0:n] into out, or -1 when the read does not match it. */
static int extract(const struct layout *L, const char *b, size_t n, double *out) {
    if (tcap < (size_t)L->ntok + 1) {
        size_t c = (size_t)L->ntok + 1;
        uint32_t *a = realloc(tstart, c * sizeof *a), *z;
        if (!a) return -1;
        tstart = a;
        z = realloc(tlen, c * sizeof *z);
        if (!z) return -1;
        tlen = z;
        tcap = c;
    }
    if (L->lines != NO_LINES) { /* memchr: far cheaper than a test in the loop below */
        uint32_t nl = 0;
        for (const char *p = memchr(b, '\n', n); p; p = memchr(p + 1, '\n', (size_t)(b + n - p - 1)))
            nl++;
        if (nl != L->lines) return -1;
    }
    size_t k = 0, i = 0;
    while (i < n) {
        while (i < n && is_ws((unsigned char)b[i])) i++;
        if (i >= n) break;
        size_t s0 = i;
        while (i < n && !is_ws((unsigned char)b[i])) i++;
        if (k >= L->ntok) return -1;
        tstart[k] = (uint32_t)s0;
        tlen[k] = (uint32_t)(i - s0);
        k++;
    }
    if (k != L->ntok) return -1;
    for (uint32_t j = 0; j < L->nnames; j++) {
        const struct lref *r = &L->names[j];
        if (tlen[r->pos] != r->len || memcmp(b + tstart[r->pos], L->heap + r->off, r->len))
            return -1;
    }
    for (uint32_t j = 0; j < L->nvals; j++) {
        const struct lref *r = &L->vals[j];
        const char *t = b + tstart[r->pos];
        size_t tl = tlen[r->pos];
        if (tl < r->len || memcmp(t, L->heap + r->off, r->len)) return -1;
        if (parse_num(t + r->len, tl - r->len, (int)(L->flags & L_SIGNED), &out[j]) < 0)
            return -1;
    }
    return 0;
}

/* Grow-on-demand buffer for one round's record. */
static char *rbuf;
static size_t rcap;

static int reserve(size_t need) {
    if (need <= rcap) return 0;
    size_t n = rcap ? rcap : 65536;
    while (n < need) n *= 2;
    char *p = realloc(rbuf, n);
    if (!p) return -1;
    rbuf = p;
    rcap = n;
    return 0;
}

static void *watch_parent(void *arg) {
    char c;
    while (read((int)(intptr_t)arg, &c, 1) < 0 && errno == EINTR) {}
    _exit(7); /* EOF: no process holds the write end any more (the parent is gone) */
}

int main(int argc, char **argv) {
    int watch_fd = -1;
    if (argc == 5) {
        char *end;
        long v = strtol(argv[4], &end, 10);
        struct stat wst;
        if (end != argv[4] && !*end && v >= 0 && v <= INT_MAX && fstat((int)v, &wst) == 0 &&
            S_ISFIFO(wst.st_mode))
            watch_fd = (int)v;
    }
    if (argc < 4 || argc > 5 || (argc == 5 && watch_fd < 0)) {
        fprintf(stderr, "usage: hftsampler SHM_FILE CPU,CPU,...|- PARENT_PID [WATCH_FD]\n");
        return 2;
    }
    pid_t parent = (pid_t)strtol(argv[3], NULL, 10);
    int sfd = open(argv[1], O_RDWR | O_CLOEXEC);
    if (sfd < 0) return fail("open shared file");
    struct stat sb;
    if (fstat(sfd, &sb) < 0) return fail("stat shared file");
    size_t lbase = HEADER_BYTES + (size_t)NSLOTS * sizeof(struct slot);
    size_t base = lbase + (size_t)NSLOTS * LAYOUT_BYTES;
    if ((size_t)sb.st_size < base + 4096) {
        fprintf(stderr, "hftsampler: shared file too small\n");
        return 2;
    }
    char *map = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
    if (map == MAP_FAILED) return fail("mmap shared file");
    close(sfd);
    H = (struct header *)map;
    if (H->magic != MAGIC || H->version != VERSION) {
        fprintf(stderr, "hftsampler: shared file has another layout (magic/version)\n");
        return 2;
    }
    struct slot *slots = (struct slot *)(map + HEADER_BYTES);
    char *ring = map + base;
    uint64_t cap = H->capacity;
    if (cap < 4096 || base + cap > (size_t)sb.st_size || (cap & 7)) {
        fprintf(stderr, "hftsampler: bad ring capacity\n");
        return 2;
    }
    uint64_t period = H->period_ns;
    if (period < 100000) period = 100000; /* 10 kHz at most */

    /* Never outlive watch: SIGTERM when the parent dies (and it may already have). */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) return 0; /* the parent died before the line above */
    if (watch_fd >= 0) {
        /* the thread blocks every signal: SIGTERM/SIGINT are the main loop's to see */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        pthread_t th;
        int rc = pthread_create(&th, NULL, watch_parent, (void *)(intptr_t)watch_fd);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            errno = rc;
            return fail("pthread_create");
        }
        pthread_detach(th);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* SIGUSR1: watch asks for a round now (a spike waits for the round after it). Blocked,
     * and waited for between rounds with sigtimedwait: one that comes during a round stays
     * pending and ends the next wait at once (that round began before it was asked for); the
     * next regular round then comes a period after the asked one. Python asks only once a
     * round is recorded, so never before this line. */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, NULL);

    if (strcmp(argv[2], "-") != 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        char *s = argv[2];
        while (*s) {
            char *end;
            long c = strtol(s, &end, 10);
            if (end == s || c < 0 || c >= CPU_SETSIZE) {
                fprintf(stderr, "hftsampler: bad CPU list %s\n", argv[2]);
                return 2;
            }
            CPU_SET((int)c, &set);
            s = (*end == ',') ? end + 1 : end;
            if (*end && *end != ',') {
                fprintf(stderr, "hftsampler: bad CPU list %s\n", argv[2]);
                return 2;
            }
        }
        if (sched_setaffinity(0, sizeof set, &set) < 0) return fail("sched_setaffinity");
    }

    int fds[NSLOTS];      /* >= 0 open; < 0: -errno of the failed open; unused when off */
    uint32_t gens[NSLOTS];
    uint32_t divs[NSLOTS];
    char on[NSLOTS];
    for (int i = 0; i < NSLOTS; i++) { fds[i] = -EBADF; gens[i] = 0; divs[i] = 1; on[i] = 0; }
    static struct layout lays[NSLOTS];
    size_t *fsize = calloc(NSLOTS, sizeof(size_t)); /* read size per slot, grown on demand */
    char *fbuf = NULL;
    size_t fcap = 0;
    if (!fsize) return fail("calloc");

    H->pid = (int64_t)getpid();
    __atomic_store_n(&H->state, 1, __ATOMIC_RELEASE);
    uint64_t seen_gen = UINT64_MAX;
    uint64_t wpos = H->write_pos;
    uint64_t next = mono_ns();
    struct timespec ts;

    for (uint64_t round = 0;; round++) {
        if (stop_signal || __atomic_load_n(&H->stop, __ATOMIC_ACQUIRE)) break;
        uint64_t tg = __atomic_load_n(&H->table_gen, __ATOMIC_ACQUIRE);
        if (tg != seen_gen) {
            seen_gen = tg;
            for (int i = 0; i < NSLOTS; i++) {
                uint32_t st = __atomic_load_n(&slots[i].state, __ATOMIC_ACQUIRE);
                uint32_t g = slots[i].gen;
                if (st == 1 && (!on[i] || gens[i] != g)) {
                    if (fds[i] >= 0) close(fds[i]);
                    char path[PATH_LEN];
                    memcpy(path, slots[i].path, PATH_LEN);
                    path[PATH_LEN - 1] = 0;
                    uint64_t t0 = mono_ns();
                    int fd = open(path, O_RDONLY | O_CLOEXEC);
                    fds[i] = fd >= 0 ? fd : -errno;
                    slots[i].err = fd >= 0 ? 0 : errno;
                    slots[i].read_ns += mono_ns() - t0;
                    gens[i] = g;
                    divs[i] = slots[i].div ? slots[i].div : 1;
                    on[i] = 1;
                    if (!fsize[i]) fsize[i] = 4096;
                } else if (st != 1 && on[i]) {
                    if (fds[i] >= 0) close(fds[i]);
                    fds[i] = -EBADF;
                    on[i] = 0;
                }
                if (on[i]) load_layout(&lays[i], map + lbase + (size_t)i * LAYOUT_BYTES);
            }
        }
        uint64_t now = mono_ns();
        size_t len = sizeof(struct rec);
        uint32_t nfiles = 0;
        if (reserve(len) < 0) return fail("realloc");
        for (int i = 0; i < NSLOTS; i++) {
            if (!on[i] || round % divs[i]) continue;
            int32_t n;
            uint64_t t0 = mono_ns();
            if (fds[i] < 0) {
                n = fds[i];
            } else {
                /* A seq_file with many records (/proc/interrupts on a big box, /proc/vmstat)
                 * hands out about a page per read: read on at the offset reached until a
                 * read returns 0 — except after a short first read (< 1 KiB: all there). */
                size_t got = 0;
                for (;;) {
                    if (got == fsize[i]) {
                        if (fsize[i] >= (64u << 20)) { n = -EFBIG; break; }
                        fsize[i] *= 2;
                    }
                    if (fcap < fsize[i]) {
                        char *p = realloc(fbuf, fsize[i]);
                        if (!p) return fail("realloc");
                        fbuf = p;
                        fcap = fsize[i];
                    }
                    ssize_t k = pread(fds[i], fbuf + got, fsize[i] - got, (off_t)got);
                    if (k < 0) { n = -errno; break; }
                    got += (size_t)k;
                    if (k == 0 || (got == (size_t)k && got < 1024)) { n = (int32_t)got; break; }
                }
            }
            slots[i].read_ns += mono_ns() - t0;
            slots[i].reads++;
            slots[i].err = n < 0 ? -n : 0;
            size_t body = n > 0 ? (((size_t)n + 7) & ~(size_t)7) : 0;
            size_t vbytes = n >= 0 && lays[i].lgen ? (size_t)lays[i].nvals * 8 : 0;
            if (reserve(len + sizeof(struct frec) + body + vbytes) < 0) return fail("realloc");
            struct frec *f = (struct frec *)(rbuf + len);
            f->slot = (uint16_t)i;
            f->flags = 0;
            f->n = n;
            f->gen = gens[i];
            f->lgen = 0;
            if (n > 0) {
                memcpy(rbuf + len + sizeof(struct frec), fbuf, (size_t)n);
                memset(rbuf + len + sizeof(struct frec) + n, 0, body - (size_t)n);
            }
            if (vbytes) {
                double *vals = (double *)(rbuf + len + sizeof(struct frec) + body);
                if (extract(&lays[i], fbuf, n > 0 ? (size_t)n : 0, vals) == 0) {
                    f->flags = (uint16_t)(F_VALUES | (lays[i].nvals << 1));
                    f->lgen = lays[i].lgen;
                    body += vbytes;
                }
            }
            len += sizeof(struct frec) + body;
            nfiles++;
        }
        { /* every round, even with no file due: the reader replays it (and so registers
             * the files its collectors open) */
            struct rec *r = (struct rec *)rbuf;
            r->magic = REC_MAGIC;
            r->len = (uint32_t)len;
            r->round = round;
            r->t_ns = now;
            r->nfiles = nfiles;
            r->pad = 0;
            if (len <= cap / 2) {
                uint64_t off = wpos % cap;
                uint64_t pad = off + len > cap ? cap - off : 0; /* no record straddles the end */
                __atomic_store_n(&H->reserve_pos, wpos + pad + len, __ATOMIC_RELEASE);
                __atomic_thread_fence(__ATOMIC_SEQ_CST); /* reserve_pos before any byte below */
                if (pad) {
                    uint32_t p2[2] = {PAD_MAGIC, (uint32_t)pad}; /* pad >= 8: all 8-aligned */
                    memcpy(ring + off, p2, 8);
                    wpos += pad;
                    off = 0;
                }
                memcpy(ring + off, rbuf, len);
                wpos += len;
                __atomic_store_n(&H->write_pos, wpos, __ATOMIC_RELEASE);
            } else {
                H->dropped_rounds++; /* a round larger than half the ring is not written */
            }
        }
        __atomic_store_n(&H->rounds, round + 1, __ATOMIC_RELEASE);
        if (!(round & 31)) H->cpu_ns = self_cpu_ns();
        /* the period as the header has it now: watch slows the rounds while its CPU budget is
         * spent (NativeSampler.slow) and restores them after */
        period = __atomic_load_n(&H->period_ns, __ATOMIC_RELAXED);
        if (period < 100000) period = 100000;
        next += period;
        uint64_t after = mono_ns();
        if (after > next) {
            H->late_rounds++;
            next = after; /* never catch up in a burst */
            continue;
        }
        for (uint64_t t = after; t < next && !stop_signal; t = mono_ns()) {
            ts.tv_sec = (time_t)((next - t) / 1000000000ull);
            ts.tv_nsec = (long)((next - t) % 1000000000ull);
            if (sigtimedwait(&usr1, NULL, &ts) == SIGUSR1) {
                next = mono_ns(); /* asked: a round now */
                break;
            } /* else the time came (EAGAIN) or SIGTERM/SIGINT's handler ran (EINTR) */
        }
    }
    H->cpu_ns = self_cpu_ns();
    __atomic_store_n(&H->state, 2, __ATOMIC_RELEASE);
    return 0;
}

#endif /* HFTSAMPLER_LAYOUT_ONLY */
