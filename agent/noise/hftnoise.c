/* hftnoise: a pinned clock-gap recorder, the hiccups / sysjitter method.
 *
 * Usage: hftnoise CPU DURATION_NS THRESHOLD_NS MAX_GAPS [PARENT_PID WATCH_FD]
 *
 * Pins itself to CPU, then reads CLOCK_MONOTONIC in a tight loop for DURATION_NS. A gap
 * between two consecutive reads longer than max(THRESHOLD_NS, 8 x the smallest gap seen) is
 * time the CPU spent on something else: an IRQ, a softirq, the tick, a kworker, another task,
 * SMI or the hypervisor. The first 20 ms calibrate the smallest gap and record nothing.
 * Each recorded gap is kept (start, length) up to MAX_GAPS; past that, gaps are only counted
 * and summed ("dropped"), so memory is bounded whatever the noise.
 *
 * stdout: one header line of key=value words, then one "START_NS LEN_NS" line per kept gap.
 * Exit status: 0 ok, 2 bad arguments, 3 cannot pin, 4 out of memory, 7 parent gone.
 * Runs as an ordinary SCHED_OTHER task: it measures what a pinned inference thread would see.
 *
 * It never outlives hftagent (collectors/native.py, "lifeline"): with PARENT_PID and
 * WATCH_FD (the read end of a pipe whose write end only the parent holds), it is SIGKILLed
 * when the thread that started it exits (PR_SET_PDEATHSIG), exits at once when PARENT_PID
 * is already not its parent, and a thread blocked in read(WATCH_FD) exits the process when
 * that read returns: EOF, the parent gone however it ended. The thread is started before
 * the pin and never runs again until then: it costs the scanned CPU nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXIT_PARENT_GONE 7

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
    uint64_t cpu, duration, threshold, max_gaps;
    if ((argc != 5 && argc != 7) || parse_u64(argv[1], &cpu) || parse_u64(argv[2], &duration) ||
        parse_u64(argv[3], &threshold) || parse_u64(argv[4], &max_gaps) || cpu >= CPU_SETSIZE ||
        duration == 0 || duration > 600ull * 1000000000ull || max_gaps > 50000000ull ||
        (argc == 7 && lifeline(argv[5], argv[6]) != 0)) {
        fprintf(stderr, "usage: hftnoise CPU DURATION_NS THRESHOLD_NS MAX_GAPS "
                "[PARENT_PID WATCH_FD]\n");
        return 2;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "cannot pin to CPU %llu: %s\n", (unsigned long long)cpu, strerror(errno));
        return 3;
    }
    uint64_t *gaps = max_gaps ? malloc(sizeof(uint64_t) * 2 * max_gaps) : NULL;
    if (max_gaps && !gaps) {
        fprintf(stderr, "out of memory for %llu gaps\n", (unsigned long long)max_gaps);
        return 4;
    }
    if (gaps) memset(gaps, 0, sizeof(uint64_t) * 2 * max_gaps); /* fault the pages in now */

    uint64_t min_gap = UINT64_MAX, prev = now_ns();
    uint64_t calib_end = prev + 20000000ull;
    while (prev < calib_end) {
        uint64_t t = now_ns();
        if (t - prev < min_gap && t > prev) min_gap = t - prev;
        prev = t;
    }
    if (min_gap == UINT64_MAX) min_gap = 1;
    uint64_t limit = threshold > 8 * min_gap ? threshold : 8 * min_gap;
    uint64_t loops = 0, n = 0, kept = 0, sum = 0, maxg = 0;
    uint64_t t0 = now_ns(), end = t0 + duration;
    prev = t0;
    for (;;) {
        uint64_t t = now_ns();
        uint64_t g = t - prev;
        loops++;
        if (g > limit) {
            n++;
            sum += g;
            if (g > maxg) maxg = g;
            if (kept < max_gaps) {
                gaps[2 * kept] = prev;
                gaps[2 * kept + 1] = g;
                kept++;
            }
        }
        prev = t;
        if (t >= end) break;
    }
    int on = sched_getcpu();
    printf("hftnoise=1 cpu=%llu ran_on=%d t0_ns=%llu t1_ns=%llu loops=%llu min_gap_ns=%llu "
           "threshold_ns=%llu gaps=%llu kept=%llu sum_gap_ns=%llu max_gap_ns=%llu\n",
           (unsigned long long)cpu, on, (unsigned long long)t0, (unsigned long long)prev,
           (unsigned long long)loops, (unsigned long long)min_gap, (unsigned long long)limit,
           (unsigned long long)n, (unsigned long long)kept, (unsigned long long)sum,
           (unsigned long long)maxg);
    for (uint64_t i = 0; i < kept; i++)
        printf("%llu %llu\n", (unsigned long long)gaps[2 * i], (unsigned long long)gaps[2 * i + 1]);
    free(gaps);
    return 0;
}
