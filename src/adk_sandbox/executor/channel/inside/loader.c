/* adk-sandbox agent loader: the first stage of the static agent (executor/channel/static_agent.py).
 *
 * Written into the container by /bin/sh's printf builtin (so it must stay tiny: no libc, raw system
 * calls) and started as  LOADER <bytes> [agent arguments...]  with the exec's stdin attached:
 *   1. becomes non-dumpable (a command of the same uid cannot open /proc/<pid>/fd/N and write into the
 *      memory file below) and unlinks its own file (argv[0]): nothing of it stays on a filesystem;
 *   2. reads exactly <bytes> bytes of the static agent from stdin into a memfd (never a file), seals it
 *      against every change;
 *   3. execs the memfd (execveat AT_EMPTY_PATH, else /proc/self/fd/N) as  adk-sandbox-agent [args...]
 *      with the same environment; the agent then reads frames from the same stdin.
 * Any failure: a message on stderr and exit status 127.
 */
#if defined(__x86_64__)
#define NR_read 0
#define NR_write 1
#define NR_close 3
#define NR_fcntl 72
#define NR_unlink 87
#define NR_prctl 157
#define NR_exit 60
#define NR_execve 59
#define NR_memfd_create 319
#define NR_execveat 322
static long sys6(long n, long a, long b, long c, long d, long e) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
#define NR_read 63
#define NR_write 64
#define NR_close 57
#define NR_fcntl 25
#define NR_unlinkat 35
#define NR_prctl 167
#define NR_exit 93
#define NR_execve 221
#define NR_memfd_create 279
#define NR_execveat 281
static long sys6(long n, long a, long b, long c, long d, long e) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
}
#else
#error "the static agent's loader supports x86-64 and aarch64"
#endif

#define PR_SET_DUMPABLE 4
#define MFD_ALLOW_SEALING 2
#define F_ADD_SEALS 1033
#define SEALS 15 /* F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE */
#define AT_EMPTY_PATH 0x1000
#define AT_FDCWD -100
#define MAX_ARGS 16

static void say(const char *text) {
    long n = 0;
    while (text[n]) n++;
    sys6(NR_write, 2, (long)"adk-sandbox-agent loader: ", 26, 0, 0);
    sys6(NR_write, 2, (long)text, n, 0, 0);
    sys6(NR_write, 2, (long)"\n", 1, 0, 0);
}

static void __attribute__((noreturn)) die(const char *text) {
    say(text);
    for (;;) sys6(NR_exit, 127, 0, 0, 0, 0);
}

static char buffer[65536];

static void __attribute__((used, noreturn)) start(long *stack) {
    long argc = stack[0];
    char **argv = (char **)(stack + 1);
    char **envp = argv + argc + 1;
    sys6(NR_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0);
#if defined(__x86_64__)
    sys6(NR_unlink, (long)argv[0], 0, 0, 0, 0);
#else
    sys6(NR_unlinkat, AT_FDCWD, (long)argv[0], 0, 0, 0);
#endif
    if (argc < 2 || argc > MAX_ARGS) die("usage: LOADER BYTES [ARGS...]");
    unsigned long want = 0;
    for (const char *p = argv[1]; *p; p++) {
        if (*p < '0' || *p > '9' || want > 1UL << 32) die("bad byte count");
        want = want * 10 + (unsigned long)(*p - '0');
    }
    long fd = sys6(NR_memfd_create, (long)"adk-sandbox-agent", MFD_ALLOW_SEALING, 0, 0, 0);
    if (fd < 0) die("memfd_create failed");
    while (want > 0) {
        long n = sys6(NR_read, 0, (long)buffer, want < sizeof buffer ? (long)want : (long)sizeof buffer, 0, 0);
        if (n == -4) continue; /* EINTR */
        if (n <= 0) die("the agent's bytes ended early");
        for (long done = 0; done < n;) {
            long w = sys6(NR_write, fd, (long)(buffer + done), n - done, 0, 0);
            if (w == -4) continue;
            if (w <= 0) die("cannot write the memory file");
            done += w;
        }
        want -= (unsigned long)n;
    }
    if (sys6(NR_fcntl, fd, F_ADD_SEALS, SEALS, 0, 0) < 0) die("cannot seal the memory file");
    char *args[MAX_ARGS + 1];
    long i = 0;
    args[i++] = "adk-sandbox-agent";
    for (long a = 2; a < argc; a++) args[i++] = argv[a];
    args[i] = 0;
    sys6(NR_execveat, fd, (long)"", (long)args, (long)envp, AT_EMPTY_PATH);
    /* No execveat (an old kernel or runtime): the same memory file through /proc. */
    char path[32] = "/proc/self/fd/";
    char digits[12];
    long nd = 0;
    for (long v = fd; v > 0 || nd == 0; v /= 10) digits[nd++] = (char)('0' + v % 10);
    long at = 14;
    while (nd > 0) path[at++] = digits[--nd];
    path[at] = 0;
    sys6(NR_execve, (long)path, (long)args, (long)envp, 0, 0);
    die("cannot execute the agent (execveat and /proc/self/fd both failed)");
}

#if defined(__x86_64__)
__asm__(".globl _start\n_start:\n mov %rsp, %rdi\n and $-16, %rsp\n call start\n");
#else
__asm__(".globl _start\n_start:\n mov x0, sp\n bl start\n");
#endif
