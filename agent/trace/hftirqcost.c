/* hftirqcost: what one interrupt costs a task running on a CPU, hidden parts included.
 *
 * Usage: hftirqcost CPU SENDER_CPU COUNT SPACING_NS [PARENT_PID WATCH_FD]
 *
 * A recorder thread pinned to CPU reads CLOCK_MONOTONIC in a tight loop (as hftnoise does)
 * and keeps every gap longer than max(1 us, 8 x the smallest step). The main thread, pinned
 * to SENDER_CPU, then sends COUNT IPIs to CPU with membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
 * (Linux 4.16+, registered first: an IPI to every CPU that runs a thread of this process,
 * here the recorder's),
 * one every SPACING_NS. The IPI arrives after the call starts, so the recorder's gap that
 * begins inside a call is that IPI: its length is the time the recorder lost to it, which is the
 * handler (an smp_mb, well under a microsecond), the kernel's entry and exit, and what the
 * guest cannot see at all: in a VM, the exit to the hypervisor and the entry back (tens of
 * microseconds under nested virtualisation, a few hundred ns on bare metal).
 * Kernel events time only the handler; this is the part they cannot time.
 *
 * Gaps outside any call (the tick, other noise) are counted apart, over the same length of
 * time before the first call, so the rate of chance matches is known.
 *
 * stdout: one line of key=value words: hftirqcost=1 cpu sender sent matched median_ns p10_ns
 * p90_ns step_ns background (gaps per second with no call).
 * Exit status: 0 ok, 2 bad arguments, 3 cannot pin, 4 out of memory, 5 no membarrier,
 * 6 thread failed, 7 parent gone.
 *
 * With PARENT_PID WATCH_FD it dies with hftagent, as hftnoise.c does (collectors/native.py,
 * "lifeline"): PR_SET_PDEATHSIG, a getppid() check, and a thread blocked in read(WATCH_FD)
 * that exits the process at EOF. That thread never runs while the IPIs are sent, so
 * membarrier never targets its CPU.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXIT_PARENT_GONE 7

#define MAX_GAPS 65536

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    if (!s || !*s || *s == '-') return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || !end || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int pin(uint64_t cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    return sched_setaffinity(0, sizeof set, &set);
}

struct rec {
    uint64_t cpu;
    atomic_int ready, stop;      /* the hand-over between the two threads (C11 atomics) */
    int pin_errno;               /* written before ready is set */
    uint64_t step;               /* the smallest step between two clock reads */
    uint64_t *gaps;              /* (start, length) pairs */
    size_t n;
};

static void *recorder(void *arg) {
    struct rec *r = arg;
    if (pin(r->cpu) != 0) {
        r->pin_errno = errno;
        atomic_store(&r->ready, 1);
        return NULL;
    }
    uint64_t prev = now_ns(), step = UINT64_MAX, end = prev + 5000000ull;
    while (prev < end) { /* 5 ms to find the smallest step */
        uint64_t t = now_ns();
        if (t - prev < step && t > prev) step = t - prev;
        prev = t;
    }
    r->step = step;
    uint64_t thr = step * 8 > 1000 ? step * 8 : 1000;
    atomic_store(&r->ready, 1);
    prev = now_ns();
    while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        uint64_t t = now_ns();
        if (t - prev > thr && r->n < MAX_GAPS) {
            r->gaps[2 * r->n] = prev;
            r->gaps[2 * r->n + 1] = t - prev;
            r->n++;
        }
        prev = t;
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void *watch_parent(void *arg) {
    char c;
    while (read((int)(intptr_t)arg, &c, 1) < 0 && errno == EINTR) {}
    _exit(EXIT_PARENT_GONE); /* EOF: no process holds the write end any more */
}

/* PARENT_PID WATCH_FD: die with the parent (see the top). -1 on bad arguments. */
static int lifeline(const char *ppid_s, const char *fd_s) {
    uint64_t ppid, fd;
    struct stat st;
    if (parse_u64(ppid_s, &ppid) || parse_u64(fd_s, &fd) || ppid > INT_MAX || fd > INT_MAX ||
        fstat((int)fd, &st) != 0 || !S_ISFIFO(st.st_mode))
        return -1;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != (pid_t)ppid) _exit(EXIT_PARENT_GONE); /* gone before the line above */
    pthread_t th;
    if (pthread_create(&th, NULL, watch_parent, (void *)(intptr_t)fd) != 0) return -1;
    pthread_detach(th);
    return 0;
}

int main(int argc, char **argv) {
    uint64_t cpu, sender, count, spacing;
    if ((argc != 5 && argc != 7) || parse_u64(argv[1], &cpu) || parse_u64(argv[2], &sender) ||
        parse_u64(argv[3], &count) || parse_u64(argv[4], &spacing) || cpu >= CPU_SETSIZE ||
        sender >= CPU_SETSIZE || cpu == sender || count == 0 || count > 100000 ||
        spacing < 1000 || spacing > 100000000ull ||
        (argc == 7 && lifeline(argv[5], argv[6]) != 0)) {
        fprintf(stderr, "usage: hftirqcost CPU SENDER_CPU COUNT SPACING_NS "
                "[PARENT_PID WATCH_FD]\n");
        return 2;
    }
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0) {
        fprintf(stderr, "membarrier private expedited unavailable: %s\n", strerror(errno));
        return 5;
    }
    if (pin(sender) != 0) {
        fprintf(stderr, "cannot pin to CPU %llu: %s\n", (unsigned long long)sender,
                strerror(errno));
        return 3;
    }
    struct rec r = {.cpu = cpu};
    uint64_t *calls = malloc(sizeof(uint64_t) * 2 * count);
    r.gaps = malloc(sizeof(uint64_t) * 2 * MAX_GAPS);
    uint64_t *lens = malloc(sizeof(uint64_t) * count);
    if (!calls || !r.gaps || !lens) {
        fprintf(stderr, "out of memory\n");
        return 4;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, recorder, &r) != 0) {
        fprintf(stderr, "cannot start the recorder thread\n");
        return 6;
    }
    while (!atomic_load(&r.ready)) sched_yield();
    if (r.pin_errno) {
        pthread_join(th, NULL);
        fprintf(stderr, "cannot pin to CPU %llu: %s\n", (unsigned long long)cpu,
                strerror(r.pin_errno));
        return 3;
    }
    uint64_t span = count * spacing;
    uint64_t quiet0 = now_ns(), t = quiet0 + span; /* the background: as long as the calls */
    while (now_ns() < t) {}
    uint64_t calls0 = now_ns();
    for (uint64_t i = 0; i < count; i++) {
        uint64_t a = now_ns();
        syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
        calls[2 * i] = a;
        calls[2 * i + 1] = now_ns();
        uint64_t next = a + spacing;
        while (now_ns() < next) {}
    }
    atomic_store(&r.stop, 1);
    pthread_join(th, NULL);
    /* each call's gap: the longest recorded gap that begins inside it. The IPI arrives
     * after the call starts, so its gap begins within [a, b]; it may end after b (the
     * sender sees the handler done before the receiver's exit path and, in a VM, its entry
     * back have run). A gap that began before the call is the recorder off its CPU (another
     * task ran there, and membarrier sent no IPI): not a match, so a busy CPU gives fewer
     * matches, never a wrong cost. */
    size_t g = 0, matched = 0, background = 0;
    for (size_t k = 0; k < r.n; k++)
        if (r.gaps[2 * k] >= quiet0 && r.gaps[2 * k] < calls0) background++;
    for (uint64_t i = 0; i < count; i++) {
        /* (5 us of slack for the two CPUs' clocks) */
        uint64_t a = calls[2 * i] - 5000, b = calls[2 * i + 1], best = 0;
        while (g < r.n && r.gaps[2 * g] < a) g++;
        for (size_t k = g; k < r.n && r.gaps[2 * k] <= b; k++)
            if (r.gaps[2 * k + 1] > best) best = r.gaps[2 * k + 1];
        if (best) lens[matched++] = best;
    }
    uint64_t med = 0, p10 = 0, p90 = 0;
    if (matched) {
        qsort(lens, matched, sizeof lens[0], cmp_u64);
        med = lens[matched / 2];
        p10 = lens[matched / 10];
        p90 = lens[(matched * 9) / 10];
    }
    printf("hftirqcost=1 cpu=%llu sender=%llu sent=%llu matched=%zu median_ns=%llu p10_ns=%llu "
           "p90_ns=%llu step_ns=%llu background=%.1f\n",
           (unsigned long long)cpu, (unsigned long long)sender, (unsigned long long)count,
           matched, (unsigned long long)med, (unsigned long long)p10, (unsigned long long)p90,
           (unsigned long long)r.step, background / (span / 1e9));
    return 0;
}
