/* Preloaded into CRIU by scripts/install-criu: two host limits that CRIU 4.1 does not handle by itself.
 *
 * 1. A root without CAP_SYS_RESOURCE (not in these machines' bounding set) may not read another uid's
 *    resource limits with prlimit(2), which CRIU does for every process it dumps. The same numbers are in
 *    /proc/PID/limits, readable by anyone: read there, only when the kernel said EPERM.
 * 2. Linux 6.16 refuses SO_PASSCRED, SO_PASSSEC and SO_PASSPIDFD (EOPNOTSUPP) on sockets other than unix
 *    and netlink ones, which CRIU 4.1 reads and writes on every socket: there they are off, and stay off.
 *
 * Nothing else changes: every other call goes to libc as it is. Why runc's checkpoints need CRIU at all:
 * docs/pause.md, "runc".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>

/* Line `resource` + 1 of /proc/PID/limits (a header, then one line per resource in the kernel's order):
 * a 26-column name, then the soft and the hard limit ("unlimited" or a number). */
static int limits_from_proc(long pid, long resource, struct rlimit64 *out) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/limits", pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    long index = -1;
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        if (index++ != resource) continue;
        char soft[32], hard[32];
        if (strlen(line) > 26 && sscanf(line + 26, "%31s %31s", soft, hard) == 2) {
            out->rlim_cur = strcmp(soft, "unlimited") ? strtoull(soft, NULL, 10) : RLIM64_INFINITY;
            out->rlim_max = strcmp(hard, "unlimited") ? strtoull(hard, NULL, 10) : RLIM64_INFINITY;
            found = 0;
        }
        break;
    }
    fclose(f);
    return found;
}

/* CRIU reads limits with syscall(__NR_prlimit64, pid, resource, NULL, &old). */
long syscall(long number, ...) {
    static long (*real)(long, ...);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    va_list ap;
    va_start(ap, number);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    long result = real(number, a, b, c, d, e, f);
    if (result == -1 && errno == EPERM && number == SYS_prlimit64 && a > 0 && c == 0 && d != 0 &&
        limits_from_proc(a, b, (struct rlimit64 *)d) == 0)
        return 0;
    return result;
}

static int pass_option(int level, int name) {
    return level == SOL_SOCKET && (name == 16 /* SO_PASSCRED */ || name == 34 /* SO_PASSSEC */ ||
                                   name == 76 /* SO_PASSPIDFD */);
}

int getsockopt(int fd, int level, int name, void *value, socklen_t *length) {
    static int (*real)(int, int, int, void *, socklen_t *);
    if (!real) real = (int (*)(int, int, int, void *, socklen_t *))dlsym(RTLD_NEXT, "getsockopt");
    int result = real(fd, level, name, value, length);
    if (result == -1 && errno == EOPNOTSUPP && pass_option(level, name) && length && *length >= sizeof(int)) {
        *(int *)value = 0;
        *length = sizeof(int);
        return 0;
    }
    return result;
}

int setsockopt(int fd, int level, int name, const void *value, socklen_t length) {
    static int (*real)(int, int, int, const void *, socklen_t);
    if (!real) real = (int (*)(int, int, int, const void *, socklen_t))dlsym(RTLD_NEXT, "setsockopt");
    int result = real(fd, level, name, value, length);
    if (result == -1 && errno == EOPNOTSUPP && pass_option(level, name) && length >= sizeof(int) &&
        *(const int *)value == 0)
        return 0;
    return result;
}
