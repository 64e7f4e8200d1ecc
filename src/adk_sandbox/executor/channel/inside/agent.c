/* adk-sandbox in-sandbox agent, protocol version 1: the one agent of every channel-based backend (a Python
 * twin was removed, issue 33: executor/channel/static_agent.py says why).
 *
 * Needs no python3 in the image. Built fully static (gcc -static, glibc's libc.a; no name service is ever
 * used) by executor/channel/static_agent.py, delivered into the container over the exec's stdin
 * by loader.c (a memfd, no file), started as  adk-sandbox-agent [setid-allowed] [<protected>]  with frames
 * on stdin and stdout (framing: the docstring of frames.py). The set-id filter below is on everything the
 * agent starts unless the host gave the opt-in word SETID_ALLOWED_WORD (generated with the filter): a
 * sandbox whose workspace only travels as a copy, where package managers must install set-uid programs;
 * HELLO's "setid" says which ("refused" or "allowed"), so the host checks it got what it asked for. The process-tree model
 * (docs/docker/agent-channel.md):
 *   - the agent: non-dumpable, child subreaper (lenient mode when refused), framing pipes on private
 *     close-on-exec descriptors, /dev/null on 0 and 1; kills what earlier agents left; HELLO;
 *   - per RUN a shim (fork of the agent): subreaper, the command's pipes on 0/1/2 and nothing else,
 *     oom_score_adj 500, cwd, the set-id seccomp filter (SETID_FILTER, generated from setid.py at build
 *     time) with no_new_privs, then the command in its own session with exactly the RUN's environment plus
 *     ADK_SANDBOX_EXEC; when the command exits the shim stops then kills everything below itself; while
 *     no command runs the agent keeps one shim forked ahead of time (a spare, non-dumpable, waiting on a
 *     private control pipe: "the spare shim" below), so a RUN usually costs no fork;
 *   - output capped at the source, the excess read and counted; timeout, KILL and end of stdin kill the
 *     shim's tree; strays (children of the agent that are not live shims) and, without subreapers,
 *     unattributable orphans at PID 1 are killed;
 *   - RUN "background": at the command's normal exit the shim reports and stays as the keeper of what is
 *     left (a kept group, at most MAX_GROUPS, drained, never a stray), killed at the end of stdin or exit;
 *   - per FILE a worker (fork of the agent: non-dumpable, only its pipes, umask 0, the set-id filter) that
 *     performs the operation (docs/docker/agent-channel.md, "File operations") and streams its bytes over pipes, so the
 *     loop never waits on a file; live workers are not strays, and a write's temporary file is named and,
 *     on failure or KILL, removed by the agent.
 * The host is not trusted either: every frame is checked (type, flags, reserved, length, channel), a RUN or
 * FILE body is read by a small strict JSON reader (an object of strings, numbers, booleans, null, arrays of
 * strings and objects of strings), and anything else is answered with ERROR (RESULT EINVAL for a FILE) or
 * ends the agent.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <grp.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "setid_filter.h" /* generated: SETID_FILTER[] (struct sock_filter bytes), SETID_FILTER_LEN */

enum { HELLO = 1, RUN, STDIN_F, STDOUT_F, STDERR_F, EXIT_F, KILL_F, PING, PONG, ERROR_F, FILE_F, RESULT };
enum { LISTEN_F = 13, OPEN_F, DATA_F, CREDIT_F, CLOSE_F, DIAL_F }; /* the proxy endpoint's connections, dialing */
enum { RESIZE_F = 19, SIGNAL_F }; /* a terminal's (RUN "pty") size and signals */
#define HDR 12
#define MAXP (4u << 20) /* frames.MAX_PAYLOAD */
#define MAX_COMMANDS 4096
#define MAX_GROUPS 16 /* executor.types.MAX_BACKGROUND_GROUPS */
#define MAX_STDIN_PENDING (256u << 20)

static pid_t SELF;
/* Started with SETID_ALLOWED_WORD: no set-id filter on shims, spares and workers (main). */
static int setid_allowed = 0;
static int rfd = -1, wfd = -1, wake_r = -1, wake_w = -1, strict_mode = 0, host_eof = 0;
static int null_r = -1; /* /dev/null read-only: the stdin of every command without stdin (opened once) */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        static const char m[] = "adk-sandbox-agent: out of memory\n";
        (void)!write(2, m, sizeof m - 1);
        _exit(70);
    }
    return q;
}

/* -- growable byte buffer ------------------------------------------------------------------------------ */
typedef struct { char *p; size_t len, cap; } buf_t;

static void buf_add(buf_t *b, const void *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void buf_str(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }
static void buf_fmt(buf_t *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}
static void buf_free(buf_t *b) { free(b->p); b->p = NULL; b->len = b->cap = 0; }

/* A JSON string literal of s (bytes that are not valid UTF-8 are replaced: the host decodes strictly). */
static void buf_json_str(buf_t *b, const char *s) {
    buf_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') { buf_add(b, "\\", 1); buf_add(b, p, 1); }
        else if (c < 0x20) buf_fmt(b, "\\u%04x", c);
        else if (c < 0x80) buf_add(b, p, 1);
        else buf_add(b, "?", 1); /* messages are ASCII; never emit invalid UTF-8 */
    }
    buf_add(b, "\"", 1);
}

/* -- frames to the host ------------------------------------------------------------------------------- */
static void kill_everything_and_exit(int code);

static void out(int kind, uint32_t ch, const void *payload, size_t n) {
    unsigned char h[HDR] = {(unsigned char)kind, 0, 0, 0,
                            (unsigned char)(ch >> 24), (unsigned char)(ch >> 16), (unsigned char)(ch >> 8),
                            (unsigned char)ch,
                            (unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8),
                            (unsigned char)n};
    /* One writev per frame: a frame split over two writes is two wake-ups of the engine's relay and, often,
     * two reads on the host (an EXIT then arrives in pieces). */
    struct iovec iov[2] = {{h, HDR}, {(void *)payload, n}};
    int at = 0;
    while (at < 2) {
        ssize_t w = writev(wfd, iov + at, 2 - at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) kill_everything_and_exit(3); /* the host went away */
        size_t done = (size_t)w;
        while (at < 2 && done >= iov[at].iov_len) { done -= iov[at].iov_len; iov[at].iov_len = 0; at++; }
        if (at < 2) { iov[at].iov_base = (char *)iov[at].iov_base + done; iov[at].iov_len -= done; }
    }
}
static void out_json(int kind, uint32_t ch, buf_t *b) { out(kind, ch, b->p, b->len); buf_free(b); }
static void out_error(uint32_t ch, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    buf_t b = {0};
    buf_str(&b, "{\"message\":");
    buf_json_str(&b, msg);
    buf_str(&b, "}");
    out_json(ERROR_F, ch, &b);
}

/* -- /proc ------------------------------------------------------------------------------------------ */
typedef struct { int pid, ppid, sid; char state; unsigned long long start; } proc_t;
typedef struct { proc_t *v; int n; } procs_t;

static int stat_of(int pid, proc_t *out_p) {
    char path[64], data[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, data, sizeof data - 1);
    close(fd);
    if (n <= 0) return -1;
    data[n] = 0;
    char *p = strrchr(data, ')');
    if (!p || p[1] != ' ' || !p[2]) return -1;
    p += 2;
    out_p->pid = pid;
    out_p->state = *p;
    /* fields after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
     * cutime cstime priority nice threads itrealvalue starttime */
    char *save = NULL, *tok = strtok_r(p, " ", &save);
    for (int i = 0; tok; i++, tok = strtok_r(NULL, " ", &save)) {
        if (i == 1) out_p->ppid = atoi(tok);
        else if (i == 3) out_p->sid = atoi(tok);
        else if (i == 19) { out_p->start = strtoull(tok, NULL, 10); return 0; }
    }
    return -1;
}

static procs_t scan(void) {
    procs_t ps = {0};
    int cap = 0;
    DIR *d = opendir("/proc");
    if (!d) return ps;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *s = e->d_name;
        if (!*s || strspn(s, "0123456789") != strlen(s)) continue;
        proc_t p;
        if (stat_of(atoi(s), &p) != 0) continue;
        if (ps.n == cap) { cap = cap ? cap * 2 : 64; ps.v = xrealloc(ps.v, (size_t)cap * sizeof *ps.v); }
        ps.v[ps.n++] = p;
    }
    closedir(d);
    return ps;
}

static int find(const procs_t *ps, int pid) {
    for (int i = 0; i < ps->n; i++)
        if (ps->v[i].pid == pid) return i;
    return -1;
}

/* Marks (mark[i] = 1) every process descending from a process already marked or listed in roots. */
static void mark_below(const procs_t *ps, char *mark, const int *roots, int nroots) {
    char *in = xrealloc(NULL, (size_t)ps->n + 1);
    memset(in, 0, (size_t)ps->n + 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < ps->n; i++) {
            if (in[i]) continue;
            int parent = ps->v[i].ppid, hit = 0;
            for (int r = 0; r < nroots && !hit; r++) hit = roots[r] == parent;
            if (!hit) {
                int j = find(ps, parent);
                hit = j >= 0 && in[j];
            }
            if (hit) { in[i] = 1; mark[i] = 1; changed = 1; }
        }
    }
    free(in);
}

static unsigned long long start_of(int pid) {
    proc_t p;
    return stat_of(pid, &p) == 0 ? p.start : 0;
}

/* A signal through a pidfd after re-checking the start time: a reused pid is never hit. */
static void send_sig(int pid, unsigned long long start, int sig) {
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0 && errno != ENOSYS) return;
    if (start_of(pid) == start) {
        if (fd < 0) kill(pid, sig);
        else syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
    }
    if (fd >= 0) close(fd);
}

/* The real uid of a process (/proc/PID/status is readable for every process, non-dumpable ones too). */
static long uid_of(int pid) {
    char path[64], data[4096];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, data, sizeof data - 1);
    close(fd);
    if (n <= 0) return -1;
    data[n] = 0;
    char *line = strstr(data, "\nUid:");
    return line ? strtol(line + 5, NULL, 10) : -1;
}

typedef void (*reaped_fn)(int pid, int status);
typedef void (*targets_fn)(const procs_t *ps, char *mark, void *ctx);

static void reap_any(reaped_fn on_reaped) {
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p < 0 && errno == EINTR) continue;
        if (p <= 0) return;
        if (on_reaped) on_reaped(p, st);
    }
}

/* SIGSTOP then SIGKILL in passes until nothing targeted is left: a stopped process cannot fork, so a fork
 * bomb cannot refill what a kill frees. */
static void kill_all(targets_fn targets, void *ctx, double limit, reaped_fn on_reaped) {
    int *stopped = NULL, nstopped = 0, capstopped = 0;
    double end = now() + limit;
    for (;;) {
        procs_t ps = scan();
        char *mark = xrealloc(NULL, (size_t)ps.n + 1);
        memset(mark, 0, (size_t)ps.n + 1);
        targets(&ps, mark, ctx);
        int victims = 0, fresh = 0;
        for (int i = 0; i < ps.n; i++) {
            /* Only this uid's processes: another user's cannot be signalled (no capability), and
             * retrying them would only spend the limit. */
            if (!mark[i] || ps.v[i].pid == SELF || ps.v[i].state == 'Z' || ps.v[i].state == 'X' ||
                uid_of(ps.v[i].pid) != (long)getuid()) {
                mark[i] = 0;
                continue;
            }
            victims++;
            int seen = 0;
            for (int s = 0; s < nstopped && !seen; s++) seen = stopped[s] == ps.v[i].pid;
            if (!seen) { fresh++; mark[i] = 2; }
        }
        if (!victims || now() > end) { free(mark); free(ps.v); free(stopped); return; }
        for (int i = 0; i < ps.n; i++) {
            if (fresh ? mark[i] == 2 : mark[i] == 1) {
                send_sig(ps.v[i].pid, ps.v[i].start, fresh ? SIGSTOP : SIGKILL);
                if (fresh) {
                    if (nstopped == capstopped) {
                        capstopped = capstopped ? capstopped * 2 : 64;
                        stopped = xrealloc(stopped, (size_t)capstopped * sizeof *stopped);
                    }
                    stopped[nstopped++] = ps.v[i].pid;
                }
            }
        }
        free(mark);
        free(ps.v);
        if (!fresh) {
            reap_any(on_reaped);
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
    }
}

/* /proc/PID/cmdline or environ as one buffer of NUL-separated entries. */
static size_t read_proc_file(int pid, const char *what, char *data, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, what);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    size_t len = 0;
    while (len < cap - 1) {
        ssize_t n = read(fd, data + len, cap - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    data[len] = 0;
    return len;
}

static int marker_is(int pid, char **markers, int nmarkers) {
    static char data[1 << 17];
    size_t len = read_proc_file(pid, "environ", data, sizeof data);
    for (size_t at = 0; at < len; at += strlen(data + at) + 1) {
        const char *entry = data + at;
        if (strncmp(entry, "ADK_SANDBOX_EXEC=", 17) == 0) {
            for (int m = 0; m < nmarkers; m++)
                if (strcmp(entry + 17, markers[m]) == 0) return 1;
            return 0;
        }
    }
    return 0;
}

/* -- the set-id filter --------------------------------------------------------------------------------- */
static int install_setid_filter(void) {
    struct sock_fprog prog = {(unsigned short)(SETID_FILTER_LEN / 8), (struct sock_filter *)SETID_FILTER};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
}

/* -- the strict JSON reader (RUN bodies) --------------------------------------------------------------- */
enum { J_STR, J_NUM, J_BOOL, J_NULL, J_ARR, J_OBJ };
typedef struct {
    int type;
    char *s;      /* J_STR */
    double num;   /* J_NUM */
    int isint;    /* J_NUM written as an integer (no fraction, no exponent), as Python's json reads an int */
    int b;        /* J_BOOL */
    char **items; /* J_ARR: strings; J_OBJ: keys */
    char **vals;  /* J_OBJ: values */
    int n;
} jval_t;
typedef struct { char *key; jval_t v; } jmember_t;
typedef struct { const unsigned char *p, *end; const char *err; } jreader_t;

static void jskip(jreader_t *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}
static int jfail(jreader_t *r, const char *why) { if (!r->err) r->err = why; return -1; }

static int hex4(jreader_t *r, unsigned *out_v) {
    if (r->end - r->p < 4) return jfail(r, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = *r->p++;
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return jfail(r, "bad \\u escape");
    }
    *out_v = v;
    return 0;
}

static void put_utf8(buf_t *b, unsigned cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (unsigned char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (unsigned char)(0xC0 | cp >> 6); u[1] = (unsigned char)(0x80 | (cp & 63)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | cp >> 12); u[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
        u[2] = (unsigned char)(0x80 | (cp & 63)); n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | cp >> 18); u[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
        u[2] = (unsigned char)(0x80 | (cp >> 6 & 63)); u[3] = (unsigned char)(0x80 | (cp & 63)); n = 4;
    }
    buf_add(b, u, n);
}

/* Length of a valid UTF-8 sequence at p (no overlongs, no surrogates, <= U+10FFFF), or 0. */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    int n;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (end - p < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n;
}

/* A JSON string; NUL (\u0000) is refused: nothing in a RUN can carry it to the kernel. */
static int jstring(jreader_t *r, char **out_s) {
    if (r->p >= r->end || *r->p != '"') return jfail(r, "expected a string");
    r->p++;
    buf_t b = {0};
    buf_add(&b, "", 0);
    for (;;) {
        if (r->p >= r->end) { buf_free(&b); return jfail(r, "unterminated string"); }
        unsigned char c = *r->p;
        if (c == '"') { r->p++; break; }
        if (c < 0x20) { buf_free(&b); return jfail(r, "control character in a string"); }
        if (c == '\\') {
            r->p++;
            if (r->p >= r->end) { buf_free(&b); return jfail(r, "unterminated string"); }
            unsigned char e = *r->p++;
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e && simple) {
                static const char map[] = "\"\\/\b\f\n\r\t";
                buf_add(&b, &map[simple - "\"\\/bfnrt"], 1);
            } else if (e == 'u') {
                unsigned cp, lo;
                if (hex4(r, &cp)) { buf_free(&b); return -1; }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u') { buf_free(&b); return jfail(r, "lone surrogate"); }
                    r->p += 2;
                    if (hex4(r, &lo)) { buf_free(&b); return -1; }
                    if (lo < 0xDC00 || lo > 0xDFFF) { buf_free(&b); return jfail(r, "lone surrogate"); }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    buf_free(&b);
                    return jfail(r, "lone surrogate");
                }
                if (cp == 0) { buf_free(&b); return jfail(r, "NUL character in a string"); }
                put_utf8(&b, cp);
            } else {
                buf_free(&b);
                return jfail(r, "bad escape");
            }
            continue;
        }
        int n = utf8_len(r->p, r->end);
        if (!n) { buf_free(&b); return jfail(r, "invalid UTF-8"); }
        buf_add(&b, r->p, (size_t)n);
        r->p += n;
    }
    *out_s = b.p;
    return 0;
}

static int jnumber(jreader_t *r, double *out_d, int *isint) {
    const unsigned char *s = r->p;
    *isint = 1;
    if (r->p < r->end && *r->p == '-') r->p++;
    if (r->p >= r->end) return jfail(r, "bad number");
    if (*r->p == '0') r->p++;
    else if (*r->p >= '1' && *r->p <= '9') while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    else return jfail(r, "bad number");
    if (r->p < r->end && *r->p == '.') {
        *isint = 0;
        r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return jfail(r, "bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        *isint = 0;
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return jfail(r, "bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    char tmp[64];
    size_t n = (size_t)(r->p - s);
    if (n >= sizeof tmp) return jfail(r, "number too long");
    memcpy(tmp, s, n);
    tmp[n] = 0;
    *out_d = strtod(tmp, NULL);
    return 0;
}

static int jword(jreader_t *r, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, w, n) != 0) return jfail(r, "unexpected character");
    r->p += n;
    return 0;
}

static void jval_free(jval_t *v) {
    free(v->s);
    for (int i = 0; i < v->n; i++) {
        free(v->items[i]);
        if (v->vals) free(v->vals[i]);
    }
    free(v->items);
    free(v->vals);
    memset(v, 0, sizeof *v);
}

/* A value of a RUN member: string, number, boolean, null, array of strings, object of strings. */
static int jvalue(jreader_t *r, jval_t *v) {
    memset(v, 0, sizeof *v);
    jskip(r);
    if (r->p >= r->end) return jfail(r, "truncated");
    unsigned char c = *r->p;
    if (c == '"') { v->type = J_STR; return jstring(r, &v->s); }
    if (c == 't') { v->type = J_BOOL; v->b = 1; return jword(r, "true"); }
    if (c == 'f') { v->type = J_BOOL; return jword(r, "false"); }
    if (c == 'n') { v->type = J_NULL; return jword(r, "null"); }
    if (c == '-' || (c >= '0' && c <= '9')) { v->type = J_NUM; return jnumber(r, &v->num, &v->isint); }
    if (c != '[' && c != '{') return jfail(r, "unexpected character");
    int obj = c == '{';
    v->type = obj ? J_OBJ : J_ARR;
    r->p++;
    jskip(r);
    if (r->p < r->end && *r->p == (obj ? '}' : ']')) { r->p++; return 0; }
    for (int cap = 0;;) {
        char *key = NULL, *s = NULL;
        jskip(r);
        if (obj) {
            if (jstring(r, &key)) return -1;
            jskip(r);
            if (r->p >= r->end || *r->p != ':') { free(key); return jfail(r, "expected ':'"); }
            r->p++;
            jskip(r);
        }
        if (r->p >= r->end || *r->p != '"') { free(key); return jfail(r, obj ? "object values must be strings" : "array items must be strings"); }
        if (jstring(r, &s)) { free(key); return -1; }
        if (v->n == cap) {
            cap = cap ? cap * 2 : 8;
            v->items = xrealloc(v->items, (size_t)cap * sizeof *v->items);
            if (obj) v->vals = xrealloc(v->vals, (size_t)cap * sizeof *v->vals);
        }
        if (obj) { v->items[v->n] = key; v->vals[v->n] = s; }
        else v->items[v->n] = s;
        v->n++;
        jskip(r);
        if (r->p < r->end && *r->p == ',') { r->p++; continue; }
        if (r->p < r->end && *r->p == (obj ? '}' : ']')) { r->p++; return 0; }
        return jfail(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

/* The top-level object: members in *members (the caller frees them). */
static int jobject(const unsigned char *data, size_t n, jmember_t **members, int *count, const char **err) {
    jreader_t r = {data, data + n, NULL};
    int cap = 0;
    *members = NULL;
    *count = 0;
    jskip(&r);
    if (r.p >= r.end || *r.p != '{') { *err = "not a JSON object"; return -1; }
    r.p++;
    jskip(&r);
    if (r.p < r.end && *r.p == '}') r.p++;
    else {
        for (;;) {
            jskip(&r);
            char *key = NULL;
            if (jstring(&r, &key)) break;
            jskip(&r);
            if (r.p >= r.end || *r.p != ':') { free(key); jfail(&r, "expected ':'"); break; }
            r.p++;
            jval_t v;
            if (jvalue(&r, &v)) { free(key); jval_free(&v); break; }
            if (*count == cap) { cap = cap ? cap * 2 : 8; *members = xrealloc(*members, (size_t)cap * sizeof **members); }
            (*members)[*count].key = key;
            (*members)[*count].v = v;
            (*count)++;
            jskip(&r);
            if (r.p < r.end && *r.p == ',') { r.p++; continue; }
            if (r.p < r.end && *r.p == '}') { r.p++; break; }
            jfail(&r, "expected ',' or '}'");
            break;
        }
    }
    jskip(&r);
    if (!r.err && r.p != r.end) jfail(&r, "extra data after the object");
    *err = r.err;
    return r.err ? -1 : 0;
}

static void jmembers_free(jmember_t *m, int n) {
    for (int i = 0; i < n; i++) { free(m[i].key); jval_free(&m[i].v); }
    free(m);
}

/* The last member named key (duplicate keys: the last wins, as in Python's json). */
static jval_t *jget(jmember_t *m, int n, const char *key) {
    for (int i = n - 1; i >= 0; i--)
        if (strcmp(m[i].key, key) == 0) return &m[i].v;
    return NULL;
}

/* -- commands ----------------------------------------------------------------------------------------- */
typedef struct {
    uint32_t ch;
    pid_t shim;
    unsigned long long shim_start;
    int out_fd[2]; /* stdout, stderr read ends (-1: closed) */
    int status_fd;
    char status[65];
    size_t status_len;
    int stdin_fd, stdin_eof;
    buf_t pending;
    size_t pending_at;
    long long cap, sent[2], dropped[2];
    /* Beyond the cap, a ring of the latest tail_cap bytes per stream, sent before EXIT (tail_cap 0: none). */
    char *tail[2];
    size_t tail_cap, tail_pos[2], tail_len[2];
    double deadline, drain_until;
    int timed_out, killed, shim_done;
    int background; /* RUN "background": at its normal exit the shim keeps what is left (a kept group) */
    char marker[64];
    long long oom_before; /* the memory cgroup's oom_kill counter when the command started (-1: unreadable) */
    int pty;              /* RUN "pty": out_fd[0] is the terminal's master (stdin_fd a copy of it) */
    int paced;            /* RUN "pty" or "paced": output not capped but sent within the host's credit */
    long long credit;     /* the output the host lets the agent send (frames.PTY_WINDOW, CREDIT) */
} cmd_t;

static cmd_t *cmds[MAX_COMMANDS];
static int ncmds;

/* Kept groups: background commands that exited. Their shim stays as the keeper of what they left (until
 * the last of it exits); the agent drains and drops what the group still writes on the command's pipes. */
static cmd_t *groups[MAX_GROUPS];
static int ngroups;

/* The spare shim (see "the spare shim" below): forked while the agent is idle, waiting for the next RUN on
 * a private control pipe; a live child of the agent that is no stray. pid 0: none. */
typedef struct {
    pid_t pid;
    unsigned long long start;
    int control_w, stdin_w, out_r[2], status_r; /* the agent's ends of its pipes */
} spare_t;
static spare_t spare = {0, 0, -1, -1, {-1, -1}, -1};
static void spare_drop(int kill_it);

/* A file operation (FILE): performed by a forked worker; the agent only moves bytes between pipes. */
typedef struct {
    uint32_t ch;
    pid_t pid;
    unsigned long long start;
    int out_fd;    /* the worker's STDOUT bytes (read, list); -1: closed */
    int status_fd; /* the worker's result (one JSON object and a newline, one write) */
    char status[4097];
    size_t status_len;
    int stdin_fd, stdin_eof; /* a write's data, framed as (u32 length, bytes) chunks ending with length 0 */
    buf_t pending;
    size_t pending_at;
    long long cap, sent, dropped;
    double drain_until;
    int done, killed;
    char *tmp; /* the temporary file of a (non-appending) write, chosen here: removed if it fails */
} op_t;

#define MAX_OPS 1024
/* A write's data waiting for its worker beyond this: the agent stops reading the host until it drains (the
 * host has no per-channel flow control; memory stays bounded, the worker always progresses or dies). */
#define OP_HIGH_WATER (8u << 20)
static op_t *ops[MAX_OPS];
static int nops;

static op_t *op_of(uint32_t ch) {
    for (int i = 0; i < nops; i++)
        if (ops[i]->ch == ch) return ops[i];
    return NULL;
}

static int is_live_worker(int pid) {
    for (int i = 0; i < nops; i++)
        if (ops[i]->pid == pid && !ops[i]->done) return 1;
    return 0;
}

typedef struct { int pid; unsigned long long start; } protected_t;
static protected_t *protected_v;
static int nprotected;

static cmd_t *cmd_of(uint32_t ch) {
    for (int i = 0; i < ncmds; i++)
        if (cmds[i]->ch == ch) return cmds[i];
    return NULL;
}

static int is_live_shim(int pid) {
    for (int i = 0; i < ncmds; i++)
        if (cmds[i]->shim == pid && !cmds[i]->shim_done) return 1;
    for (int i = 0; i < ngroups; i++)
        if (groups[i]->shim == pid && !groups[i]->shim_done) return 1;
    return 0;
}

static int background_count(void) {
    int n = ngroups;
    for (int i = 0; i < ncmds; i++) n += cmds[i]->background;
    return n;
}

static void drop_group(int index) {
    cmd_t *g = groups[index];
    for (int k = 0; k < 2; k++)
        if (g->out_fd[k] >= 0) close(g->out_fd[k]);
    groups[index] = groups[--ngroups];
    free(g);
}

/* Children of the agent that are not live shims (nor file workers): orphans of a shim its command killed. */
static void mark_strays(const procs_t *ps, char *mark) {
    int *roots = xrealloc(NULL, (size_t)ps->n * sizeof *roots + sizeof *roots);
    int nroots = 0;
    for (int i = 0; i < ps->n; i++)
        if (ps->v[i].ppid == SELF && !is_live_shim(ps->v[i].pid) && !is_live_worker(ps->v[i].pid) &&
            !(spare.pid && ps->v[i].pid == spare.pid)) { mark[i] = 1; roots[nroots++] = ps->v[i].pid; }
    mark_below(ps, mark, roots, nroots);
    free(roots);
}

static int is_protected(int pid, unsigned long long start) {
    for (int i = 0; i < nprotected; i++)
        if (protected_v[i].pid == pid && protected_v[i].start == start) return 1;
    return 0;
}

/* Orphans at PID 1 that are not the container's own processes; without subreapers those attributable to a
 * live command (its session, or its marker) are spared. */
static void mark_escapees(const procs_t *ps, char *mark) {
    int *roots = xrealloc(NULL, (size_t)ps->n * sizeof *roots + sizeof *roots);
    int nroots = 0;
    char **markers = NULL;
    int nmarkers = 0;
    if (!strict_mode) {
        markers = xrealloc(NULL, (size_t)(ncmds + ngroups) * sizeof *markers + sizeof *markers);
        for (int c = 0; c < ncmds; c++)
            if (!cmds[c]->shim_done) markers[nmarkers++] = cmds[c]->marker;
        for (int g = 0; g < ngroups; g++) markers[nmarkers++] = groups[g]->marker; /* kept until pruned */
    }
    for (int i = 0; i < ps->n; i++) {
        const proc_t *p = &ps->v[i];
        if (p->ppid != 1 || is_protected(p->pid, p->start)) continue;
        if (!strict_mode) {
            int spared = 0;
            for (int j = 0; j < ps->n && !spared; j++) /* its session is a live command's */
                spared = ps->v[j].pid == p->sid && is_live_shim(ps->v[j].ppid);
            if (spared || marker_is(p->pid, markers, nmarkers)) continue;
        }
        mark[i] = 1;
        roots[nroots++] = p->pid;
    }
    mark_below(ps, mark, roots, nroots);
    free(roots);
    free(markers);
}

static void tree_targets(const procs_t *ps, char *mark, void *ctx) {
    cmd_t *c = ctx;
    int i = find(ps, c->shim);
    if (i >= 0 && ps->v[i].start == c->shim_start) {
        mark[i] = 1;
        int root = c->shim;
        mark_below(ps, mark, &root, 1);
    }
    mark_strays(ps, mark);
}

static void sweep_targets(const procs_t *ps, char *mark, void *ctx) {
    (void)ctx;
    mark_strays(ps, mark);
    mark_escapees(ps, mark);
}

static void reaped(int pid, int status) {
    (void)status;
    if (spare.pid && pid == spare.pid) spare_drop(0); /* killed before its RUN (by a command of this uid) */
    for (int i = 0; i < ncmds; i++) {
        cmd_t *c = cmds[i];
        if (c->shim == pid && !c->shim_done) {
            c->shim_done = 1;
            c->drain_until = now() + 2.0;
        }
    }
    for (int i = 0; i < nops; i++) {
        op_t *o = ops[i];
        if (o->pid == pid && !o->done) {
            o->done = 1;
            o->drain_until = now() + 2.0;
        }
    }
    for (int i = 0; i < ngroups; i++)
        if (groups[i]->shim == pid && !groups[i]->shim_done) {
            groups[i]->shim_done = 1;
            /* With subreapers every orphan came back to the keeper: nothing of the group is left. */
            if (strict_mode) drop_group(i);
            break;
        }
}

/* A kept group's tree: its keeper and what is below it; without subreapers also what carries its marker
 * among the orphans at PID 1. */
static void group_targets(const procs_t *ps, char *mark, void *ctx) {
    cmd_t *g = ctx;
    int i = find(ps, g->shim);
    int roots[1] = {g->shim};
    if (i >= 0 && ps->v[i].start == g->shim_start) { mark[i] = 1; mark_below(ps, mark, roots, 1); }
    if (!strict_mode) {
        char *markers[1] = {g->marker};
        for (int j = 0; j < ps->n; j++)
            if (ps->v[j].ppid == 1 && marker_is(ps->v[j].pid, markers, 1)) { mark[j] = 1; mark_below(ps, mark, &ps->v[j].pid, 1); }
    }
}

/* Without subreapers a group outlives its keeper while an orphan at PID 1 carries its marker. */
static void prune_groups(void) {
    procs_t ps = {0};
    int scanned = 0;
    for (int i = 0; i < ngroups;) {
        if (!groups[i]->shim_done) { i++; continue; }
        int left = 0;
        if (!strict_mode) {
            if (!scanned) { ps = scan(); scanned = 1; }
            char *markers[1] = {groups[i]->marker};
            for (int j = 0; j < ps.n && !left; j++) left = ps.v[j].ppid == 1 && marker_is(ps.v[j].pid, markers, 1);
        }
        if (left) i++;
        else drop_group(i);
    }
    free(ps.v);
}

static void kill_groups(void) {
    while (ngroups) {
        kill_all(group_targets, groups[ngroups - 1], 5.0, NULL);
        drop_group(ngroups - 1);
    }
}

static void kill_cmd(cmd_t *c) { kill_all(tree_targets, c, 5.0, reaped); }
static void prune_groups(void);
static void sweep(void) {
    kill_all(sweep_targets, NULL, 5.0, reaped);
    if (!strict_mode && ngroups) prune_groups();
}

static void below_self_targets(const procs_t *ps, char *mark, void *ctx);

/* The agent's only way out once it runs: nothing below it may still be dying when it exits. Under gVisor
 * an exec'd process has no parent, and a subreaper's descendant whose exit overlaps its subreaper's finds
 * no task to be re-parented to: the sentry then treats it as its namespace's init and kills every process
 * of the sandbox (runsc 20240729: a spare killed just before the agent's exit stopped the container). So
 * everything below is killed and seen exited (a zombie or gone) first; zombies go with the agent. */
static void __attribute__((noreturn)) exit_alone(int code) {
    kill_all(below_self_targets, NULL, 5.0, NULL);
    reap_any(NULL);
    _exit(code);
}

static void kill_everything_and_exit(int code) {
    spare_drop(1);
    for (int i = 0; i < ncmds; i++)
        if (!cmds[i]->shim_done) kill_cmd(cmds[i]);
    kill_groups();
    for (int i = 0; i < nops; i++) { /* abandoned: a write in progress leaves its path unchanged */
        if (!ops[i]->done) send_sig(ops[i]->pid, ops[i]->start, SIGKILL);
        if (ops[i]->tmp) unlink(ops[i]->tmp);
    }
    exit_alone(code);
}

static void protocol_error(const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dprintf(2, "adk-sandbox-agent: protocol error from the host: %s\n", msg);
    kill_everything_and_exit(2);
}

/* -- the shim ------------------------------------------------------------------------------------------ */
static void close_all_but(int keep) {
    if (syscall(SYS_close_range, 3, keep > 3 ? keep - 1 : 2, 0) == 0 &&
        syscall(SYS_close_range, keep + 1, ~0U, 0) == 0)
        return;
    DIR *d = opendir("/proc/self/fd");
    int fds[4096], n = 0, dfd = d ? dirfd(d) : -1;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 4096) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd > 2 && fd != keep && fd != dfd) fds[n++] = fd;
    }
    if (d) closedir(d);
    for (int i = 0; i < n; i++) close(fds[i]);
}

static void below_self_targets(const procs_t *ps, char *mark, void *ctx) {
    (void)ctx;
    int root = SELF;
    mark_below(ps, mark, &root, 1);
}

static const int DEFAULT_SIGNALS[] = {SIGTSTP, SIGTTIN, SIGTTOU, SIGHUP, SIGPIPE};
/* Under a keeper (a checkpointed container) a command runs in its shim's session and process group, not
 * one of its own: CRIU restores no session or group whose leader has ended (the sh that started a
 * background program), and the shim lives as long as anything of the command. So a command's `kill 0`
 * reaches the shim, which ignores these (its kill is SIGSTOP and SIGKILL, docs/pause.md "runc"). */
static int kept_session;
static const int KEPT_SIGNALS[] = {SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};

/* A command that could not start: said on its stderr, status E 127 (not found) or E 126, as a shell. */
static void __attribute__((noreturn)) start_failed(const char *argv0, int err, const char *why, int status_w) {
    dprintf(2, "%s: %s\n", argv0, why ? why : strerror(err));
    dprintf(status_w, "E %d\n", err == ENOENT ? 127 : 126);
    _exit(0);
}

/* argv[0] found on the command's own PATH. */
static char *resolve(const char *name, char **envp, int *err) {
    if (strchr(name, '/')) return strdup(name);
    const char *path = "/usr/local/bin:/usr/bin:/bin";
    for (char **e = envp; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        buf_t b = {0};
        if (n == 0) buf_str(&b, ".");
        else buf_add(&b, p, n);
        if (b.p[b.len - 1] != '/') buf_str(&b, "/");
        buf_str(&b, name);
        struct stat st;
        if (stat(b.p, &st) == 0 && S_ISREG(st.st_mode) && access(b.p, X_OK) == 0) return b.p;
        buf_free(&b);
        if (!colon) break;
        p = colon + 1;
    }
    *err = ENOENT;
    return NULL;
}

/* Set by the command's vfork child when its execve failed (the child shares the shim's memory until then). */
static volatile int exec_errno;
/* Set in a terminal's shim: its 0, 1 and 2 are the terminal, which the command takes as its controlling one. */
static int pty_command;

/* The command in a session of its own (under a keeper: its shim's, see KEPT_SIGNALS), with the signals the
 * shim ignores back to their defaults. vfork: no
 * copy of the shim's page tables, and the shim resumes exactly when the command has replaced the child (or
 * failed to: exec_errno). The child only makes system calls and never returns from here. */
static pid_t __attribute__((noinline)) spawn_command(const char *path, char **argv, char **envp) {
    exec_errno = 0;
    pid_t child = vfork();
    if (child == 0) {
        struct sigaction dfl = {0};
        dfl.sa_handler = SIG_DFL;
        for (size_t i = 0; i < sizeof DEFAULT_SIGNALS / sizeof *DEFAULT_SIGNALS; i++) sigaction(DEFAULT_SIGNALS[i], &dfl, NULL);
        if (kept_session) for (size_t i = 0; i < sizeof KEPT_SIGNALS / sizeof *KEPT_SIGNALS; i++) sigaction(KEPT_SIGNALS[i], &dfl, NULL);
        if (pty_command || !kept_session) setsid();
        if (pty_command && ioctl(0, TIOCSCTTY, 0) != 0) { exec_errno = errno ? errno : ENOTTY; _exit(127); }
        execve(path, argv, envp); /* status_w is close-on-exec */
        exec_errno = errno ? errno : ENOEXEC;
        _exit(127);
    }
    return child;
}

/* 500: the OOM killer takes the command before the agent. Non-dumpable (inherited from the agent),
 * /proc/self/... belongs to root, so a shim of any other uid gets EACCES writing it: the shim becomes dumpable
 * for this one open and write, then non-dumpable again before it starts anything. What that window exposes
 * to a same-uid process racing for it is not what non-dumpable guards on the agent: the shim has already
 * closed every descriptor but the command's own pipes and its status pipe (no channel of the agent), and a
 * shim such a process took over (ptrace) still dies with the command's tree, which the agent kills. A copy
 * of the agent's memory at the fork is readable in that window; it holds data of this same user's commands
 * and files only (each user has an agent of its own). (Writing /proc/<command>/oom_score_adj after its
 * execve instead would race with the command's first forks.) */
static void set_oom_score_adj(void) {
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) { (void)!write(fd, "500", 3); close(fd); }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

/* The shim's first steps, the same for a shim forked per RUN and for a spare: a subreaper, and no handler
 * or blocked signal of the agent's left. */
static void shim_prepare(void) {
    SELF = getpid();
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    /* The agent reset every disposition at its start and changed only these: SIGCHLD (its handler) and
     * DEFAULT_SIGNALS (ignored, here too: the shim outlives a hang-up). So no handler is left in the shim,
     * which its vfork child relies on. */
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (kept_session) {
        setsid();
        struct sigaction ign = {0};
        ign.sa_handler = SIG_IGN;
        for (size_t i = 0; i < sizeof KEPT_SIGNALS / sizeof *KEPT_SIGNALS; i++) sigaction(KEPT_SIGNALS[i], &ign, NULL);
    }
}

/* The set-id filter (with no_new_privs) on the shim: 0, or the errno that start_failed reports. None when
 * the host opted out of it (setid_allowed): then 0, and the command starts without it. */
static int shim_filter(void) {
    if (setid_allowed) return 0;
    if (SETID_FILTER_LEN == 0) return EOPNOTSUPP;
    return install_setid_filter() == 0 ? 0 : (errno ? errno : EINVAL);
}

static void __attribute__((noreturn)) shim_run(char **argv, char **envp, const char *cwd, int status_w, int background, int filter_err);

/* The command's status as one line in one write (dprintf would also fstat and seek the pipe). */
static void status_line(int status_w, int status) {
    char line[32];
    int n = WIFSIGNALED(status) ? snprintf(line, sizeof line, "S %d\n", WTERMSIG(status))
                                : snprintf(line, sizeof line, "E %d\n", WEXITSTATUS(status));
    (void)!write(status_w, line, (size_t)n);
}

static void __attribute__((noreturn)) shim(char **argv, char **envp, const char *cwd, int in, int o, int e, int status_w, int background) {
    shim_prepare();
    if (dup2(in, 0) < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(126);
    close_all_but(status_w);
    shim_run(argv, envp, cwd, status_w, background, -1);
}

/* From here the RUN's own steps. filter_err: -1 to install the filter here (after chdir, as ever), else
 * what installing it already did (a spare installs it before its RUN: it does not depend on the RUN). */
static void __attribute__((noreturn)) shim_run(char **argv, char **envp, const char *cwd, int status_w, int background, int filter_err) {
    /* What the command inherits is set on the shim itself, then the command is started in its own
     * session with its exact environment. */
    set_oom_score_adj();
    if (chdir(cwd) != 0) start_failed(argv[0], errno, NULL, status_w);
    if (filter_err < 0) filter_err = shim_filter();
    if (filter_err == EOPNOTSUPP && SETID_FILTER_LEN == 0) start_failed(argv[0], EOPNOTSUPP, "no set-id seccomp filter for this architecture", status_w);
    if (filter_err) start_failed(argv[0], filter_err, "cannot install the set-id seccomp filter", status_w);
    int err = 0;
    char *path = resolve(argv[0], envp, &err);
    if (!path) start_failed(argv[0], err, NULL, status_w);
    pid_t child = -1;
    for (int attempt = 0; attempt < 20 && child < 0; attempt++) {
        child = spawn_command(path, argv, envp);
        if (child < 0 && errno == EAGAIN) { struct timespec t = {0, 50000000}; nanosleep(&t, NULL); }
        else if (child < 0) break;
    }
    if (child < 0) start_failed(argv[0], errno, NULL, status_w);
    if (exec_errno) {
        int x = exec_errno;
        waitpid(child, NULL, 0);
        start_failed(argv[0], x, NULL, status_w);
    }
    close(0);
    close(1);
    close(2);
    int status = 0, have = 0;
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0 && errno == EINTR) continue;
        if (p < 0) break;
        if (p == child) { status = st; have = 1; break; }
    }
    if (background && have) {
        /* A background command: its status goes out now, and the shim stays as the keeper of what it
         * left, reaping (orphans still come back here) until nothing is left; the agent kills the group
         * when the session ends. */
        status_line(status_w, status);
        close(status_w);
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
        }
        _exit(0);
    }
    /* No child left means no descendant left: every orphan of the command is re-parented to this shim. */
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p < 0 && errno == EINTR) continue;
        if (p < 0) break; /* ECHILD */
        kill_all(below_self_targets, NULL, 5.0, NULL);
        while (waitpid(-1, &st, 0) > 0 || errno == EINTR) {
        }
    }
    if (have) status_line(status_w, status);
    _exit(0);
}

/* -- the memory cgroup's OOM-kill counter, read inside the container (cgroup v1, v2); -1: unreadable -- */
static long long oom_line(const char *data) {
    for (const char *line = data; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, "oom_kill ", 9) == 0) {
            char *end;
            long long v = strtoll(line + 9, &end, 10);
            if (end != line + 9 && v >= 0) return v;
        }
    }
    return -1;
}

/* The file that answered is kept open and read again from its start (twice per command: no path lookup). */
static int oom_fd = -1;

static long long oom_kills(void) {
    static const char *const files[] = {"/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"};
    char data[4096];
    if (oom_fd >= 0) {
        ssize_t n = pread(oom_fd, data, sizeof data - 1, 0);
        if (n > 0) {
            data[n] = 0;
            long long v = oom_line(data);
            if (v >= 0) return v;
        }
        close(oom_fd);
        oom_fd = -1;
    }
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        int fd = open(files[f], O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, data, sizeof data - 1);
        if (n > 0) {
            data[n] = 0;
            long long v = oom_line(data);
            if (v >= 0) { oom_fd = fd; return v; }
        }
        close(fd);
    }
    return -1;
}

/* -- the agent ----------------------------------------------------------------------------------------- */
static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void close_pipes(int *fds, int n) {
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
}

static void free_strv(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++) free(*p);
    free(v);
}

/* -- the spare shim ------------------------------------------------------------------------------------ */
/* While no command runs, the agent forks the next command's shim ahead of time: a spare, which does the
 * steps that do not depend on the RUN (subreaper, signals, its pipes on fixed descriptors, the set-id
 * filter) and then blocks reading its private control pipe. A RUN that finds a spare sends it argv, envp,
 * cwd and flags in one write, so no fork is on the command's path; from there the spare is the command's
 * shim, exactly as a forked one (shim_run). Why it cannot be driven by anything but the agent:
 *   - it is non-dumpable (inherited from the agent) until its RUN is read and the control pipe closed: a
 *     process of the same uid can neither open /proc/<spare>/fd/N (that would reopen the pipe for writing)
 *     nor read its memory nor ptrace it. The shim's dumpable window for oom_score_adj (set_oom_score_adj)
 *     comes only after that, with the same descriptors as a forked shim's;
 *   - no path names the pipe; its write end is the agent's alone (close-on-exec, never in a child);
 *   - a process of the same uid can signal it (as it can the agent): one killed or stopped before its RUN
 *     is dropped (a stopped one is killed) and the RUN forks a shim instead; one killed after is a command
 *     whose shim was killed (exit signal 9), as for a forked shim;
 *   - PR_SET_PDEATHSIG: a spare dies with the agent (it is cleared at the RUN: from there a shim lives as
 *     one forked per RUN does); the agent kills it at the end of stdin and on exit.
 * Each user has an agent of its own, so a spare's uid is always its RUN's: no set-id step is involved. */
enum { SP_IN = 0, SP_OUT, SP_ERR, SP_STATUS, SP_CONTROL, SP_NULL, SP_FDS };
#define SPARE_MAX_MESSAGE 65536u /* a pipe's capacity, so one non-blocking write: a larger RUN forks a shim */
#define SP_STDIN 1u
#define SP_BACKGROUND 2u
static double spare_retry_at; /* after a failed fork: not before then */
static char *agent_argv0;     /* main's argv[0], "adk-sandbox-agent": a spare renames itself in place */
static void close_from(int low);

static void spare_drop(int kill_it) {
    if (!spare.pid) return;
    if (kill_it) send_sig(spare.pid, spare.start, SIGKILL);
    int fds[5] = {spare.control_w, spare.stdin_w, spare.out_r[0], spare.out_r[1], spare.status_r};
    for (int i = 0; i < 5; i++)
        if (fds[i] >= 0) close(fds[i]);
    spare = (spare_t){0, 0, -1, -1, {-1, -1}, -1};
}

static int spare_read(void *data, size_t n) {
    for (size_t at = 0; at < n;) {
        ssize_t r = read(SP_CONTROL, (char *)data + at, n - at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        at += (size_t)r;
    }
    return 0;
}

/* The next string of a message, or NULL when it does not end inside it. */
static char *spare_next(char **at, const char *end) {
    char *s = *at, *z = s < end ? memchr(s, 0, (size_t)(end - s)) : NULL;
    if (!z) return NULL;
    *at = z + 1;
    return s;
}

static void __attribute__((noreturn)) spare_main(pid_t agent, const int *fds) {
    shim_prepare();
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != agent) _exit(0); /* the agent died before the line above */
    /* Its /proc/PID/cmdline says what it is while idle (ps, and whoever counts agents and shims by their
     * argv, tell it apart); at its RUN it takes the agent's name back, as every shim has it. */
    static const char name[] = "adk-sandbox-spare";
    char original[sizeof name];
    int renamed = agent_argv0 && strlen(agent_argv0) == sizeof name - 1;
    if (renamed) { memcpy(original, agent_argv0, sizeof name); memcpy(agent_argv0, name, sizeof name - 1); }
    /* Its descriptors on fixed numbers (0-2 the command's, the rest close-on-exec), nothing else. */
    int moved[SP_FDS];
    for (int i = 0; i < SP_FDS; i++)
        if ((moved[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3 * SP_FDS)) < 0) _exit(126);
    for (int i = 0; i < SP_FDS; i++)
        if ((i <= SP_ERR ? dup2(moved[i], i) : dup3(moved[i], i, O_CLOEXEC)) < 0) _exit(126);
    close_from(SP_FDS);
    int filter_err = shim_filter();
    uint32_t h[4]; /* the message's length after h, flags, argc, envc */
    if (spare_read(h, sizeof h) != 0) _exit(0); /* dropped unused */
    if (h[0] > SPARE_MAX_MESSAGE || h[2] < 1 || h[2] > h[0] || h[3] > h[0]) _exit(126);
    char *body = xrealloc(NULL, h[0]), *at = body, *end = body + h[0];
    char **argv = xrealloc(NULL, ((size_t)h[2] + 1) * sizeof *argv), **envp = xrealloc(NULL, ((size_t)h[3] + 1) * sizeof *envp);
    if (spare_read(body, h[0]) != 0) _exit(0);
    close(SP_CONTROL);
    if (renamed) memcpy(agent_argv0, original, sizeof name - 1);
    char *cwd = spare_next(&at, end);
    for (uint32_t i = 0; i < h[2]; i++) argv[i] = spare_next(&at, end);
    for (uint32_t i = 0; i < h[3]; i++) envp[i] = spare_next(&at, end);
    if (!cwd || !argv[h[2] - 1] || (h[3] && !envp[h[3] - 1])) _exit(126);
    argv[h[2]] = envp[h[3]] = NULL;
    if (!(h[1] & SP_STDIN) && dup2(SP_NULL, 0) < 0) _exit(126); /* the agent closed the stdin pipe's other end */
    close(SP_NULL);
    prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
    shim_run(argv, envp, cwd, SP_STATUS, (h[1] & SP_BACKGROUND) != 0, filter_err);
}

/* A spare, when there is none (the loop calls this while no command runs). Never waits: a fork that fails
 * (the pids limit) is tried again a second later, and a RUN meanwhile forks its shim as usual. */
/* A spare pays where a fork is cheap next to the host's round trip (runc: a fork is ~0.2 ms). Where it is
 * not (gVisor: the sentry's fork takes several ms, measured 1.3x slower per command with spares), the
 * agent is forking the next spare when the next RUN arrives, and that RUN waits for it: after three slow
 * forks in a row (one could be a preemption on a busy machine) the agent makes no more spares and forks
 * each shim at its RUN, as without them. */
#define SPARE_SLOW_FORK 0.002
#define SPARE_SLOW_FORKS 3
static int spares_off, slow_forks;

static void spare_make(void) {
    if (spares_off || spare.pid || host_eof || now() < spare_retry_at) return;
    int p[10] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1}; /* stdin, stdout, stderr, status, control: r, w */
    int ok = 1;
    for (int i = 0; i < 5 && ok; i++) ok = pipe2(p + 2 * i, O_CLOEXEC) == 0;
    double forked_at = now();
    pid_t pid = ok ? fork() : -1;
    if (pid == 0) {
        int fds[SP_FDS] = {p[0], p[3], p[5], p[7], p[8], null_r};
        spare_main(SELF, fds);
    }
    if (pid > 0) { /* this one is used either way */
        slow_forks = now() - forked_at > SPARE_SLOW_FORK ? slow_forks + 1 : 0;
        spares_off = slow_forks >= SPARE_SLOW_FORKS;
    }
    if (pid < 0) { close_pipes(p, 10); spare_retry_at = now() + 1.0; return; }
    close(p[0]); close(p[3]); close(p[5]); close(p[7]); close(p[8]);
    spare = (spare_t){pid, start_of(pid), p[9], p[1], {p[2], p[4]}, p[6]};
    set_nonblock(p[1]);
    set_nonblock(p[2]);
    set_nonblock(p[4]);
    set_nonblock(p[6]);
    set_nonblock(p[9]);
}

/* The RUN to the spare, which becomes c's shim: 1; 0 when there is no usable spare (or the RUN is too
 * large for one write), and the caller forks a shim. */
static int spare_take(cmd_t *c, char **argv, char **envp, const char *cwd, int want_stdin, int background) {
    if (!spare.pid) return 0;
    proc_t st;
    if (stat_of(spare.pid, &st) != 0 || st.start != spare.start || strchr("TtZX", st.state)) {
        spare_drop(1); /* stopped or dying (a command of this uid signalled it): not to be waited for */
        return 0;
    }
    uint32_t h[4] = {0, (want_stdin ? SP_STDIN : 0) | (background ? SP_BACKGROUND : 0), 0, 0};
    buf_t b = {0};
    buf_add(&b, h, sizeof h);
    buf_add(&b, cwd, strlen(cwd) + 1);
    for (char **a = argv; *a; a++, h[2]++) buf_add(&b, *a, strlen(*a) + 1);
    for (char **e = envp; *e; e++, h[3]++) buf_add(&b, *e, strlen(*e) + 1);
    h[0] = (uint32_t)(b.len - sizeof h);
    if (b.len > SPARE_MAX_MESSAGE) { buf_free(&b); return 0; }
    memcpy(b.p, h, sizeof h);
    ssize_t w = write(spare.control_w, b.p, b.len);
    int whole = w == (ssize_t)b.len;
    buf_free(&b);
    if (!whole) { spare_drop(1); return 0; } /* a part of a message starts nothing: the spare is killed */
    c->shim = spare.pid;
    c->shim_start = spare.start;
    c->stdin_fd = want_stdin ? spare.stdin_w : -1;
    if (!want_stdin) close(spare.stdin_w);
    c->out_fd[0] = spare.out_r[0];
    c->out_fd[1] = spare.out_r[1];
    c->status_fd = spare.status_r;
    close(spare.control_w);
    spare = (spare_t){0, 0, -1, -1, {-1, -1}, -1};
    return 1;
}

/* -- terminals (RUN "pty") ------------------------------------------------------------------------------
 * The agent opens the master of a new pseudo-terminal, the shim gets the terminal itself on 0, 1 and 2, and
 * the command makes it its controlling terminal in its own session (spawn_command). The master carries
 * stdout (STDOUT frames, within the host's credit: a terminal's output is not capped but flow-controlled,
 * so a reader that stops stops only its terminal) and stdin (STDIN frames; an empty one closes only the
 * agent's writing copy). RESIZE sets its size (the kernel sends SIGWINCH to its foreground group), SIGNAL
 * signals its foreground process group, as a terminal's keys would. */
#define MAX_PTYS 32               /* frames.MAX_PTYS: terminals per agent */
#define PTY_WINDOW (1ll << 20)    /* frames.PTY_WINDOW: a terminal's output sent before any CREDIT */
#define MAX_PTY_SIDE 10000        /* frames.MAX_PTY_SIDE: rows and columns at most */

static int pty_count(void) {
    int n = 0;
    for (int i = 0; i < ncmds; i++) n += cmds[i]->pty;
    return n;
}

/* RUN's "pty": true with "rows" and "cols", integers 1..MAX_PTY_SIDE; NULL, or why not. */
static const char *want_int(jmember_t *m, int n, const char *key, long long dflt, long long *out_v);
static const char *pty_size(jmember_t *m, int n, long long *rows, long long *cols) {
    const char *why = want_int(m, n, "rows", -1, rows);
    if (!why) why = want_int(m, n, "cols", -1, cols);
    if (why) return why;
    if (*rows < 1 || *rows > MAX_PTY_SIDE || *cols < 1 || *cols > MAX_PTY_SIDE) return "pty rows and cols must be 1..10000";
    return NULL;
}

/* The terminal's master (close-on-exec) and its other end opened; 0 or an errno. */
static int pty_open(int *master, int *slave, unsigned short rows, unsigned short cols) {
    *master = *slave = -1;
    int mfd = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (mfd < 0) return errno;
    int unlock = 0, num = -1;
    struct winsize ws = {rows, cols, 0, 0};
    if (ioctl(mfd, TIOCSPTLCK, &unlock) != 0 || ioctl(mfd, TIOCSWINSZ, &ws) != 0) { int e = errno; close(mfd); return e; }
    /* TIOCGPTPEER opens this master's own terminal (no path a command could swap); older kernels: the path. */
    int sfd = ioctl(mfd, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (sfd < 0 && ioctl(mfd, TIOCGPTN, &num) == 0) {
        char path[64];
        snprintf(path, sizeof path, "/dev/pts/%d", num);
        sfd = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
    }
    if (sfd < 0) { int e = errno ? errno : ENOTTY; close(mfd); return e; }
    *master = mfd;
    *slave = sfd;
    return 0;
}

static int pty_start(cmd_t *c, char **argv, char **envp, const char *cwd, unsigned short rows, unsigned short cols) {
    int master, slave, fds[2] = {-1, -1};
    int err = pty_open(&master, &slave, rows, cols);
    if (err) return err;
    int copy = fcntl(master, F_DUPFD_CLOEXEC, 3);
    if (copy < 0 || pipe2(fds, O_CLOEXEC) != 0) {
        err = errno;
        close(master); close(slave);
        if (copy >= 0) close(copy);
        return err;
    }
    pid_t pid = fork();
    if (pid < 0) {
        err = errno;
        close(master); close(slave); close(copy); close_pipes(fds, 2);
        return err;
    }
    if (pid == 0) {
        pty_command = 1;
        shim(argv, envp, cwd, slave, slave, slave, fds[1], 0);
    }
    close(slave);
    close(fds[1]);
    c->pty = c->paced = 1;
    c->credit = PTY_WINDOW;
    c->cap = 1ll << 62; /* no cap: flow control bounds what is in flight */
    c->shim = pid;
    c->shim_start = start_of(pid);
    c->out_fd[0] = master;
    c->out_fd[1] = -1;
    c->stdin_fd = copy;
    c->status_fd = fds[0];
    set_nonblock(master);
    set_nonblock(copy);
    set_nonblock(fds[0]);
    return 0;
}

/* CREDIT on a paced command's channel, RESIZE and SIGNAL on a terminal's (for another command: dropped, as
 * a late frame). */
static void pty_frame(int kind, cmd_t *c, const unsigned char *payload, size_t n) {
    if (!c || !c->paced || (kind != CREDIT_F && !c->pty)) return;
    jmember_t *m;
    int count;
    const char *err;
    if (jobject(payload, n, &m, &count, &err) != 0) protocol_error("a terminal's frame %d is not a JSON object", kind);
    long long a = 0, b = 0;
    const char *why = NULL;
    if (kind == CREDIT_F) {
        why = want_int(m, count, "bytes", -1, &a);
        if (!why && a < 1) why = "bytes must be >= 1";
        if (!why) c->credit = c->credit + a > (1ll << 40) ? 1ll << 40 : c->credit + a;
    } else if (kind == RESIZE_F) {
        why = want_int(m, count, "rows", -1, &a);
        if (!why) why = want_int(m, count, "cols", -1, &b);
        if (!why && (a < 1 || a > MAX_PTY_SIDE || b < 1 || b > MAX_PTY_SIDE)) why = "rows and cols must be 1..10000";
        struct winsize ws = {(unsigned short)a, (unsigned short)b, 0, 0};
        if (!why && c->out_fd[0] >= 0) (void)ioctl(c->out_fd[0], TIOCSWINSZ, &ws);
    } else {
        why = want_int(m, count, "signal", -1, &a);
        if (!why && (a < 1 || a > 64)) why = "signal must be 1..64";
        /* The terminal's foreground process group: always one of its own session (the kernel allows no
         * other), so nothing outside the command's session can be reached this way. */
        pid_t group = -1;
        if (!why && c->out_fd[0] >= 0 && ioctl(c->out_fd[0], TIOCGPGRP, &group) == 0 && group > 1) kill(-group, (int)a);
    }
    jmembers_free(m, count);
    if (why) protocol_error("a terminal's frame %d: %s", kind, why);
}

static void run(uint32_t ch, const unsigned char *payload, size_t n) {
    if (cmd_of(ch) || op_of(ch)) { out_error(ch, "channel %u is in use", ch); return; }
    if (ncmds >= MAX_COMMANDS) { out_error(ch, "cannot start the command: too many commands at once"); return; }
    jmember_t *m;
    int count;
    const char *err = NULL;
    if (jobject(payload, n, &m, &count, &err) != 0) {
        out_error(ch, "bad RUN: %s", err ? err : "invalid JSON");
        return;
    }
    jval_t *argv_v = jget(m, count, "argv"), *env_v = jget(m, count, "env"), *cwd_v = jget(m, count, "cwd");
    jval_t *timeout_v = jget(m, count, "timeout"), *cap_v = jget(m, count, "max_output_bytes");
    jval_t *stdin_v = jget(m, count, "stdin"), *tail_v = jget(m, count, "tail_bytes");
    jval_t *bg_v = jget(m, count, "background"), *pty_v = jget(m, count, "pty"), *paced_v = jget(m, count, "paced");
    long long rows = 0, cols = 0;
    const char *bad = NULL;
    if (pty_v && pty_v->type != J_BOOL && pty_v->type != J_NULL) bad = "pty must be a boolean";
    else if (pty_v && pty_v->type == J_BOOL && pty_v->b) bad = pty_size(m, count, &rows, &cols);
    else if (paced_v && paced_v->type != J_BOOL && paced_v->type != J_NULL) bad = "paced must be a boolean";
    if (bad) {
    } else if (!argv_v || argv_v->type != J_ARR) bad = "argv must be an array of strings";
    else if (argv_v->n == 0) bad = "empty argv";
    else if (!env_v || env_v->type != J_OBJ) bad = "env must be an object of strings";
    else if (cwd_v && cwd_v->type != J_STR && cwd_v->type != J_NULL) bad = "cwd must be a string";
    else if (timeout_v && timeout_v->type != J_NUM && timeout_v->type != J_NULL) bad = "timeout must be a number";
    else if (timeout_v && timeout_v->type == J_NUM && !(timeout_v->num >= 0 && timeout_v->num <= 1e9)) bad = "timeout out of range";
    else if (cap_v && cap_v->type != J_NUM && cap_v->type != J_NULL) bad = "max_output_bytes must be an integer";
    else if (cap_v && cap_v->type == J_NUM && !(cap_v->num >= 0 && cap_v->num <= 9e15 && cap_v->num == (double)(long long)cap_v->num)) bad = "max_output_bytes must be an integer";
    else if (stdin_v && stdin_v->type != J_BOOL && stdin_v->type != J_NULL) bad = "stdin must be a boolean";
    else if (bg_v && bg_v->type != J_BOOL && bg_v->type != J_NULL) bad = "background must be a boolean";
    else if (tail_v && tail_v->type != J_NUM && tail_v->type != J_NULL) bad = "tail_bytes must be an integer";
    else if (tail_v && tail_v->type == J_NUM && !(tail_v->num >= 0 && tail_v->num <= 1e12 && tail_v->num == (double)(long long)tail_v->num)) bad = "tail_bytes must be an integer";
    if (!bad)
        for (int i = 0; i < env_v->n && !bad; i++)
            if (!env_v->items[i][0] || strchr(env_v->items[i], '=')) bad = "an environment name is empty or holds '='";
    if (bad) { jmembers_free(m, count); out_error(ch, "bad RUN: %s", bad); return; }
    int background = bg_v && bg_v->type == J_BOOL && bg_v->b;
    int pty = rows > 0;
    int paced = pty || (paced_v && paced_v->type == J_BOOL && paced_v->b);
    if (paced && background) bad = "a terminal or a paced command cannot be a background command";
    if (bad) { jmembers_free(m, count); out_error(ch, "bad RUN: %s", bad); return; }
    if (pty && pty_count() >= MAX_PTYS) {
        jmembers_free(m, count);
        buf_t b = {0};
        buf_fmt(&b, "{\"refused\":true,\"message\":\"at most %d terminals may be open at once in this session "
                    "(per user); close one first\"}", MAX_PTYS);
        out_json(ERROR_F, ch, &b);
        return;
    }
    if (background && background_count() >= MAX_GROUPS) prune_groups();
    if (background && background_count() >= MAX_GROUPS) {
        jmembers_free(m, count);
        buf_t b = {0};
        buf_str(&b, "{\"refused\":true,\"message\":\"at most ");
        buf_fmt(&b, "%d", MAX_GROUPS);
        buf_str(&b, " background commands may keep processes at once in this session (per user); end the "
                    "processes one of them left (they count until the last one exits) or run this one without "
                    "background\"}");
        out_json(ERROR_F, ch, &b);
        return;
    }

    cmd_t *c = xrealloc(NULL, sizeof *c);
    memset(c, 0, sizeof *c);
    c->ch = ch;
    c->background = background;
    long long cap = cap_v && cap_v->type == J_NUM ? (long long)cap_v->num : 0;
    c->cap = cap ? cap : 1048576; /* 0 or missing is the default */
    c->tail_cap = tail_v && tail_v->type == J_NUM ? (size_t)tail_v->num : 0;
    double timeout = timeout_v && timeout_v->type == J_NUM ? timeout_v->num : 60.0;
    int want_stdin = stdin_v && stdin_v->type == J_BOOL && stdin_v->b;
    snprintf(c->marker, sizeof c->marker, "ch%u-%d", ch, (int)SELF);

    /* argv and envp for the shim: exactly the RUN's environment (the last of duplicate names) + the marker. */
    char **argv = xrealloc(NULL, ((size_t)argv_v->n + 1) * sizeof *argv);
    for (int i = 0; i < argv_v->n; i++) argv[i] = strdup(argv_v->items[i]);
    argv[argv_v->n] = NULL;
    char **envp = xrealloc(NULL, ((size_t)env_v->n + 2) * sizeof *envp);
    int ne = 0;
    for (int i = 0; i < env_v->n; i++) {
        const char *k = env_v->items[i];
        if (strcmp(k, "ADK_SANDBOX_EXEC") == 0) continue;
        int later = 0;
        for (int j = i + 1; j < env_v->n && !later; j++) later = strcmp(env_v->items[j], k) == 0;
        if (later) continue;
        buf_t b = {0};
        buf_str(&b, k);
        buf_str(&b, "=");
        buf_str(&b, env_v->vals[i]);
        envp[ne++] = b.p;
    }
    buf_t mk = {0};
    buf_str(&mk, "ADK_SANDBOX_EXEC=");
    buf_str(&mk, c->marker);
    envp[ne++] = mk.p;
    envp[ne] = NULL;
    char *cwd = strdup(cwd_v && cwd_v->type == J_STR && cwd_v->s[0] ? cwd_v->s : "/");
    jmembers_free(m, count);

    if (pty) {
        int err = pty_start(c, argv, envp, cwd, (unsigned short)rows, (unsigned short)cols);
        free_strv(argv); free_strv(envp); free(cwd);
        if (err) {
            out_error(ch, "cannot open a terminal: %s", strerror(err));
            free(c);
            return;
        }
        c->deadline = now() + timeout;
        c->oom_before = oom_kills();
        cmds[ncmds++] = c;
        return;
    }
    if (paced) { /* its output is not capped: the host's credit bounds what is in flight */
        c->paced = 1;
        c->credit = PTY_WINDOW;
        c->cap = 1ll << 62;
    }
    if (spare_take(c, argv, envp, cwd, want_stdin, background)) {
        free_strv(argv); free_strv(envp); free(cwd);
        c->deadline = now() + timeout;
        c->oom_before = oom_kills();
        cmds[ncmds++] = c;
        return;
    }
    int fds[8] = {-1, -1, -1, -1, -1, -1, -1, -1}; /* stdin r, w, stdout r, w, stderr r, w, status r, w */
    int ok = 1;
    if (want_stdin) ok = pipe2(fds, O_CLOEXEC) == 0; /* else fds[0] stays -1: the shim gets null_r */
    ok = ok && pipe2(fds + 2, O_CLOEXEC) == 0 && pipe2(fds + 4, O_CLOEXEC) == 0 && pipe2(fds + 6, O_CLOEXEC) == 0;
    pid_t pid = -1;
    int fork_err = errno;
    for (int attempt = 0; ok && attempt < 20; attempt++) {
        pid = fork();
        if (pid >= 0) break;
        fork_err = errno;
        if (errno != EAGAIN) break;
        struct timespec t = {0, 50000000};
        nanosleep(&t, NULL);
    }
    if (!ok || pid < 0) {
        close_pipes(fds, 8);
        out_error(ch, "cannot start the command: %s", pid < 0 && ok ? (fork_err == EAGAIN ? "no room for a process (pids limit)" : strerror(fork_err)) : strerror(errno));
        free_strv(argv); free_strv(envp); free(cwd); free(c);
        return;
    }
    if (pid == 0) shim(argv, envp, cwd, want_stdin ? fds[0] : null_r, fds[3], fds[5], fds[7], background);
    free_strv(argv); free_strv(envp); free(cwd);
    if (fds[0] >= 0) close(fds[0]);
    close(fds[3]); close(fds[5]); close(fds[7]);
    c->shim = pid;
    c->shim_start = start_of(pid);
    c->stdin_fd = want_stdin ? fds[1] : -1;
    c->out_fd[0] = fds[2];
    c->out_fd[1] = fds[4];
    c->status_fd = fds[6];
    c->deadline = now() + timeout;
    c->oom_before = oom_kills();
    set_nonblock(fds[2]);
    set_nonblock(fds[4]);
    set_nonblock(fds[6]);
    if (c->stdin_fd >= 0) set_nonblock(c->stdin_fd);
    cmds[ncmds++] = c;
}

static void read_status(cmd_t *c) {
    if (c->status_fd < 0) return;
    char data[64];
    ssize_t n = read(c->status_fd, data, sizeof data);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) { close(c->status_fd); c->status_fd = -1; return; }
    size_t take = (size_t)n < 64 - c->status_len ? (size_t)n : 64 - c->status_len;
    memcpy(c->status + c->status_len, data, take);
    c->status_len += take;
    c->status[c->status_len] = 0;
}

static char chunk[65536];

/* Add bytes beyond the cap to the stream's tail ring, counting what falls out of it as dropped. The ring
 * is allocated on first use (tail_cap bytes at most), so memory stays bounded however much is written. */
static void tail_keep(cmd_t *c, int which, const char *data, size_t n) {
    size_t cap = c->tail_cap;
    if (!c->tail[which]) c->tail[which] = xrealloc(NULL, cap);
    if (n >= cap) { /* the new bytes fill the ring: everything before their last cap bytes falls out */
        c->dropped[which] += (long long)(c->tail_len[which] + n - cap);
        memcpy(c->tail[which], data + (n - cap), cap);
        c->tail_pos[which] = 0;
        c->tail_len[which] = cap;
        return;
    }
    size_t over = c->tail_len[which] + n > cap ? c->tail_len[which] + n - cap : 0;
    c->dropped[which] += (long long)over;
    size_t pos = c->tail_pos[which], first = cap - pos < n ? cap - pos : n;
    memcpy(c->tail[which] + pos, data, first);
    memcpy(c->tail[which], data + first, n - first);
    c->tail_pos[which] = (pos + n) % cap;
    c->tail_len[which] = c->tail_len[which] + n - over;
}

/* Send the tail ring (oldest byte first) before EXIT, and free it. */
static void tail_send(cmd_t *c, int which) {
    size_t cap = c->tail_cap, len = c->tail_len[which];
    size_t start = (c->tail_pos[which] + cap - len) % (cap ? cap : 1);
    while (len) {
        size_t piece = cap - start < len ? cap - start : len;
        if (piece > 65536) piece = 65536;
        out(which ? STDERR_F : STDOUT_F, c->ch, c->tail[which] + start, piece);
        start = (start + piece) % cap;
        len -= piece;
    }
    free(c->tail[which]);
    c->tail[which] = NULL;
}

/* 1 when bytes came (more may be waiting). */
static int read_output(cmd_t *c, int which) {
    if (c->paced && c->credit <= 0) return 0;
    size_t want = c->paced && c->credit < (long long)sizeof chunk ? (size_t)c->credit : sizeof chunk;
    ssize_t n = read(c->out_fd[which], chunk, want);
    /* A terminal gives a few KiB per read: what is already there more goes into the same frame. */
    while (c->pty && n > 0 && (size_t)n < want) {
        ssize_t more = read(c->out_fd[which], chunk + n, want - (size_t)n);
        if (more <= 0) break; /* EAGAIN, or the end: seen at the next read */
        n += more;
    }
    if (n > 0 && c->paced) c->credit -= n;
    if (n < 0 && errno == EINTR) return 1;
    if (n < 0 && errno == EAGAIN) return 0;
    if (n <= 0) { close(c->out_fd[which]); c->out_fd[which] = -1; return 0; }
    long long room = c->cap - c->sent[which];
    size_t part = room > 0 ? ((long long)n < room ? (size_t)n : (size_t)room) : 0;
    if (part) {
        c->sent[which] += (long long)part;
        out(which ? STDERR_F : STDOUT_F, c->ch, chunk, part);
    }
    if (c->tail_cap && (size_t)n > part) tail_keep(c, which, chunk + part, (size_t)n - part);
    else c->dropped[which] += n - (ssize_t)part;
    return 1;
}

static void write_stdin(cmd_t *c) {
    if (c->stdin_fd < 0) return;
    while (c->pending_at < c->pending.len) {
        size_t left = c->pending.len - c->pending_at;
        ssize_t w = write(c->stdin_fd, c->pending.p + c->pending_at, left < 65536 ? left : 65536);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) return;
        if (w < 0) { /* the command stopped reading: drop the rest */
            c->pending_at = c->pending.len;
            c->stdin_eof = 1;
            break;
        }
        c->pending_at += (size_t)w;
    }
    buf_free(&c->pending);
    c->pending_at = 0;
    if (c->stdin_eof) { close(c->stdin_fd); c->stdin_fd = -1; }
}

/* keep: a background command that exited normally; it becomes a kept group (its pipes stay open, drained). */
static void finish(int index, int keep) {
    cmd_t *c = cmds[index];
    for (int i = 0; i < 2 && !keep; i++)
        if (c->out_fd[i] >= 0) close(c->out_fd[i]);
    if (c->status_fd >= 0) close(c->status_fd);
    if (c->stdin_fd >= 0) close(c->stdin_fd);
    buf_free(&c->pending);
    cmds[index] = cmds[--ncmds];
    for (int i = 0; i < 2; i++) tail_send(c, i);
    char kind = 0, extra[2];
    int value = 0, words = sscanf(c->status, " %c %d %1s", &kind, &value, extra);
    buf_t b = {0};
    if (c->timed_out || c->killed) buf_str(&b, "{\"exit_code\":null,\"signal\":null");
    else if (words == 2 && kind == 'E' && value >= 0 && value <= 255) buf_fmt(&b, "{\"exit_code\":%d,\"signal\":null", value);
    else if (words == 2 && kind == 'S' && value >= 1 && value <= 127) buf_fmt(&b, "{\"exit_code\":null,\"signal\":%d", value);
    else buf_fmt(&b, "{\"exit_code\":null,\"signal\":%d", SIGKILL); /* the shim itself was killed (by its command) */
    buf_fmt(&b, ",\"timed_out\":%s,\"stdout_dropped\":%lld,\"stderr_dropped\":%lld", c->timed_out ? "true" : "false",
            c->dropped[0], c->dropped[1]);
    long long after = oom_kills();
    if (after >= 0 && c->oom_before >= 0 && after >= c->oom_before) buf_fmt(&b, ",\"oom_kills\":%lld}", after - c->oom_before);
    else buf_str(&b, ",\"oom_kills\":null}");
    out_json(EXIT_F, c->ch, &b);
    if (!keep) { free(c); return; }
    c->status_fd = c->stdin_fd = -1;
    groups[ngroups++] = c;
    /* Its keeper gone already, with subreapers: nothing was left. */
    if (c->shim_done && strict_mode) drop_group(ngroups - 1);
}

/* What a kept group writes on its command's pipes: read and dropped. */
static void discard_output(cmd_t *g, int which) {
    ssize_t n = read(g->out_fd[which], chunk, sizeof chunk);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) { close(g->out_fd[which]); g->out_fd[which] = -1; }
}

/* -- file operations: each in a forked worker, so nothing it waits for holds the agent's loop ------------ */
static const char *const OP_NAMES[] = {"read", "write", "stat", "list", "mkdir", "remove", "rename"};
enum { OP_READ, OP_WRITE, OP_STAT, OP_LIST, OP_MKDIR, OP_REMOVE, OP_RENAME, N_OPS };

/* errno names as Python's errno.errorcode spells them (Linux, all); unknown: "EIO". */
static const char *const ERRNO_NAMES[] = {
    [1]="EPERM", [2]="ENOENT", [3]="ESRCH", [4]="EINTR", [5]="EIO", [6]="ENXIO", [7]="E2BIG", [8]="ENOEXEC",
    [9]="EBADF", [10]="ECHILD", [11]="EAGAIN", [12]="ENOMEM", [13]="EACCES", [14]="EFAULT", [15]="ENOTBLK",
    [16]="EBUSY", [17]="EEXIST", [18]="EXDEV", [19]="ENODEV", [20]="ENOTDIR", [21]="EISDIR", [22]="EINVAL",
    [23]="ENFILE", [24]="EMFILE", [25]="ENOTTY", [26]="ETXTBSY", [27]="EFBIG", [28]="ENOSPC", [29]="ESPIPE",
    [30]="EROFS", [31]="EMLINK", [32]="EPIPE", [33]="EDOM", [34]="ERANGE", [35]="EDEADLOCK",
    [36]="ENAMETOOLONG", [37]="ENOLCK", [38]="ENOSYS", [39]="ENOTEMPTY", [40]="ELOOP", [42]="ENOMSG",
    [43]="EIDRM", [44]="ECHRNG", [45]="EL2NSYNC", [46]="EL3HLT", [47]="EL3RST", [48]="ELNRNG", [49]="EUNATCH",
    [50]="ENOCSI", [51]="EL2HLT", [52]="EBADE", [53]="EBADR", [54]="EXFULL", [55]="ENOANO", [56]="EBADRQC",
    [57]="EBADSLT", [59]="EBFONT", [60]="ENOSTR", [61]="ENODATA", [62]="ETIME", [63]="ENOSR", [64]="ENONET",
    [65]="ENOPKG", [66]="EREMOTE", [67]="ENOLINK", [68]="EADV", [69]="ESRMNT", [70]="ECOMM", [71]="EPROTO",
    [72]="EMULTIHOP", [73]="EDOTDOT", [74]="EBADMSG", [75]="EOVERFLOW", [76]="ENOTUNIQ", [77]="EBADFD",
    [78]="EREMCHG", [79]="ELIBACC", [80]="ELIBBAD", [81]="ELIBSCN", [82]="ELIBMAX", [83]="ELIBEXEC",
    [84]="EILSEQ", [85]="ERESTART", [86]="ESTRPIPE", [87]="EUSERS", [88]="ENOTSOCK", [89]="EDESTADDRREQ",
    [90]="EMSGSIZE", [91]="EPROTOTYPE", [92]="ENOPROTOOPT", [93]="EPROTONOSUPPORT", [94]="ESOCKTNOSUPPORT",
    [95]="ENOTSUP", [96]="EPFNOSUPPORT", [97]="EAFNOSUPPORT", [98]="EADDRINUSE", [99]="EADDRNOTAVAIL",
    [100]="ENETDOWN", [101]="ENETUNREACH", [102]="ENETRESET", [103]="ECONNABORTED", [104]="ECONNRESET",
    [105]="ENOBUFS", [106]="EISCONN", [107]="ENOTCONN", [108]="ESHUTDOWN", [109]="ETOOMANYREFS",
    [110]="ETIMEDOUT", [111]="ECONNREFUSED", [112]="EHOSTDOWN", [113]="EHOSTUNREACH", [114]="EALREADY",
    [115]="EINPROGRESS", [116]="ESTALE", [117]="EUCLEAN", [118]="ENOTNAM", [119]="ENAVAIL", [120]="EISNAM",
    [121]="EREMOTEIO", [122]="EDQUOT", [123]="ENOMEDIUM", [124]="EMEDIUMTYPE", [125]="ECANCELED",
    [126]="ENOKEY", [127]="EKEYEXPIRED", [128]="EKEYREVOKED", [129]="EKEYREJECTED", [130]="EOWNERDEAD",
    [131]="ENOTRECOVERABLE", [132]="ERFKILL",
};

static void op_error_json(buf_t *b, int code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *name = code > 0 && (size_t)code < sizeof ERRNO_NAMES / sizeof *ERRNO_NAMES && ERRNO_NAMES[code]
                           ? ERRNO_NAMES[code] : "EIO";
    buf_fmt(b, "{\"error\":{\"errno\":%d,\"name\":\"%s\",\"message\":", code, name);
    buf_json_str(b, msg);
    buf_str(b, "}}");
}

static void out_op_error(uint32_t ch, int code, const char *message) {
    buf_t b = {0};
    op_error_json(&b, code, "%s", message);
    out_json(RESULT, ch, &b);
}

/* A FILE request, validated by the agent before any worker exists. */
typedef struct {
    int op;
    const char *path, *target;
    long long offset, limit, mode;
    int exclusive, append, follow, parents, recursive;
} file_req_t;

/* An integer >= 0 (not a boolean, not a float): missing is dflt (-1: required); null is refused, as Python. */
static const char *want_int(jmember_t *m, int n, const char *key, long long dflt, long long *out_v) {
    jval_t *v = jget(m, n, key);
    if (!v) {
        if (dflt < 0) return "an integer >= 0 is required";
        *out_v = dflt;
        return NULL;
    }
    if (v->type != J_NUM || !v->isint || !(v->num >= 0 && v->num <= 9007199254740992.0)) return "must be an integer >= 0";
    *out_v = (long long)v->num;
    return NULL;
}

/* A boolean flag: missing is dflt, null is false (Python's bool(None)); anything else is refused. */
static const char *want_bool(jmember_t *m, int n, const char *key, int dflt, int *out_v) {
    jval_t *v = jget(m, n, key);
    if (!v) *out_v = dflt;
    else if (v->type == J_NULL) *out_v = 0;
    else if (v->type == J_BOOL) *out_v = v->b;
    else return "must be a boolean";
    return NULL;
}

static const char *want_path(jval_t *v) {
    /* NUL cannot be in a string the reader accepted (\u0000 is refused). */
    if (!v || v->type != J_STR || v->s[0] != '/') return "a path must be an absolute string without NUL";
    return NULL;
}

/* 0: valid; else the errno of the RESULT (EINVAL, or EPERM for set-id and sticky bits) and *why. */
static int parse_file_req(jmember_t *m, int n, file_req_t *q, const char **why, const char **key) {
    memset(q, 0, sizeof *q);
    q->op = -1;
    jval_t *op = jget(m, n, "op");
    *key = "op";
    if (!op || op->type != J_STR) { *why = "op must be a string"; return EINVAL; }
    for (int i = 0; i < N_OPS; i++)
        if (strcmp(op->s, OP_NAMES[i]) == 0) q->op = i;
    if (q->op < 0) { *why = "unknown op"; return EINVAL; }
    *key = "path";
    if ((*why = want_path(jget(m, n, "path")))) return EINVAL;
    q->path = jget(m, n, "path")->s;
    q->follow = 1;
#define NEED(call, k) do { *key = k; if ((*why = (call))) return EINVAL; } while (0)
    switch (q->op) {
    case OP_READ:
        NEED(want_int(m, n, "offset", 0, &q->offset), "offset");
        NEED(want_int(m, n, "limit", -1, &q->limit), "limit");
        break;
    case OP_WRITE:
    case OP_MKDIR:
        NEED(want_int(m, n, "mode", q->op == OP_WRITE ? 0644 : 0755, &q->mode), "mode");
        if (q->mode > 07777) { *why = "mode is out of range"; return EINVAL; }
        if (q->op == OP_WRITE) {
            NEED(want_bool(m, n, "exclusive", 0, &q->exclusive), "exclusive");
            NEED(want_bool(m, n, "append", 0, &q->append), "append");
        } else NEED(want_bool(m, n, "parents", 0, &q->parents), "parents");
        if (q->mode & ~0777LL) { *key = NULL; *why = "set-id and sticky bits are not allowed"; return EPERM; }
        break;
    case OP_STAT: NEED(want_bool(m, n, "follow", 1, &q->follow), "follow"); break;
    case OP_REMOVE: NEED(want_bool(m, n, "recursive", 0, &q->recursive), "recursive"); break;
    case OP_RENAME:
        NEED(want_path(jget(m, n, "target")), "target");
        q->target = jget(m, n, "target")->s;
        break;
    }
#undef NEED
    *key = NULL;
    return 0;
}

/* -- in the worker -- */
static int write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* 1: n bytes read; 0: the pipe ended first; -1: error. */
static int read_exact(int fd, void *data, size_t n) {
    char *p = data;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 0;
        p += r;
        n -= (size_t)r;
    }
    return 1;
}

static char wbuf[65536];

/* The data of a write: (u32 length, bytes) chunks ending with a 0 length. A pipe that ends without that
 * end mark (the agent died, the host gave up) is an abandoned write, never a short one. */
static int copy_in(int src, int dst, long long *size) {
    *size = 0;
    for (;;) {
        unsigned char h[4];
        int got = read_exact(src, h, 4);
        if (got <= 0) { errno = ECANCELED; return -1; }
        uint32_t n = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
        if (n == 0) return 0;
        while (n) {
            size_t take = n < sizeof wbuf ? n : sizeof wbuf;
            if (read_exact(src, wbuf, take) <= 0) { errno = ECANCELED; return -1; }
            if (write_all(dst, wbuf, take) != 0) return -1;
            n -= (uint32_t)take;
            *size += (long long)take;
        }
    }
}

/* O_NONBLOCK: opening a FIFO (or a device) must not wait for a peer; only regular files are used. */
static int open_regular(const char *path, int flags, mode_t mode, struct stat *st) {
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, mode);
    if (fd < 0) return -1;
    if (fstat(fd, st) != 0) { int e = errno; close(fd); errno = e; return -1; }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        errno = S_ISDIR(st->st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    return fd;
}

/* The length of Python's os.path.dirname of p[0..n). */
static size_t dirname_len(const char *p, size_t n) {
    size_t i = n;
    while (i > 0 && p[i - 1] != '/') i--;
    size_t head = i;
    while (head > 0 && p[head - 1] == '/') head--;
    return head ? head : i; /* all slashes: kept */
}

static int make_dirs(const char *path, mode_t mode) {
    size_t n = strlen(path);
    char *p = xrealloc(NULL, n + 1);
    size_t *todo = xrealloc(NULL, (n + 2) * sizeof *todo);
    int depth = 0, rc = 0;
    todo[depth++] = n;
    while (depth) {
        size_t len = todo[depth - 1];
        memcpy(p, path, len);
        p[len] = 0;
        if (mkdir(p, mode) != 0) {
            if (errno == ENOENT) {
                size_t parent = dirname_len(p, len);
                if (parent == len || depth > (int)n) { rc = -1; break; }
                todo[depth++] = parent;
                continue;
            }
            int e = errno;
            struct stat st;
            if (e != EEXIST) { rc = -1; break; }
            if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) { errno = EEXIST; rc = -1; break; } /* not a directory */
        }
        depth--;
    }
    int e = errno;
    free(p);
    free(todo);
    errno = e;
    return rc;
}

/* Everything below the directory fd, then its entries: one descriptor per level and one directory stream at
 * a time (bounded memory at any depth), never following a symlink (O_NOFOLLOW | O_DIRECTORY at every step;
 * a link inside the tree is unlinked itself). */
static int remove_tree(const char *path) {
    typedef struct { int fd; char *name; } level_t;
    int cap = 16, depth = 0, rc = 0;
    level_t *stack = xrealloc(NULL, (size_t)cap * sizeof *stack);
    int top = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (top < 0) { free(stack); return -1; }
    stack[depth++] = (level_t){top, NULL};
    while (depth && rc == 0) {
        level_t *lv = &stack[depth - 1];
        int dup_fd = fcntl(lv->fd, F_DUPFD_CLOEXEC, 0);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) { if (dup_fd >= 0) close(dup_fd); rc = -1; break; }
        rewinddir(d);
        char *sub = NULL;
        struct dirent *e;
        errno = 0;
        while ((e = readdir(d))) {
            const char *name = e->d_name;
            if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
            int isdir = e->d_type == DT_DIR;
            if (e->d_type == DT_UNKNOWN) {
                struct stat st;
                isdir = fstatat(lv->fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
            }
            if (isdir) { sub = strdup(name); break; }
            if (unlinkat(lv->fd, name, 0) != 0) { rc = -1; break; }
            errno = 0;
        }
        if (!e && errno && rc == 0) rc = -1; /* readdir failed */
        int saved = errno;
        closedir(d);
        errno = saved;
        if (rc) { free(sub); break; }
        if (sub) {
            int fd = openat(lv->fd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0) { free(sub); rc = -1; break; }
            if (depth == cap) { cap *= 2; stack = xrealloc(stack, (size_t)cap * sizeof *stack); }
            stack[depth++] = (level_t){fd, sub};
            continue;
        }
        /* This level is empty: close it and remove it from its parent. */
        close(lv->fd);
        char *name = lv->name;
        depth--;
        if (depth && unlinkat(stack[depth - 1].fd, name, AT_REMOVEDIR) != 0) rc = -1;
        free(name);
    }
    int saved = errno;
    for (int i = 0; i < depth; i++) { close(stack[i].fd); free(stack[i].name); }
    free(stack);
    if (rc == 0 && rmdir(path) != 0) return -1;
    errno = saved;
    return rc;
}

static char entry_type(int dfd, const struct dirent *e) {
    unsigned char t = e->d_type;
    if (t == DT_UNKNOWN) {
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 'o';
        t = S_ISLNK(st.st_mode) ? DT_LNK : S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
    }
    return t == DT_LNK ? 'l' : t == DT_DIR ? 'd' : t == DT_REG ? 'f' : 'o';
}

static const char *kind_of(mode_t m) {
    return S_ISREG(m) ? "file" : S_ISDIR(m) ? "dir" : S_ISLNK(m) ? "symlink" : "other";
}

/* What a write that replaces its path finds there: 1 and *old for a regular file the command user may
 * write, 0 for nothing to keep (no entry, a symlink, a FIFO, socket or device: replaced as a new file),
 * -1 with errno when the write is refused. Opening the file O_WRONLY (no O_TRUNC: nothing changes) is
 * the kernel's own answer for this user, as `open(path, "w")` would get it; O_NOFOLLOW: a symlink is
 * replaced, never followed nor asked; O_NONBLOCK: a FIFO never holds the worker. A running program
 * cannot be opened for writing (ETXTBSY) yet may be replaced: access(W_OK) decides (the worker's real
 * and effective ids are the same). The rename later replaces the directory entry only, so whatever the
 * command swaps in meanwhile is replaced, never written through. */
static int existing_target(const char *path, struct stat *old) {
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0) {
        int rc = fstat(fd, old) != 0 ? -1 : S_ISREG(old->st_mode) ? 1 : 0;
        int e = errno;
        close(fd);
        errno = e;
        return rc;
    }
    if (errno == ENOENT || errno == ELOOP || errno == ENXIO) return 0;
    if (errno != ETXTBSY) return -1;
    if (lstat(path, old) != 0) return -1;
    if (!S_ISREG(old->st_mode)) return 0;
    if (access(path, W_OK) != 0) { errno = EACCES; return -1; }
    return 1;
}

/* The replacement keeps the old file's owner as far as the command user may give it (no CAP_CHOWN: its
 * own uid, a group it is in; otherwise it stays the command user's) and its permission bits. */
static int keep_owner_and_mode(int fd, const struct stat *old) {
    struct stat now;
    if (fstat(fd, &now) != 0) return -1;
    if ((now.st_uid != old->st_uid || now.st_gid != old->st_gid) && fchown(fd, old->st_uid, old->st_gid) != 0)
        (void)fchown(fd, (uid_t)-1, old->st_gid);
    return fchmod(fd, old->st_mode & 0777); /* after fchown, which clears set-id bits; never set-id bits */
}

/* The operation itself: its result object in *res; -1 with errno (and *msg if not strerror's) on failure. */
static int file_op(const file_req_t *q, int out_fd, int data_in, const char *tmp, buf_t *res, const char **msg) {
    struct stat st;
    switch (q->op) {
    case OP_READ: {
        int fd = open_regular(q->path, O_RDONLY, 0, &st);
        if (fd < 0) { if (errno == EINVAL) *msg = "not a regular file"; return -1; }
        long long offset = q->offset, limit = q->limit;
        while (limit > 0) {
            ssize_t r = pread(fd, wbuf, limit < (long long)sizeof wbuf ? (size_t)limit : sizeof wbuf, (off_t)offset);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 || (r > 0 && write_all(out_fd, wbuf, (size_t)r) != 0)) { int e = errno; close(fd); errno = e; return -1; }
            if (r == 0) break;
            offset += r;
            limit -= r;
        }
        close(fd);
        buf_fmt(res, "{\"size\":%lld}", (long long)st.st_size);
        return 0;
    }
    case OP_WRITE: {
        long long size = 0;
        if (q->append) {
            int fd = open_regular(q->path, O_WRONLY | O_APPEND | O_CREAT | (q->exclusive ? O_EXCL : 0), (mode_t)q->mode, &st);
            if (fd < 0) { if (errno == EINVAL) *msg = "not a regular file"; return -1; }
            int rc = copy_in(data_in, fd, &size);
            int e = errno;
            close(fd);
            errno = e;
            if (rc) { if (errno == ECANCELED) *msg = "the data of this write did not arrive in full"; return -1; }
            buf_fmt(res, "{\"size\":%lld}", size);
            return 0;
        }
        if (lstat(q->path, &st) == 0) {
            if (S_ISDIR(st.st_mode)) { errno = EISDIR; return -1; }
            if (q->exclusive) { errno = EEXIST; return -1; }
        } else if (errno != ENOENT) return -1;
        struct stat old;
        int keep = q->exclusive ? 0 : existing_target(q->path, &old);
        if (keep < 0) {
            if (errno == EACCES || errno == EPERM) *msg = "Permission denied: the command user may not write this file; it was left unchanged";
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, keep ? 0600 : (mode_t)q->mode);
        if (fd < 0) return -1;
        int rc = copy_in(data_in, fd, &size);
        int e = errno;
        if (rc == 0 && keep && keep_owner_and_mode(fd, &old) != 0) { rc = -1; e = errno; }
        if (close(fd) != 0 && rc == 0) { rc = -1; e = errno; }
        if (rc == 0) {
            if (q->exclusive) { /* link fails if path appeared meanwhile: exclusive without a race */
                rc = link(tmp, q->path);
                e = errno;
                if (rc == 0) unlink(tmp);
            } else {
                rc = rename(tmp, q->path);
                e = errno;
            }
        }
        if (rc) {
            unlink(tmp);
            errno = e;
            if (e == ECANCELED) *msg = "the data of this write did not arrive in full";
            return -1;
        }
        buf_fmt(res, "{\"size\":%lld}", size);
        return 0;
    }
    case OP_STAT:
        if ((q->follow ? stat(q->path, &st) : lstat(q->path, &st)) != 0) return -1;
        buf_fmt(res, "{\"type\":\"%s\",\"size\":%lld,\"mode\":%u,\"mtime\":%.17g,\"uid\":%u,\"gid\":%u}",
                kind_of(st.st_mode), (long long)st.st_size, (unsigned)(st.st_mode & 07777),
                (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9, (unsigned)st.st_uid, (unsigned)st.st_gid);
        return 0;
    case OP_LIST: {
        DIR *d = opendir(q->path);
        if (!d) return -1;
        long long count = 0;
        buf_t b = {0};
        struct dirent *e;
        errno = 0;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char t = entry_type(dirfd(d), e);
            buf_add(&b, &t, 1);
            buf_add(&b, e->d_name, strlen(e->d_name) + 1);
            count++;
            if (b.len >= 65536) {
                if (write_all(out_fd, b.p, b.len) != 0) { int x = errno; closedir(d); buf_free(&b); errno = x; return -1; }
                b.len = 0;
            }
            errno = 0;
        }
        int x = errno;
        closedir(d);
        if (x) { buf_free(&b); errno = x; return -1; }
        int rc = b.len ? write_all(out_fd, b.p, b.len) : 0;
        buf_free(&b);
        if (rc) return -1;
        buf_fmt(res, "{\"count\":%lld}", count);
        return 0;
    }
    case OP_MKDIR:
        if ((q->parents ? make_dirs(q->path, (mode_t)q->mode) : mkdir(q->path, (mode_t)q->mode)) != 0) return -1;
        buf_str(res, "{}");
        return 0;
    case OP_REMOVE:
        if (lstat(q->path, &st) != 0) return -1; /* lstat: a symlink is removed itself, never followed */
        if (S_ISDIR(st.st_mode)) {
            if ((q->recursive ? remove_tree(q->path) : rmdir(q->path)) != 0) return -1;
        } else if (unlink(q->path) != 0) return -1;
        buf_str(res, "{}");
        return 0;
    case OP_RENAME:
        if (rename(q->path, q->target) != 0) return -1;
        buf_str(res, "{}");
        return 0;
    }
    errno = EINVAL;
    return -1;
}

static void close_from(int low) {
    if (syscall(SYS_close_range, low, ~0U, 0) == 0) return;
    DIR *d = opendir("/proc/self/fd");
    int fds[4096], n = 0, dfd = d ? dirfd(d) : -1;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 4096) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd >= low && fd != dfd) fds[n++] = fd;
    }
    if (d) closedir(d);
    for (int i = 0; i < n; i++) close(fds[i]);
}

/* In the forked worker: non-dumpable, nothing but its pipes, umask 0 (modes exact), the set-id filter with
 * no_new_privs (unless setid_allowed; the file operations refuse set-id modes by themselves either way);
 * then the operation, its result written in one piece (atomic: below PIPE_BUF) and exit. */
static void __attribute__((noreturn)) worker(const file_req_t *q, int out_fd, int status_w, int data_in, const char *tmp) {
    SELF = getpid();
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, NULL); /* SIGPIPE stays ignored: a closed pipe is EPIPE, not death */
    int want[3] = {out_fd, status_w, data_in};
    for (int i = 0; i < 3; i++)
        if (want[i] >= 0 && (want[i] = fcntl(want[i], F_DUPFD, 10)) < 0) _exit(1);
    for (int i = 0; i < 3; i++)
        if (want[i] >= 0 && dup2(want[i], 3 + i) < 0) _exit(1);
    close_from(data_in >= 0 ? 6 : 5);
    out_fd = 3;
    status_w = 4;
    data_in = data_in >= 0 ? 5 : -1;
    umask(0);
    buf_t res = {0};
    const char *msg = NULL;
    int filter_err = shim_filter();
    if (filter_err == EOPNOTSUPP && SETID_FILTER_LEN == 0) op_error_json(&res, EOPNOTSUPP, "no set-id seccomp filter for this architecture");
    else if (filter_err) op_error_json(&res, filter_err, "cannot install the set-id seccomp filter: %s", strerror(filter_err));
    else if (file_op(q, out_fd, data_in, tmp, &res, &msg) != 0) {
        int e = errno ? errno : EIO;
        res.len = 0;
        op_error_json(&res, e, "%s", msg ? msg : strerror(e));
    }
    close(out_fd);
    buf_str(&res, "\n");
    (void)write_all(status_w, res.p, res.len);
    _exit(0);
}

/* -- in the agent -- */
static void start_op(uint32_t ch, const unsigned char *payload, size_t n) {
    if (cmd_of(ch) || op_of(ch)) {
        char m[64];
        snprintf(m, sizeof m, "channel %u is in use", ch);
        out_op_error(ch, EBUSY, m);
        return;
    }
    if (nops >= MAX_OPS) { out_op_error(ch, EAGAIN, "cannot start the file operation: too many at once"); return; }
    jmember_t *m;
    int count;
    const char *err = NULL, *key = NULL;
    if (jobject(payload, n, &m, &count, &err) != 0) {
        char why[300];
        snprintf(why, sizeof why, "bad FILE request: %s", err ? err : "invalid JSON");
        out_op_error(ch, EINVAL, why);
        return;
    }
    file_req_t q;
    int code = parse_file_req(m, count, &q, &err, &key);
    if (code) {
        char why[300];
        if (code == EINVAL) snprintf(why, sizeof why, "bad FILE request: %s%s%s", key ? key : "", key ? " " : "", err);
        else snprintf(why, sizeof why, "%s", err);
        jmembers_free(m, count);
        out_op_error(ch, code, why);
        return;
    }
    op_t *o = xrealloc(NULL, sizeof *o);
    memset(o, 0, sizeof *o);
    o->ch = ch;
    o->out_fd = o->status_fd = o->stdin_fd = -1;
    o->cap = q.op == OP_READ ? q.limit : 1LL << 62;
    if (q.op == OP_WRITE && !q.append) {
        /* Chosen here, so the agent can remove it if the worker is killed mid-write. */
        unsigned char rnd[8];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (unsigned char)(rand() ^ (int)now());
        }
        size_t dl = dirname_len(q.path, strlen(q.path));
        buf_t t = {0};
        buf_add(&t, q.path, dl);
        if (!dl || t.p[dl - 1] != '/') buf_str(&t, "/");
        buf_str(&t, ".adk-sandbox-write-");
        for (size_t i = 0; i < sizeof rnd; i++) buf_fmt(&t, "%02x", rnd[i]);
        o->tmp = t.p;
    }
    int fds[6] = {-1, -1, -1, -1, -1, -1}; /* data r, w, status r, w, write-data r, w */
    int ok = pipe2(fds, O_CLOEXEC) == 0 && pipe2(fds + 2, O_CLOEXEC) == 0 &&
             (q.op != OP_WRITE || pipe2(fds + 4, O_CLOEXEC) == 0);
    int fork_err = errno;
    pid_t pid = -1;
    for (int attempt = 0; ok && attempt < 20; attempt++) {
        pid = fork();
        if (pid >= 0) break;
        fork_err = errno;
        if (errno != EAGAIN) break;
        struct timespec t = {0, 50000000};
        nanosleep(&t, NULL);
    }
    if (!ok || pid < 0) {
        close_pipes(fds, 6);
        jmembers_free(m, count);
        char why[200];
        snprintf(why, sizeof why, "cannot start the file operation: %s",
                 ok && fork_err == EAGAIN ? "no room for a process (pids limit)" : strerror(fork_err));
        out_op_error(ch, fork_err ? fork_err : EIO, why);
        free(o->tmp);
        free(o);
        return;
    }
    if (pid == 0) worker(&q, fds[1], fds[3], fds[4], o->tmp);
    jmembers_free(m, count);
    close(fds[1]);
    close(fds[3]);
    if (fds[4] >= 0) close(fds[4]);
    o->pid = pid;
    o->start = start_of(pid);
    o->out_fd = fds[0];
    o->status_fd = fds[2];
    o->stdin_fd = fds[5];
    set_nonblock(o->out_fd);
    set_nonblock(o->status_fd);
    if (o->stdin_fd >= 0) set_nonblock(o->stdin_fd);
    ops[nops++] = o;
}

static void write_op_stdin(op_t *o) {
    if (o->stdin_fd < 0) return;
    while (o->pending_at < o->pending.len) {
        size_t left = o->pending.len - o->pending_at;
        ssize_t w = write(o->stdin_fd, o->pending.p + o->pending_at, left < 65536 ? left : 65536);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) break;
        if (w < 0) { /* the worker is gone (it failed early, or was killed): the rest is dropped */
            o->pending_at = o->pending.len;
            o->stdin_eof = 1;
            break;
        }
        o->pending_at += (size_t)w;
    }
    if (o->pending_at == o->pending.len) { buf_free(&o->pending); o->pending_at = 0; }
    else if (o->pending_at > (1u << 20) && o->pending_at > o->pending.len / 2) { /* compact: memory stays bounded */
        memmove(o->pending.p, o->pending.p + o->pending_at, o->pending.len - o->pending_at);
        o->pending.len -= o->pending_at;
        o->pending_at = 0;
    }
    if (o->stdin_eof && !o->pending.len) { close(o->stdin_fd); o->stdin_fd = -1; }
}

static void op_input(op_t *o, const unsigned char *payload, uint32_t n) {
    if (o->stdin_fd < 0 || o->stdin_eof) return;
    unsigned char h[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n};
    buf_add(&o->pending, h, 4); /* framed: see copy_in */
    if (n) buf_add(&o->pending, payload, n);
    else o->stdin_eof = 1;
    write_op_stdin(o);
}

static void kill_op(op_t *o) {
    o->killed = 1;
    if (o->stdin_fd >= 0) { close(o->stdin_fd); o->stdin_fd = -1; }
    buf_free(&o->pending);
    o->pending_at = 0;
    if (!o->done) send_sig(o->pid, o->start, SIGKILL);
}

static void read_op_output(op_t *o) {
    ssize_t n = read(o->out_fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) { close(o->out_fd); o->out_fd = -1; return; }
    long long room = o->cap - o->sent;
    size_t part = room > 0 ? ((long long)n < room ? (size_t)n : (size_t)room) : 0;
    if (part) {
        o->sent += (long long)part;
        out(STDOUT_F, o->ch, chunk, part);
    }
    o->dropped += n - (ssize_t)part;
}

static void read_op_status(op_t *o) {
    if (o->status_fd < 0) return;
    char data[4096];
    ssize_t n = read(o->status_fd, data, sizeof data);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) { close(o->status_fd); o->status_fd = -1; return; }
    size_t room = sizeof o->status - 1 - o->status_len, take = (size_t)n < room ? (size_t)n : room;
    memcpy(o->status + o->status_len, data, take);
    o->status_len += take;
    o->status[o->status_len] = 0;
}

static void finish_op(int index) {
    op_t *o = ops[index];
    if (o->out_fd >= 0) close(o->out_fd);
    if (o->status_fd >= 0) close(o->status_fd);
    if (o->stdin_fd >= 0) close(o->stdin_fd);
    buf_free(&o->pending);
    ops[index] = ops[--nops];
    /* The worker's result (written in one piece, so whole or absent): also when it finished before a KILL. */
    int whole = o->status_len >= 3 && o->status[0] == '{' && o->status[o->status_len - 1] == '\n' &&
                memchr(o->status, '\n', o->status_len) == o->status + o->status_len - 1;
    buf_t b = {0};
    if (whole) buf_add(&b, o->status, o->status_len - 1);
    else if (o->killed) op_error_json(&b, ECANCELED, "the file operation was cancelled");
    else op_error_json(&b, EIO, "the file operation's worker ended without a result");
    if (o->tmp && strncmp(b.p, "{\"error\"", 8) == 0) unlink(o->tmp); /* a write that did not finish */
    out_json(RESULT, o->ch, &b);
    free(o->tmp);
    free(o);
}

/* -- connections: the proxy endpoint (LISTEN, OPEN, DATA, CREDIT, CLOSE; see frames.py) ------------------
 * Bytes only, never parsed: the host decides everything. Each direction of a connection has a window
 * (WINDOW, returned by CREDIT): a socket is read only while the host has room for its bytes, and at most a
 * window of the host's bytes waits here for a client that reads slowly. At most MAX_CONNS at once. */
#define CONN_BASE 0x80000000u /* frames.CONNECTION_BASE */
#define DIAL_BASE 0xC0000000u /* frames.DIAL_BASE: the host's DIAL channels; the agent's stay below */
#define WINDOW (256u << 10)   /* frames.WINDOW */
#define MAX_CONNS 256         /* frames.MAX_CONNECTIONS */
#define MAX_LISTENERS 64      /* frames.MAX_LISTENERS */
#define LINGER 30.0 /* frames.CLOSE_LINGER_SECONDS */

/* A listener's direct path (LISTEN "unix" and "token", when the probe reached the socket): each accepted
 * connection's socket is passed to the host over its Unix socket, after the token, instead of as frames. */
typedef struct { uint32_t ch; int fd; int direct; char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; char token[257]; } listener_t;
static listener_t listeners[MAX_LISTENERS];
static int nlisteners;

typedef struct {
    uint32_t ch;
    int fd;
    long long credit;  /* DATA bytes the host still lets us send */
    buf_t pending;     /* the host's bytes not yet written to the socket (at most WINDOW) */
    size_t pending_at;
    size_t ungranted;  /* written to the socket, credit not yet returned */
    int eof_in, eof_out, shut;
    double closing;    /* > 0: the host CLOSEd it; write what is pending by then, then close */
    int connecting;    /* a DIAL's port while its connect is in progress (0: connected) */
} conn_t;
static conn_t *conns[MAX_CONNS];
static int nconns;
static unsigned long long next_conn = CONN_BASE;

static int listener_index(uint32_t ch) {
    for (int i = 0; i < nlisteners; i++)
        if (listeners[i].ch == ch) return i;
    return -1;
}

static conn_t *conn_of(uint32_t ch) {
    for (int i = 0; i < nconns; i++)
        if (conns[i]->ch == ch) return conns[i];
    return NULL;
}

static int conn_live(const conn_t *n) {
    for (int i = 0; i < nconns; i++)
        if (conns[i] == n) return 1;
    return 0;
}

static void close_listener(int i) {
    close(listeners[i].fd);
    listeners[i] = listeners[--nlisteners];
}

/* A non-blocking connection to the host's Unix socket at path, or -1 (a full backlog is a failure too). */
static int direct_connect(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un a = {0};
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, path, strlen(path));
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    return fd;
}

/* An accepted connection on a direct listener: to the host's socket, the token, then one byte carrying the
 * client's socket (SCM_RIGHTS). The host serves that socket itself (it reads, decides and splices; nothing is
 * copied here); both descriptors here are closed at once. Any failure leaves the client's connection closed. */
static void direct_open(const listener_t *l, int client) {
    int host = direct_connect(l->unix_path);
    size_t len = strlen(l->token);
    /* A fresh socket's buffer takes the token and the byte whole; a short write is a failure. */
    if (host >= 0 && send(host, l->token, len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)len) {
        char one = 0;
        struct iovec iov = {&one, 1};
        union { struct cmsghdr h; char space[CMSG_SPACE(sizeof(int))]; } control;
        memset(&control, 0, sizeof control);
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.space;
        msg.msg_controllen = sizeof control.space;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &client, sizeof(int));
        (void)sendmsg(host, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (host >= 0) close(host);
    close(client);
}

static void listen_req(uint32_t ch, const unsigned char *payload, size_t n) {
    jmember_t *m;
    int count;
    const char *err;
    long long port = -1;
    if (jobject(payload, n, &m, &count, &err) != 0) { out_op_error(ch, EINVAL, "bad LISTEN: not a JSON object"); return; }
    const char *why = want_int(m, count, "port", -1, &port);
    /* An optional address, in 127.0.0.0/8 only (a sibling service's name resolves there). */
    struct in_addr at = {htonl(INADDR_LOOPBACK)};
    char address[INET_ADDRSTRLEN] = "127.0.0.1";
    jval_t *given = jget(m, count, "address");
    int bad_address = given && (given->type != J_STR || inet_pton(AF_INET, given->s, &at) != 1 ||
                                (ntohl(at.s_addr) >> 24) != 127);
    if (given && !bad_address) inet_ntop(AF_INET, &at, address, sizeof address);
    /* The direct path (both or neither; the host checked them): a Unix socket path and the token. */
    jval_t *unix_v = jget(m, count, "unix"), *token_v = jget(m, count, "token");
    listener_t made = {0};
    int asked_direct = unix_v != NULL;
    int bad_direct = (unix_v != NULL) != (token_v != NULL);
    if (unix_v && token_v) {
        bad_direct = bad_direct || unix_v->type != J_STR || token_v->type != J_STR || unix_v->s[0] != '/' ||
                     strlen(unix_v->s) >= sizeof made.unix_path || strlen(token_v->s) < 16 ||
                     strlen(token_v->s) >= sizeof made.token;
        if (!bad_direct) {
            made.direct = 1;
            strcpy(made.unix_path, unix_v->s);
            strcpy(made.token, token_v->s);
        }
    }
    jmembers_free(m, count);
    if (bad_direct) { out_op_error(ch, EINVAL, "bad LISTEN: unix must be an absolute path and token 16..256 bytes, together"); return; }
    if (why || port > 65535) { out_op_error(ch, EINVAL, "bad LISTEN: port must be an integer 0..65535"); return; }
    if (bad_address) { out_op_error(ch, EINVAL, "bad LISTEN: the address must be an IPv4 address in 127.0.0.0/8"); return; }
    if (listener_index(ch) >= 0 || nlisteners >= MAX_LISTENERS) { out_op_error(ch, EBUSY, "no room for another listener"); return; }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr = at;
    socklen_t alen = sizeof a;
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0) {
        int e = errno;
        char msg[128];
        snprintf(msg, sizeof msg, "cannot listen on %s:%lld: %s", address, port, strerror(e));
        if (fd >= 0) close(fd);
        out_op_error(ch, e, msg);
        return;
    }
    made.ch = ch;
    made.fd = fd;
    if (made.direct) { /* the probe: a connect, closed at once without a byte (the host logs nothing) */
        int probe = direct_connect(made.unix_path);
        if (probe < 0) made.direct = 0;
        else close(probe);
    }
    listeners[nlisteners++] = made;
    buf_t b = {0};
    if (asked_direct) buf_fmt(&b, "{\"port\":%d,\"mode\":\"%s\"}", (int)ntohs(a.sin_port), made.direct ? "unix" : "frames");
    else buf_fmt(&b, "{\"port\":%d}", (int)ntohs(a.sin_port));
    out_json(RESULT, ch, &b);
}

static void drop_conn(conn_t *n) {
    for (int i = 0; i < nconns; i++)
        if (conns[i] == n) { conns[i] = conns[--nconns]; break; }
    close(n->fd);
    buf_free(&n->pending);
    free(n);
}

static void abort_conn(conn_t *n, const char *why) {
    buf_t b = {0};
    buf_str(&b, "{\"error\":");
    buf_json_str(&b, why);
    buf_str(&b, "}");
    out_json(CLOSE_F, n->ch, &b);
    drop_conn(n);
}

static void accept_conns(int li) {
    uint32_t lch = listeners[li].ch;
    for (int k = 0; k < 64; k++) { /* a burst, then back to the loop: commands and other connections go on */
        /* A direct listener's client is passed to the host, which splices it: left blocking for it. */
        int fd = accept4(listeners[li].fd, NULL, NULL, (listeners[li].direct ? 0 : SOCK_NONBLOCK) | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or EMFILE and the like: the connection waits in the backlog */
        if (nconns >= MAX_CONNS || next_conn >= DIAL_BASE) { close(fd); continue; } /* the cap holds */
        if (listeners[li].direct) { direct_open(&listeners[li], fd); continue; }
        conn_t *n = xrealloc(NULL, sizeof *n);
        *n = (conn_t){0};
        n->ch = (uint32_t)next_conn++;
        n->fd = fd;
        n->credit = WINDOW;
        conns[nconns++] = n;
        buf_t b = {0};
        buf_fmt(&b, "{\"listener\":%u}", lch);
        out_json(OPEN_F, n->ch, &b);
    }
}

static void conn_done(conn_t *n) {
    /* Both directions ended and everything written: the connection is over. */
    if (n->eof_out && n->eof_in && n->shut && n->pending.len == n->pending_at) {
        out(CLOSE_F, n->ch, "{}", 2);
        drop_conn(n);
    }
}

static void conn_write(conn_t *n) {
    if (n->connecting) return;
    while (n->pending.len > n->pending_at) {
        size_t want = n->pending.len - n->pending_at;
        ssize_t w = send(n->fd, n->pending.p + n->pending_at, want > 65536 ? 65536 : want, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        if (w < 0) {
            if (n->closing > 0) drop_conn(n);
            else {
                char why[96];
                snprintf(why, sizeof why, "write: %s", strerror(errno));
                abort_conn(n, why);
            }
            return;
        }
        n->pending_at += (size_t)w;
        n->ungranted += (size_t)w;
    }
    if (n->pending_at == n->pending.len) n->pending.len = n->pending_at = 0;
    if (n->closing <= 0 && n->ungranted >= WINDOW / 4) {
        buf_t b = {0};
        buf_fmt(&b, "{\"bytes\":%zu}", n->ungranted);
        out_json(CREDIT_F, n->ch, &b);
        n->ungranted = 0;
    }
    if (n->pending.len) return;
    if (n->closing > 0) { drop_conn(n); return; }
    if (n->eof_in && !n->shut) { n->shut = 1; shutdown(n->fd, SHUT_WR); }
    conn_done(n);
}

static void conn_read(conn_t *n) {
    if (n->credit <= 0 || n->eof_out || n->closing > 0) return;
    size_t want = n->credit < (long long)sizeof chunk ? (size_t)n->credit : sizeof chunk;
    ssize_t r = recv(n->fd, chunk, want, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (r < 0) {
        char why[96];
        snprintf(why, sizeof why, "read: %s", strerror(errno));
        abort_conn(n, why);
        return;
    }
    if (r > 0) {
        n->credit -= r;
        out(DATA_F, n->ch, chunk, (size_t)r);
        return;
    }
    n->eof_out = 1;
    out(DATA_F, n->ch, "", 0);
    conn_done(n);
}

/* A dialed connection's connect ended: OPEN when it succeeded, else CLOSE with why. */
static void connected(conn_t *n) {
    int port = n->connecting, e = 0;
    socklen_t elen = sizeof e;
    n->connecting = 0;
    if (getsockopt(n->fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0) e = errno;
    if (e) {
        char why[96];
        snprintf(why, sizeof why, "connect to 127.0.0.1:%d: %s", port, strerror(e));
        abort_conn(n, why);
        return;
    }
    buf_t b = {0};
    buf_fmt(&b, "{\"port\":%d}", port);
    out_json(OPEN_F, n->ch, &b);
    conn_write(n); /* nothing is pending: the host sends nothing before OPEN */
}

/* DIAL: the host opens a connection into this sandbox, to 127.0.0.1:port only; answered OPEN or CLOSE. */
static void dial_req(uint32_t ch, const unsigned char *payload, size_t n) {
    jmember_t *m;
    int count;
    const char *err;
    long long port = -1;
    const char *why = "not a JSON object";
    if (conn_of(ch)) protocol_error("DIAL on channel %u, which is in use", ch);
    if (jobject(payload, n, &m, &count, &err) == 0) {
        why = want_int(m, count, "port", -1, &port);
        jmembers_free(m, count);
    }
    if (why || port < 1 || port > 65535) { out(CLOSE_F, ch, "{\"error\":\"bad DIAL: it needs a port 1..65535\"}", 46); return; }
    if (nconns >= MAX_CONNS) {
        buf_t b = {0};
        buf_fmt(&b, "{\"error\":\"too many connections (%d)\"}", MAX_CONNS);
        out_json(CLOSE_F, ch, &b);
        return;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r = fd < 0 ? -1 : connect(fd, (struct sockaddr *)&a, sizeof a);
    if (r != 0 && (fd < 0 || errno != EINPROGRESS)) {
        char msg[96];
        snprintf(msg, sizeof msg, "connect to 127.0.0.1:%lld: %s", port, strerror(errno));
        if (fd >= 0) close(fd);
        buf_t b = {0};
        buf_str(&b, "{\"error\":");
        buf_json_str(&b, msg);
        buf_str(&b, "}");
        out_json(CLOSE_F, ch, &b);
        return;
    }
    conn_t *c = xrealloc(NULL, sizeof *c);
    *c = (conn_t){0};
    c->ch = ch;
    c->fd = fd;
    c->credit = WINDOW;
    c->connecting = (int)port;
    conns[nconns++] = c;
    if (r == 0) connected(c);
}

static void conn_frame(int kind, uint32_t ch, const unsigned char *payload, size_t n) {
    conn_t *c = conn_of(ch);
    if (!c) return; /* a connection already forgotten: late frames are dropped */
    if (c->connecting && kind == CLOSE_F) { drop_conn(c); return; } /* the host gave the connect up */
    if (kind == DATA_F) {
        if (c->eof_in || c->closing > 0) return;
        if (!n) c->eof_in = 1;
        else if (c->pending.len - c->pending_at + n > WINDOW) { abort_conn(c, "the host sent more than the window"); return; }
        else buf_add(&c->pending, payload, n);
        conn_write(c);
    } else if (kind == CREDIT_F) {
        jmember_t *m;
        int count;
        const char *err;
        long long amount = 0;
        const char *why = "not a JSON object";
        if (jobject(payload, n, &m, &count, &err) == 0) {
            why = want_int(m, count, "bytes", -1, &amount);
            jmembers_free(m, count);
        }
        if (why || amount < 1) { abort_conn(c, "bad CREDIT"); return; }
        c->credit += amount;
        if (c->credit > (1ll << 40)) c->credit = 1ll << 40;
    } else { /* CLOSE: the host is done; write what it sent, then close (no answer) */
        c->closing = now() + LINGER;
        c->eof_in = 1;
        conn_write(c);
    }
}

static void close_conns(void) {
    while (nlisteners) close_listener(nlisteners - 1);
    while (nconns) drop_conn(conns[nconns - 1]);
}

static unsigned char *inbuf;
static size_t inlen;

static void frames(void) {
    size_t at = 0;
    while (inlen - at >= HDR) {
        const unsigned char *h = inbuf + at;
        int kind = h[0];
        uint32_t ch = (uint32_t)h[4] << 24 | (uint32_t)h[5] << 16 | (uint32_t)h[6] << 8 | h[7];
        uint32_t n = (uint32_t)h[8] << 24 | (uint32_t)h[9] << 16 | (uint32_t)h[10] << 8 | h[11];
        if (kind != RUN && kind != STDIN_F && kind != KILL_F && kind != PING && kind != FILE_F && kind != LISTEN_F &&
            kind != DATA_F && kind != CREDIT_F && kind != CLOSE_F && kind != DIAL_F && kind != RESIZE_F && kind != SIGNAL_F)
            protocol_error("frame type %d is not allowed from the host", kind);
        if (h[1] || h[2] || h[3]) protocol_error("non-zero flags or reserved field");
        if (n > MAXP) protocol_error("oversized frame (%u bytes)", n);
        if ((ch == 0) != (kind == PING)) protocol_error("frame type %d on channel %u", kind, ch);
        /* CREDIT is a connection's, or (below CONN_BASE) a terminal's, as RESIZE and SIGNAL are. */
        if ((ch >= CONN_BASE) != (kind == DATA_F || (kind == CREDIT_F && ch >= CONN_BASE) || kind == CLOSE_F || kind == DIAL_F) ||
            (kind == DIAL_F && ch < DIAL_BASE) || ((kind == RESIZE_F || kind == SIGNAL_F) && ch >= CONN_BASE))
            protocol_error("frame type %d on channel %u", kind, ch);
        if (inlen - at < HDR + (size_t)n) break;
        const unsigned char *payload = h + HDR;
        at += HDR + n;
        cmd_t *c = cmd_of(ch);
        op_t *o = op_of(ch);
        if (kind == RUN) run(ch, payload, n);
        else if (kind == RESIZE_F || kind == SIGNAL_F || (kind == CREDIT_F && ch < CONN_BASE)) pty_frame(kind, c, payload, n);
        else if (kind == LISTEN_F) listen_req(ch, payload, n);
        else if (kind == DATA_F || kind == CREDIT_F || kind == CLOSE_F) conn_frame(kind, ch, payload, n);
        else if (kind == DIAL_F) dial_req(ch, payload, n);
        else if (kind == KILL_F && listener_index(ch) >= 0) close_listener(listener_index(ch));
        else if (kind == FILE_F) start_op(ch, payload, n);
        else if (kind == STDIN_F && o) op_input(o, payload, n);
        else if (kind == KILL_F && o) kill_op(o);
        else if (kind == STDIN_F) {
            if (c && c->stdin_fd >= 0 && !c->stdin_eof) {
                if (n) {
                    if (c->pending.len + n > MAX_STDIN_PENDING) { /* the host sends what it holds: bounded anyway */
                        c->stdin_eof = 1;
                    } else buf_add(&c->pending, payload, n);
                } else c->stdin_eof = 1;
                write_stdin(c);
            }
        } else if (kind == KILL_F) {
            if (c && !c->shim_done) { c->killed = 1; kill_cmd(c); }
        } else if (kind == PING) {
            jmember_t *m;
            int count;
            const char *err;
            if (n && jobject(payload, n, &m, &count, &err) == 0) { jmembers_free(m, count); out(PONG, 0, payload, n); }
            else out(PONG, 0, "{}", 2);
        }
    }
    memmove(inbuf, inbuf + at, inlen - at);
    inlen -= at;
}

static void on_sigchld(int sig) {
    (void)sig;
    int e = errno;
    (void)!write(wake_w, "x", 1);
    errno = e;
}

/* A process is known by its pid and its start time (a reused pid is another process). A CRIU restore (runc,
 * docs/pause.md) brings every process back with its pid but a new start time, the agent's own included:
 * when the agent's changed, every start time it holds is read again, before any frame of the restored
 * session is read (the host's first frames follow the restore). All of them come back at once, so none
 * of those pids is another process yet. gVisor restores start times as they were. */
static unsigned long long self_start;
static void follow_a_restore(void) {
    unsigned long long start = start_of(SELF);
    if (!start || start == self_start) return;
    self_start = start;
    for (int i = 0; i < ncmds; i++) cmds[i]->shim_start = start_of(cmds[i]->shim);
    for (int i = 0; i < ngroups; i++) groups[i]->shim_start = start_of(groups[i]->shim);
    for (int i = 0; i < nops; i++) ops[i]->start = start_of(ops[i]->pid);
    if (spare.pid) spare.start = start_of(spare.pid);
    for (int i = 0; i < nprotected; i++) protected_v[i].start = start_of(protected_v[i].pid); /* gone: 0 */
}

static void loop(void) {
    size_t incap = 2 * (HDR + MAXP);
    inbuf = xrealloc(NULL, incap);
    struct pollfd *pfd = NULL;
    void **owner = NULL;
    int *what = NULL;
    size_t pcap = 0;
    if (kept_session) self_start = start_of(SELF);
    for (;;) {
        double t = now();
        for (int i = 0; i < ncmds; i++)
            if (!cmds[i]->shim_done && t >= cmds[i]->deadline) { cmds[i]->timed_out = 1; kill_cmd(cmds[i]); }
        reap_any(reaped);
        int swept = 0;
        for (int i = 0; i < ncmds;) {
            cmd_t *c = cmds[i];
            /* The shim writes its one status line (one write) only once the command and every descendant
             * are gone, then exits: with that line and both output pipes at end of file the command is over,
             * without waiting for the shim's own exit (it is reaped later; a sweep meanwhile may kill it). */
            if (c->background && !c->timed_out && !c->killed) {
                if (c->shim_done) read_status(c);
                if (memchr(c->status, '\n', c->status_len)) {
                    /* The command exited: what it wrote is in its pipes already (what it left may hold
                     * them open); read that, then EXIT, and the shim stays as the keeper. */
                    for (int k = 0; k < 2; k++)
                        while (c->out_fd[k] >= 0 && read_output(c, k)) {
                        }
                    finish(i, 1);
                    continue;
                }
            }
            int status_line = memchr(c->status, '\n', c->status_len) != NULL;
            if (c->shim_done || (status_line && !c->timed_out && !c->killed)) {
                if (c->shim_done) read_status(c); /* written before the shim exited */
                int has_status = 0;
                for (size_t k = 0; k < c->status_len && !has_status; k++) has_status = c->status[k] > ' ';
                if (!swept && (!strict_mode || !has_status)) { sweep(); swept = 1; }
                int drained = c->out_fd[0] < 0 && c->out_fd[1] < 0;
                if ((drained && (c->status_fd < 0 || status_line)) || (c->shim_done && now() > c->drain_until)) {
                    finish(i, 0);
                    continue;
                }
            }
            i++;
        }
        for (int i = 0; i < nops;) {
            op_t *o = ops[i];
            if (o->done && ((o->out_fd < 0 && o->status_fd < 0) || now() > o->drain_until)) {
                read_op_status(o);
                finish_op(i);
                continue;
            }
            i++;
        }
        if (host_eof && !ncmds && !nops) return;
        if (!ncmds) spare_make(); /* idle: the next RUN's shim, off its path */
        size_t backlog = 0;
        for (int i = 0; i < nops; i++) backlog += ops[i]->pending.len - ops[i]->pending_at;
        for (int i = 0; i < nconns;) {
            if (conns[i]->closing > 0 && now() >= conns[i]->closing) { drop_conn(conns[i]); continue; } /* never read */
            i++;
        }
        size_t need = 2 + 4 * (size_t)ncmds + 3 * (size_t)nops + 2 * (size_t)ngroups + (size_t)nlisteners + (size_t)nconns;
        if (need > pcap) {
            pcap = need * 2;
            pfd = xrealloc(pfd, pcap * sizeof *pfd);
            owner = xrealloc(owner, pcap * sizeof *owner);
            what = xrealloc(what, pcap * sizeof *what);
        }
        int np = 0;
        pfd[np] = (struct pollfd){wake_r, POLLIN, 0}; owner[np] = NULL; what[np++] = -1;
        if (!host_eof && backlog < OP_HIGH_WATER) { pfd[np] = (struct pollfd){rfd, POLLIN, 0}; owner[np] = NULL; what[np++] = -2; }
        double wait_until = -1;
        for (int i = 0; i < ncmds; i++) {
            cmd_t *c = cmds[i];
            for (int k = 0; k < 2; k++)
                if (c->out_fd[k] >= 0 && (!c->paced || c->credit > 0)) { pfd[np] = (struct pollfd){c->out_fd[k], POLLIN, 0}; owner[np] = c; what[np++] = k; }
            if (c->status_fd >= 0) { pfd[np] = (struct pollfd){c->status_fd, POLLIN, 0}; owner[np] = c; what[np++] = 2; }
            if (c->stdin_fd >= 0 && c->pending.len > c->pending_at) { pfd[np] = (struct pollfd){c->stdin_fd, POLLOUT, 0}; owner[np] = c; what[np++] = 3; }
            double d = c->shim_done ? c->drain_until : c->deadline;
            if (wait_until < 0 || d < wait_until) wait_until = d;
        }
        for (int i = 0; i < nops; i++) {
            op_t *o = ops[i];
            if (o->out_fd >= 0) { pfd[np] = (struct pollfd){o->out_fd, POLLIN, 0}; owner[np] = o; what[np++] = 10; }
            if (o->status_fd >= 0) { pfd[np] = (struct pollfd){o->status_fd, POLLIN, 0}; owner[np] = o; what[np++] = 11; }
            if (o->stdin_fd >= 0 && o->pending.len > o->pending_at) { pfd[np] = (struct pollfd){o->stdin_fd, POLLOUT, 0}; owner[np] = o; what[np++] = 12; }
            if (o->done && (wait_until < 0 || o->drain_until < wait_until)) wait_until = o->drain_until;
        }
        for (int i = 0; i < ngroups; i++)
            for (int k = 0; k < 2; k++)
                if (groups[i]->out_fd[k] >= 0) { pfd[np] = (struct pollfd){groups[i]->out_fd[k], POLLIN, 0}; owner[np] = groups[i]; what[np++] = 20 + k; }
        for (int i = 0; i < nlisteners; i++) { pfd[np] = (struct pollfd){listeners[i].fd, POLLIN, 0}; owner[np] = &listeners[i]; what[np++] = 30; }
        for (int i = 0; i < nconns; i++) {
            conn_t *c = conns[i];
            short ev = 0;
            if (c->credit > 0 && !c->eof_out && c->closing <= 0 && !c->connecting) ev |= POLLIN;
            if (c->pending.len > c->pending_at || c->connecting) ev |= POLLOUT;
            if (ev) { pfd[np] = (struct pollfd){c->fd, ev, 0}; owner[np] = c; what[np++] = 31; } /* else: nothing to do (not even a hang-up to spin on) */
            if (c->closing > 0 && (wait_until < 0 || c->closing < wait_until)) wait_until = c->closing;
        }
        int timeout_ms = -1;
        if (wait_until >= 0) {
            double left = wait_until - now();
            timeout_ms = left <= 0 ? 0 : left > 3600 ? 3600000 : (int)(left * 1000) + 1;
        }
        int r = poll(pfd, (nfds_t)np, timeout_ms);
        if (kept_session) follow_a_restore(); /* before a restored session's first frame is read */
        if (r < 0) continue; /* EINTR: SIGCHLD */
        for (int i = 0; i < np; i++) {
            if (!pfd[i].revents) continue;
            if (what[i] == -1) {
                char drain[256];
                while (read(wake_r, drain, sizeof drain) > 0) {
                }
            } else if (what[i] == -2) {
                ssize_t n = read(rfd, inbuf + inlen, incap - inlen);
                if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
                if (n <= 0) { /* the host went away: every command dies */
                    host_eof = 1;
                    spare_drop(1);
                    for (int k = 0; k < ncmds; k++)
                        if (!cmds[k]->shim_done) { cmds[k]->killed = 1; kill_cmd(cmds[k]); }
                    for (int k = 0; k < nops; k++) kill_op(ops[k]);
                    kill_groups();
                    close_conns();
                    continue;
                }
                inlen += (size_t)n;
                frames();
                break; /* commands may have finished or started: poll again with fresh descriptors */
            } else if (what[i] == 30) {
                listener_t *l = owner[i];
                int li = (int)(l - listeners);
                if (li >= 0 && li < nlisteners && listeners[li].fd == pfd[i].fd) accept_conns(li);
            } else if (what[i] == 31) {
                conn_t *c = owner[i];
                if (!conn_live(c) || c->fd != pfd[i].fd) continue;
                if (c->connecting) { connected(c); continue; }
                if (pfd[i].revents & (POLLOUT | POLLERR)) conn_write(c);
                if (conn_live(c) && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) conn_read(c);
            } else if (what[i] >= 20) {
                cmd_t *g = owner[i];
                int still = 0;
                for (int k = 0; k < ngroups && !still; k++) still = groups[k] == g;
                if (still && g->out_fd[what[i] - 20] == pfd[i].fd) discard_output(g, what[i] - 20);
            } else if (what[i] >= 10) {
                op_t *o = owner[i];
                int still = 0;
                for (int k = 0; k < nops && !still; k++) still = ops[k] == o;
                if (!still) continue;
                if (what[i] == 10 && o->out_fd == pfd[i].fd) read_op_output(o);
                else if (what[i] == 11 && o->status_fd == pfd[i].fd) read_op_status(o);
                else if (what[i] == 12 && o->stdin_fd == pfd[i].fd) write_op_stdin(o);
            } else {
                cmd_t *c = owner[i];
                int still = 0;
                for (int k = 0; k < ncmds && !still; k++) still = cmds[k] == c;
                if (!still) continue;
                if (what[i] < 2 && c->out_fd[what[i]] == pfd[i].fd) read_output(c, what[i]);
                else if (what[i] == 2 && c->status_fd == pfd[i].fd) read_status(c);
                else if (what[i] == 3 && c->stdin_fd == pfd[i].fd) write_stdin(c);
            }
        }
    }
}

static int is_other_agent(int pid) {
    static char data[1 << 17];
    size_t len = read_proc_file(pid, "cmdline", data, sizeof data);
    const char *a[7] = {0};
    int n = 0;
    for (size_t at = 0; at < len && n < 7; at += strlen(data + at) + 1) a[n++] = data + at;
    if (n >= 1 && strcmp(a[0], "adk-sandbox-agent") == 0) return 1; /* a static agent */
    return n >= 6 && strcmp(a[1], "-I") == 0 && strcmp(a[2], "-S") == 0 && strcmp(a[3], "-c") == 0 &&
           strcmp(a[5], "adk-sandbox-agent") == 0; /* an earlier version's Python agent */
}

typedef struct { int *pids; int n; } olds_t;

/* An earlier agent's tree and the orphans at PID 1; the agent itself goes after them (old_agents). */
static void startup_targets(const procs_t *ps, char *mark, void *ctx) {
    olds_t *o = ctx;
    mark_below(ps, mark, o->pids, o->n);
    mark_escapees(ps, mark);
}

static void old_agents(const procs_t *ps, char *mark, void *ctx) {
    olds_t *o = ctx;
    for (int i = 0; i < ps->n; i++)
        for (int k = 0; k < o->n; k++)
            if (ps->v[i].pid == o->pids[k]) mark[i] = 1;
}

static int cmp_protected(const void *a, const void *b) {
    const protected_t *x = a, *y = b;
    return x->pid < y->pid ? -1 : x->pid > y->pid;
}

/* -- the keeper ---------------------------------------------------------------------------------------- */
/* adk-sandbox-agent keeper <lifetime> [setid-allowed]: the container's first process, for a session whose
 * processes must survive a checkpoint (docs/pause.md). A checkpoint keeps the container's own process tree
 * only: an exec'd agent, and everything it starts, is lost at a restore. So the keeper, PID 1 and root
 * (with CAP_SETUID and CAP_SETGID only, to become the user), reads the user's "uid gid" (two 32-bit
 * little-endian numbers) from stdin, the container's own, which the host attaches to; forks the agent as
 * that user on the same stdin and stdout; and otherwise reaps orphans, until its lifetime ends.
 * Another uid cannot signal it, and it installs no handler (runc's init then ignores even root's signals;
 * gVisor delivers them). A restore hands the same descriptors new streams, and the agent serves on. */
/* The agent is gone, but under gVisor the sandbox holds the container's stdout open whatever its processes
 * do, so the host would see no end of the stream: bytes that are no frame (type 0xff, frames.AGENT_ENDED_BYTE:
 * the host reads it as the agent's end), enough to finish any
 * frame the agent left half written and start an invalid one, make its reader give the agent up at once.
 * Written by a child, as a write may block until the engine reads. */
static void tell_the_host_the_agent_ended(int out) {
    if (out < 0 || fork() != 0) return;
    static unsigned char junk[1 << 16];
    memset(junk, 0xff, sizeof junk);
    for (size_t left = MAXP + HDR; left > 0;) {
        ssize_t n = write(out, junk, left < sizeof junk ? left : sizeof junk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        left -= (size_t)n;
    }
    _exit(0);
}

static void keep(const char *lifetime) {
    char *end;
    long seconds = strtol(lifetime, &end, 10);
    if (end == lifetime || *end || seconds <= 0) { dprintf(2, "adk-sandbox-agent: not a lifetime: %s\n", lifetime); _exit(2); }
    time_t until = time(NULL) + seconds; /* the wall clock: it goes on across a checkpoint */
    unsigned char ids[8];
    size_t got = 0;
    while (got < sizeof ids) {
        ssize_t n = read(0, ids + got, sizeof ids - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) _exit(1); /* the host went away before naming the user */
        got += (size_t)n;
    }
    uid_t uid = (uid_t)(ids[0] | ids[1] << 8 | ids[2] << 16 | (uint32_t)ids[3] << 24);
    gid_t gid = (gid_t)(ids[4] | ids[5] << 8 | ids[6] << 16 | (uint32_t)ids[7] << 24);
    pid_t agent = fork();
    if (agent < 0) _exit(1);
    if (agent == 0) { /* the agent, as an exec as uid:gid would be: no supplementary groups, no capability */
        if ((getuid() != uid || getgid() != gid) && (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)) {
            dprintf(2, "adk-sandbox-agent: the keeper cannot become %u:%u: %s\n", uid, gid, strerror(errno));
            _exit(1);
        }
        return;
    }
    int out = fcntl(1, F_DUPFD_CLOEXEC, 3);
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; fd++) dup2(null, fd); /* the channel is the agent's alone */
    close_all_but(out);
    /* SIGCHLD blocked, so a namespace's init receives it (an unblocked one it has no handler for is dropped):
     * sigtimedwait wakes for each child's end, and orphans are reaped; no other signal is handled. */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    for (time_t now = time(NULL); now < until; now = time(NULL)) {
        struct timespec wait = {until - now > 3600 ? 3600 : until - now, 0};
        sigtimedwait(&chld, NULL, &wait);
        pid_t p;
        while ((p = waitpid(-1, NULL, WNOHANG)) > 0)
            if (p == agent) {
                tell_the_host_the_agent_ended(out);
                close(out);
                out = -1;
            }
    }
    _exit(0); /* the lifetime ended: the namespace ends with its init */
}

int main(int argc, char **argv) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* commands cannot open /proc/<agent>/fd or ptrace the agent */
    if (argc > 2 && strcmp(argv[1], KEEPER_WORD) == 0) {
        keep(argv[2]); /* returns in the agent only */
        kept_session = 1;
        argv[2] = argv[0];
        argv += 2;
        argc -= 2;
    }
    SELF = getpid();
    agent_argv0 = argc > 0 ? argv[0] : NULL;
    /* adk-sandbox-agent [setid-allowed] [<protected>]: the word has one spelling and one place (right after
     * the name), so it is never read as the list nor the list as it; anything more ends the agent. */
    int next = 1;
    if (next < argc && strcmp(argv[next], SETID_ALLOWED_WORD) == 0) { setid_allowed = 1; next++; }
    if (argc - next > 1) {
        dprintf(2, "adk-sandbox-agent: usage: adk-sandbox-agent [%s] [<protected>]\n", SETID_ALLOWED_WORD);
        return 2;
    }
    const char *protected_arg = next < argc ? argv[next] : NULL;
    close_all_but(-1); /* what the loader or the engine left open (the memory file) */
    rfd = fcntl(0, F_DUPFD_CLOEXEC, 3);
    wfd = fcntl(1, F_DUPFD_CLOEXEC, 3);
    int null = open("/dev/null", O_RDWR);
    if (rfd < 0 || wfd < 0 || null < 0) { dprintf(2, "adk-sandbox-agent: cannot set up its descriptors\n"); return 1; }
    dup2(null, 0);
    dup2(null, 1);
    if (null > 2) close(null);
    null_r = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_r < 0) { dprintf(2, "adk-sandbox-agent: cannot open /dev/null\n"); return 1; }
    strict_mode = prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
    /* Every disposition to its default once here (the engine's exec may hand some down ignored), so a
     * shim only undoes what the agent itself sets below. */
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++) sigaction(s, &dfl, NULL);
    struct sigaction ign = {0};
    ign.sa_handler = SIG_IGN;
    for (size_t i = 0; i < sizeof DEFAULT_SIGNALS / sizeof *DEFAULT_SIGNALS; i++) sigaction(DEFAULT_SIGNALS[i], &ign, NULL);
    int wp[2];
    if (pipe2(wp, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
    wake_r = wp[0];
    wake_w = wp[1];
    struct sigaction chld = {0};
    chld.sa_handler = on_sigchld;
    chld.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &chld, NULL);

    procs_t ps = scan();
    if (protected_arg) {
        /* "pid:start,pid:start": the container's own processes, surveyed when the first agent started */
        const char *p = protected_arg;
        protected_v = xrealloc(NULL, (strlen(p) / 2 + 1) * sizeof *protected_v);
        while (*p) {
            char *end;
            long pid = strtol(p, &end, 10);
            if (end == p || *end != ':') break;
            unsigned long long start = strtoull(end + 1, &end, 10);
            protected_v[nprotected++] = (protected_t){(int)pid, start};
            p = end;
            if (*end != ',') break;
            p = end + 1;
        }
        if (*p) { /* not a list (a misspelt word): sparing nothing would kill the container's own processes */
            dprintf(2, "adk-sandbox-agent: not a protected list: %s\n", protected_arg);
            return 2;
        }
    } else {
        char *mark = xrealloc(NULL, (size_t)ps.n + 1);
        memset(mark, 0, (size_t)ps.n + 1);
        int one = 1;
        mark_below(&ps, mark, &one, 1);
        protected_v = xrealloc(NULL, ((size_t)ps.n + 1) * sizeof *protected_v);
        for (int i = 0; i < ps.n; i++)
            if (mark[i] || ps.v[i].pid == 1) protected_v[nprotected++] = (protected_t){ps.v[i].pid, ps.v[i].start};
        free(mark);
    }
    qsort(protected_v, (size_t)nprotected, sizeof *protected_v, cmp_protected);
    /* What earlier agents of this container left: another agent (the host gave up on it) and its tree,
     * and orphans at PID 1. */
    olds_t olds = {xrealloc(NULL, ((size_t)ps.n + 1) * sizeof(int)), 0};
    for (int i = 0; i < ps.n; i++)
        /* PID 1 is never one: a keeper (docs/pause.md), which the container lives by */
        if (ps.v[i].pid != SELF && ps.v[i].pid != 1 && ps.v[i].ppid == 0 && is_other_agent(ps.v[i].pid)) {
            olds.pids[olds.n++] = ps.v[i].pid;
            send_sig(ps.v[i].pid, ps.v[i].start, SIGSTOP); /* it can no longer fork nor exit on its own */
        }
    free(ps.v);
    /* Its tree first, the old agent after (see exit_alone: under gVisor a descendant dying with its
     * exec'd subreaper stops the whole sandbox); stopped, it can neither reap nor fork meanwhile. */
    kill_all(startup_targets, &olds, 5.0, NULL);
    kill_all(old_agents, &olds, 5.0, NULL);
    free(olds.pids);

    buf_t b = {0};
    buf_fmt(&b, "{\"protocol\":1,\"pid\":%d,\"subreaper\":%s,\"agent\":\"static\",\"protected\":\"", (int)SELF,
            strict_mode ? "true" : "false");
    for (int i = 0; i < nprotected; i++) buf_fmt(&b, "%s%d:%llu", i ? "," : "", protected_v[i].pid, protected_v[i].start);
    buf_str(&b, "\",\"ops\":[");
    for (int i = 0; i < N_OPS; i++) buf_fmt(&b, "%s\"%s\"", i ? "," : "", OP_NAMES[i]);
    /* What everything it starts gets: the filter ("refused"), none by the host's choice ("allowed"), or
     * none for want of one on this architecture ("unavailable": every RUN and FILE then fails). */
    buf_fmt(&b, "],\"proxy\":1,\"dial\":1,\"unix\":2,\"pty\":1,\"setid\":\"%s\"}", setid_allowed ? "allowed" : SETID_FILTER_LEN ? "refused" : "unavailable");
    out_json(HELLO, 0, &b);
    loop();
    exit_alone(0);
}
