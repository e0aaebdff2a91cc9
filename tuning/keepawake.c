/*
 * hftkeepawake: keep one CPU out of idle for exactly as long as one process lives.
 *
 *   hftkeepawake [-p PROCDIR -w PID [-n SAMPLES]] CPU PIDFD [pause|busy]
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
 * It stays in the command's session (no setsid): SCHED_IDLE is "idle" only against tasks of
 * the same task group. With CONFIG_SCHED_AUTOGROUP (kernel.sched_autogroup_enabled=1, Linux
 * >= 2.6.38) a new session is a new autogroup, whose group entity competes with the command's
 * at nice-0 weight whatever the spinner's policy; and the command's group divides its weight
 * among the CPUs by load (calc_group_shares), so with busy tasks of the same session on the
 * other CPUs the command's group got ~1/7 of it on the spinner's CPU: measured on Linux 6.18,
 * 6 busy neighbours, CPU isolated, the spinner ran 88 % of the CPU, the probe 12 % while
 * runnable the whole time (P50 2 s). So it ignores the terminal's SIGINT/SIGQUIT/SIGHUP
 * instead (the pidfd decides when it ends) and never changes its group.
 *
 * The guard (-p PROCDIR -w PID, PID the process PIDFD refers to): every 10 ms of the spinner's
 * own running it reads the state of each thread of PID and of its descendants
 * (PROCDIR/P/task/T/stat, descriptors kept open, re-listed once per window). A thread that is
 * runnable ('R') on the spinner's CPU while the spinner itself is running there is waiting
 * for the CPU behind the spinner, which a SCHED_IDLE task never makes anyone do but for the
 * instant of a wake-up. When that is seen in GUARD_PCT % or more of a window of SAMPLES
 * samples (default 100, about 1 s of the spinner's running), the kernel is not treating the
 * spinner as idle against the command (another task group: an autogroup, a cgroup with the
 * cpu controller): the spinner says so in one line on the command's stderr
 * (PROCDIR/PID/fd/2, opened then, so the spinner never holds the command's pipes open) and
 * exits, and the command goes on without it.
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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define GUARD_PERIOD_NS 10000000LL /* one guard sample per 10 ms of the spinner's running */
#define GUARD_PCT 20               /* % of a window's samples with the command waiting */
#define GUARD_MAX_TASKS 4096       /* threads watched (the command's tree), at most */
#define GUARD_MAX_PROCS 262144     /* processes looked at for the tree, at most */

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

/* -- the guard ------------------------------------------------------------------------------ */

struct guard {
	const char *proc;  /* procfs mount, NULL: no guard */
	int procfd;        /* its directory, opened once */
	int pid;           /* the watched command */
	int cpu;           /* ours */
	int window;        /* samples per window */
	int samples, waiting, worst_tid, worst_count;
	int n, fd[GUARD_MAX_TASKS], tid[GUARD_MAX_TASKS], seen[GUARD_MAX_TASKS];
	char worst_comm[64];
};

/* "PID (comm) S ...": the state letter, the processor field (39th) and the comm; -1 when the
 * text is not a stat line. */
static int parse_stat(const char *buf, char *state, int *cpu, char *comm, size_t comm_len)
{
	const char *lp = strchr(buf, '('), *rp = strrchr(buf, ')');
	const char *p;
	int field;

	if (!lp || !rp || rp < lp || rp[1] != ' ' || !rp[2])
		return -1;
	if (comm) {
		size_t len = (size_t)(rp - lp - 1);
		if (len >= comm_len)
			len = comm_len - 1;
		memcpy(comm, lp + 1, len);
		comm[len] = 0;
	}
	*state = rp[2];
	p = rp + 2; /* field 3, the state */
	for (field = 3; field < 39; field++) {
		p = strchr(p, ' ');
		if (!p)
			return -1;
		p++;
	}
	*cpu = atoi(p);
	return 0;
}

/* The parent pid from PROCDIR/P/stat (field 4); -1 when unreadable. */
static int read_ppid(int procfd, int pid)
{
	char path[64], buf[1024];
	ssize_t n;
	int fd, ppid;
	const char *rp;

	snprintf(path, sizeof(path), "%d/stat", pid);
	fd = openat(procfd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	rp = strrchr(buf, ')');
	if (!rp || sscanf(rp + 1, " %*c %d", &ppid) != 1)
		return -1;
	return ppid;
}

static void guard_close(struct guard *g)
{
	for (int i = 0; i < g->n; i++)
		close(g->fd[i]);
	g->n = 0;
}

/* A listing of the directory at path under procfs (NULL: none). */
static DIR *open_listing(int procfd, const char *path)
{
	int fd = openat(procfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	DIR *d;

	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (!d)
		close(fd);
	return d;
}

/* Open the stat file of each thread of process pid. */
static void guard_add_threads(struct guard *g, int pid)
{
	char path[64];
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "%d/task", pid);
	d = open_listing(g->procfd, path);
	if (!d)
		return;
	while ((e = readdir(d)) != NULL && g->n < GUARD_MAX_TASKS) {
		int tid, fd;

		if (parse_int(e->d_name, 1, 1 << 30, &tid) || tid == (int)getpid())
			continue; /* never itself: a subreaper command would have it as a child */
		snprintf(path, sizeof(path), "%d/task/%d/stat", pid, tid);
		fd = openat(g->procfd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0)
			continue;
		g->tid[g->n] = tid;
		g->seen[g->n] = 0;
		g->fd[g->n++] = fd;
	}
	closedir(d);
}

/* (Re)list the threads of the command and of its descendants (by parent pid: the kernel's
 * task/T/children needs CONFIG_PROC_CHILDREN, which not every kernel has). */
static void guard_rescan(struct guard *g)
{
	static int pids[GUARD_MAX_PROCS], ppids[GUARD_MAX_PROCS];
	int np = 0, tree[1024], nt = 0;
	struct dirent *e;
	DIR *d;

	guard_close(g);
	d = open_listing(g->procfd, ".");
	if (d) {
		while ((e = readdir(d)) != NULL && np < GUARD_MAX_PROCS) {
			int pid, ppid;

			if (parse_int(e->d_name, 1, 1 << 30, &pid))
				continue;
			ppid = read_ppid(g->procfd, pid);
			if (ppid < 0)
				continue;
			pids[np] = pid;
			ppids[np++] = ppid;
		}
		closedir(d);
	}
	tree[nt++] = g->pid;
	for (int i = 0; i < nt; i++) /* breadth first: tree grows as children are found */
		for (int j = 0; j < np && nt < (int)(sizeof(tree) / sizeof(tree[0])); j++)
			if (ppids[j] == tree[i] && pids[j] != g->pid)
				tree[nt++] = pids[j];
	for (int i = 0; i < nt; i++)
		guard_add_threads(g, tree[i]);
}

/* The command's stderr for the one line, never blocking: opened anew through PROCDIR/PID/fd/2
 * (the kernel's link, followed on purpose), non-blocking, so the spinner never holds the
 * command's pipes open and a full pipe cannot stall it. A regular file gets the command's own
 * descriptor instead (pidfd_getfd(2), Linux >= 5.6; it shares the command's offset, so a later
 * write of the command does not overwrite the line), else the new one opened O_APPEND. */
static int command_stderr(struct guard *g, int pidfd)
{
	char path[64];
	struct stat st;
	int fd;

	snprintf(path, sizeof(path), "%d/fd/2", g->pid);
	fd = openat(g->procfd, path, O_WRONLY | O_APPEND | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode))
		return fd;
#ifdef SYS_pidfd_getfd
	int own = (int)syscall(SYS_pidfd_getfd, pidfd, 2, 0);
	if (own >= 0 && !fstat(own, &st) && S_ISREG(st.st_mode)) {
		close(fd);
		return own;
	}
	if (own >= 0)
		close(own);
#else
	(void)pidfd;
#endif
	return fd;
}

static void guard_report(struct guard *g, int pidfd)
{
	int fd = command_stderr(g, pidfd);

	if (fd < 0)
		return;
	dprintf(fd, "hftagent run: keep-awake spinner on CPU %d stopped: thread %d (%s) of the "
		"command was waiting for CPU %d in %d of %d samples while the SCHED_IDLE spinner "
		"ran there (the kernel does not treat the spinner as idle against the command: "
		"another task group, an autogroup or a cgroup with the cpu controller); the command "
		"goes on without it\n", g->cpu, g->worst_tid, g->worst_comm, g->cpu, g->waiting,
		g->samples);
	close(fd);
}

/* One sample; returns 1 when the spinner must stop. */
static int guard_sample(struct guard *g, int pidfd)
{
	char buf[1024], state, comm[64];
	int any = 0, cpu;

	if (g->samples == 0)
		guard_rescan(g);
	for (int i = 0; i < g->n; i++) {
		ssize_t n = pread(g->fd[i], buf, sizeof(buf) - 1, 0);

		if (n <= 0)
			continue; /* the thread has exited */
		buf[n] = 0;
		if (parse_stat(buf, &state, &cpu, comm, sizeof(comm)) || state != 'R' || cpu != g->cpu)
			continue;
		any = 1;
		if (++g->seen[i] > g->worst_count) {
			g->worst_count = g->seen[i];
			g->worst_tid = g->tid[i];
			snprintf(g->worst_comm, sizeof(g->worst_comm), "%s", comm);
		}
	}
	g->waiting += any;
	if (++g->samples < g->window)
		return 0;
	if (g->waiting * 100 >= GUARD_PCT * g->window) {
		guard_report(g, pidfd);
		return 1;
	}
	g->samples = g->waiting = g->worst_count = 0;
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: hftkeepawake [-p PROCDIR -w PID [-n SAMPLES]] CPU PIDFD "
		"[pause|busy]\n");
}

int main(int argc, char **argv)
{
	static struct guard g = { .window = 100 };
	int cpu, pidfd, p[2], opt;
	pid_t child;

	while ((opt = getopt(argc, argv, "+p:w:n:")) != -1) {
		if (opt == 'p' && optarg[0]) {
			g.proc = optarg;
		} else if (opt == 'w' && !parse_int(optarg, 1, 1 << 30, &g.pid)) {
			continue;
		} else if (opt == 'n' && !parse_int(optarg, 1, 1000000, &g.window)) {
			continue;
		} else {
			usage();
			return 2;
		}
	}
	argc -= optind - 1;
	argv += optind - 1;
	if (argc < 3 || argc > 4 || parse_int(argv[1], 0, CPU_SETSIZE - 1, &cpu) ||
	    parse_int(argv[2], 0, 1 << 20, &pidfd) ||
	    (argc == 4 && strcmp(argv[3], "pause") && strcmp(argv[3], "busy")) ||
	    (!g.proc != !g.pid)) {
		usage();
		return 2;
	}
	g.cpu = cpu;
	if (g.proc) {
		g.procfd = open(g.proc, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (g.procfd < 0) {
			fprintf(stderr, "guard: %s: %s\n", g.proc, strerror(errno));
			return 1;
		}
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

	/* the spinner: same session and task group as the command (see above) */
	close(p[0]);
	signal(SIGINT, SIG_IGN);
	signal(SIGQUIT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
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

	long long t0 = now_ns(), next = t0 + 1000000LL, next_guard = t0 + GUARD_PERIOD_NS;
	for (;;) {
		spin();
		long long t = now_ns();
		if (t < next)
			continue;
		next = t + 1000000LL;
		pf.revents = 0;
		if (poll(&pf, 1, 0) != 0)
			break; /* readable: the process has exited; error: nothing left to watch */
		if (g.proc && t >= next_guard) {
			/* Sampled while we run: a window covers the spinner's running, not wall time */
			next_guard = t + GUARD_PERIOD_NS;
			if (guard_sample(&g, pidfd))
				break;
		}
	}
	return 0;
}
