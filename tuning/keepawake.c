/*
 * hftkeepawake: keep one CPU out of idle for exactly as long as one process lives.
 *
 *   hftkeepawake CPU PIDFD [pause|busy]
 *
 * Started by `hftagent run --keep-awake` (tuning/launcher.py), one per inference CPU, before it
 * execs the command. PIDFD is a pidfd of the launcher process (pidfd_open(2), Linux >= 5.3),
 * inherited: the launcher becomes the command by exec, so the pidfd turns readable when the
 * command's last thread has exited. There is no PID to be reused and nothing to race.
 *
 * The first process forks the spinner and exits once the spinner says it is ready, printing
 * its PID: the spinner is then nobody's child in the command's tree (a shell's `wait` would
 * otherwise wait for it) and is reparented to init or the nearest subreaper. It pins itself
 * to CPU, switches to SCHED_IDLE (it only ever runs when the CPU would otherwise be idle, and
 * any other task preempts it at once), and spins with `pause` (x86; `yield` on arm64) in the
 * loop: the hint lets an SMT sibling have the core's pipelines and saves power, where a bare
 * loop would slow the sibling down. A CPU that never idles never pays an idle-state exit or, in
 * a guest, a halt and the hypervisor's wake-up. Every millisecond it polls the pidfd (timeout
 * 0) and exits when the process is gone; SIGTERM/SIGKILL end it at any time.
 *
 * In a KVM guest, pause-loop exiting (Intel ple_gap/ple_window, AMD pause_filter_count/
 * pause_filter_thresh) may turn a long run of pauses into exits to the host, which can then
 * run something else on the physical CPU: the vCPU is then not running when the probe's timer
 * fires. The loop "busy" spins with no pause at all (no exit to trigger, at the cost of an
 * SMT sibling's share of the core); "pause" (the default) is the SMT-friendly loop. Which one
 * keeps a given guest awake is measured (bench/tuning_effect.py --keepawake-loops), not
 * assumed.
 *
 * Errors before ready: one line on stderr from the first process, exit 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

static int busy_loop; /* 1: no pause instruction in the loop (see above) */

static inline void spin(void)
{
	if (busy_loop) {
		for (int i = 0; i < 64; i++)
			__asm__ __volatile__("" ::: "memory");
		return;
	}
	for (int i = 0; i < 64; i++)
		relax();
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Report a set-up failure to the waiting parent and exit. */
static void fail(int fd, const char *what, int err)
{
	dprintf(fd, "err %s: %s\n", what, strerror(err));
	_exit(1);
}

int main(int argc, char **argv)
{
	int cpu, pidfd, p[2];
	pid_t child;

	if (argc < 3 || argc > 4 || parse_int(argv[1], 0, CPU_SETSIZE - 1, &cpu) ||
	    parse_int(argv[2], 0, 1 << 20, &pidfd) ||
	    (argc == 4 && strcmp(argv[3], "pause") && strcmp(argv[3], "busy"))) {
		fprintf(stderr, "usage: hftkeepawake CPU PIDFD [pause|busy]\n");
		return 2;
	}
	busy_loop = argc == 4 && !strcmp(argv[3], "busy");
	if (pipe2(p, O_CLOEXEC)) {
		fprintf(stderr, "pipe: %s\n", strerror(errno));
		return 1;
	}
	child = fork();
	if (child < 0) {
		fprintf(stderr, "fork: %s\n", strerror(errno));
		return 1;
	}
	if (child > 0) {
		char buf[256];
		size_t got = 0;
		ssize_t n;

		close(p[1]);
		while (got < sizeof(buf) - 1 && (n = read(p[0], buf + got, sizeof(buf) - 1 - got)) > 0)
			got += (size_t)n;
		buf[got] = 0;
		if (strncmp(buf, "ok ", 3) == 0) {
			fputs(buf + 3, stdout);
			return 0;
		}
		fputs(got > 4 ? buf + 4 : "spinner exited before it was ready\n", stderr);
		return 1;
	}

	/* the spinner */
	close(p[0]);
	setsid();
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		fail(p[1], "sched_setaffinity", errno);
	struct sched_param sp = { .sched_priority = 0 };
	if (sched_setscheduler(0, SCHED_IDLE, &sp))
		fail(p[1], "sched_setscheduler(SCHED_IDLE)", errno);
	struct pollfd pf = { .fd = pidfd, .events = POLLIN };
	int r = poll(&pf, 1, 0);
	if (r < 0)
		fail(p[1], "poll(pidfd)", errno);
	if (r > 0)
		fail(p[1], "watched process", (pf.revents & POLLNVAL) ? EBADF : ESRCH);
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
	}
	dprintf(p[1], "ok %d\n", (int)getpid());
	close(p[1]);

	long long next = now_ns() + 1000000LL;
	for (;;) {
		spin();
		long long t = now_ns();
		if (t < next)
			continue;
		next = t + 1000000LL;
		pf.revents = 0;
		if (poll(&pf, 1, 0) != 0)
			break; /* readable: the process has exited; error: nothing left to watch */
	}
	return 0;
}
