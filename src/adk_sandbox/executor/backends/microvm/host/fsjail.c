/* adk-sandbox microVM: starts virtiofsd (the workspace share's server) in a jail the kernel enforces.
 *
 *   fsjail <inner_uid> <inner_gid> <outer_uid> <outer_gid> <socket> <program> [args...]
 *
 * <socket>: the vhost-user socket, made here (a listening Unix socket, mode 0600, as the caller) and given
 * to the program as its descriptor 3 (virtiofsd --fd=3), so virtiofsd needs no lock file in /run.
 *
 * The guest's kernel is not trusted: a guest that took over its kernel can send virtiofsd any request (any
 * uid, any mode). So what virtiofsd may do on the host is limited here, before it runs:
 *
 *   1. a user namespace of its own whose only ids are inner_uid:inner_gid, mapped to the host's
 *      outer_uid:outer_gid (the workspace's owner, never root). virtiofsd runs as that inner user, with
 *      the capabilities of that namespace only: it can create files only as outer_uid:outer_gid (a request
 *      naming another uid fails: that uid does not exist there), can never chown a file to anyone else,
 *      and its capabilities do not count on files owned by anyone else (root's files stay root's);
 *   2. a seccomp filter: no mode with the set-uid or set-gid bit (chmod, fchmod, fchmodat, open, openat,
 *      creat, mkdir, mkdirat, mknod, mknodat fail with EPERM), no extended attributes (so no file
 *      capabilities, no ACLs), no file handles (name_to_handle_at, open_by_handle_at), no openat2 (its
 *      mode is out of the filter's reach); no_new_privs;
 *   3. PR_SET_PDEATHSIG = SIGKILL, set last (a change of credentials clears it): virtiofsd dies with
 *      the process that started this one (the VM's wrapper, _qemu.py).
 *
 * virtiofsd then adds its own sandbox (-o sandbox=namespace: mount, pid and net namespaces, pivot_root
 * into the shared directory) and its own seccomp filter.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) {
    dprintf(2, "fsjail: %s: %s\n", what, strerror(errno));
    _exit(125);
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

#define ARG_LOW(i) (offsetof(struct seccomp_data, args) + (i) * sizeof(__u64))
/* syscall nr -> EPERM when its argument `arg` has S_ISUID or S_ISGID (06000). */
#define MODE_RULE(nr, arg)                                          \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 3),                \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LOW(arg)),               \
    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 06000, 0, 1),              \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)
#define DENY(nr) \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)
#define RELOAD_NR BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))

static void install_filter(void) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        RELOAD_NR,
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1), /* the x32 ABI: other numbers */
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        DENY(188), DENY(189), DENY(190),  /* setxattr, lsetxattr, fsetxattr */
        DENY(303), DENY(304),             /* name_to_handle_at, open_by_handle_at */
        DENY(437),                        /* openat2 */
        MODE_RULE(2, 2), RELOAD_NR,       /* open(path, flags, mode) */
        MODE_RULE(85, 1), RELOAD_NR,      /* creat(path, mode) */
        MODE_RULE(83, 1), RELOAD_NR,      /* mkdir(path, mode) */
        MODE_RULE(133, 1), RELOAD_NR,     /* mknod(path, mode, dev) */
        MODE_RULE(90, 1), RELOAD_NR,      /* chmod(path, mode) */
        MODE_RULE(91, 1), RELOAD_NR,      /* fchmod(fd, mode) */
        MODE_RULE(257, 3), RELOAD_NR,     /* openat(dirfd, path, flags, mode) */
        MODE_RULE(258, 2), RELOAD_NR,     /* mkdirat(dirfd, path, mode) */
        MODE_RULE(259, 2), RELOAD_NR,     /* mknodat(dirfd, path, mode, dev) */
        MODE_RULE(268, 2), RELOAD_NR,     /* fchmodat(dirfd, path, mode) */
        MODE_RULE(452, 2),                /* fchmodat2(dirfd, path, mode, flags) */
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("no_new_privs");
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) die("seccomp");
}

/* Every capability, permitted, effective, inheritable and ambient: those of the new namespace only. */
static void keep_capabilities(void) {
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capget, &header, data) != 0) die("capget");
    for (int i = 0; i < 2; i++) {
        data[i].effective = data[i].permitted;
        data[i].inheritable = data[i].permitted;
    }
    if (syscall(SYS_capset, &header, data) != 0) die("capset");
    for (int cap = 0; cap < 64; cap++) {
        if (!(data[cap / 32].permitted & (1u << (cap % 32)))) continue;
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0) die("ambient capabilities");
    }
}

static unsigned long number(const char *text) {
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno || *end || end == text) {
        dprintf(2, "fsjail: not a number: %s\n", text);
        _exit(125);
    }
    return value;
}

static void listen_on(const char *path) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof address.sun_path) {
        dprintf(2, "fsjail: socket path too long: %s\n", path);
        _exit(125);
    }
    strcpy(address.sun_path, path);
    int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    if (sock < 0) die("socket");
    mode_t old = umask(0177);
    if (bind(sock, (struct sockaddr *)&address, sizeof address) != 0) die("bind");
    umask(old);
    if (listen(sock, 1) != 0) die("listen");
    if (sock != 3) {
        if (dup2(sock, 3) != 3) die("dup2");
        close(sock);
    }
}

int main(int argc, char **argv) {
    if (argc < 7) {
        dprintf(2, "usage: fsjail <inner_uid> <inner_gid> <outer_uid> <outer_gid> <socket> <program> [args...]\n");
        return 125;
    }
    unsigned long inner_uid = number(argv[1]), inner_gid = number(argv[2]);
    unsigned long outer_uid = number(argv[3]), outer_gid = number(argv[4]);
    if (outer_uid == 0 || outer_gid == 0) {
        dprintf(2, "fsjail: refusing to map root\n");
        return 125;
    }
    pid_t starter = getppid();
    listen_on(argv[5]);
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) die("pipe");
    pid_t self = getpid();
    /* The child stays in this user namespace and writes the maps of ours (only a process of the parent
     * namespace may map other ids than its own). */
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        close(ready[1]);
        char byte;
        if (read(ready[0], &byte, 1) != 1) _exit(1);
        char path[64], line[96];
        snprintf(path, sizeof path, "/proc/%d/setgroups", (int)self);
        if (geteuid() != 0 && write_file(path, "deny") != 0) die("setgroups deny");
        snprintf(path, sizeof path, "/proc/%d/gid_map", (int)self);
        snprintf(line, sizeof line, "%lu %lu 1\n", inner_gid, outer_gid);
        if (write_file(path, line) != 0) die("gid_map");
        snprintf(path, sizeof path, "/proc/%d/uid_map", (int)self);
        snprintf(line, sizeof line, "%lu %lu 1\n", inner_uid, outer_uid);
        if (write_file(path, line) != 0) die("uid_map");
        _exit(0);
    }
    close(ready[0]);
    if (unshare(CLONE_NEWUSER) != 0) die("unshare(CLONE_NEWUSER)");
    if (write(ready[1], "x", 1) != 1) die("pipe write");
    close(ready[1]);
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) die("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        dprintf(2, "fsjail: the id maps were not written\n");
        return 125;
    }
    if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) die("keepcaps");
    if (setgroups(0, NULL) != 0 && errno != EPERM) die("setgroups");
    if (setresgid(inner_gid, inner_gid, inner_gid) != 0) die("setresgid");
    if (setresuid(inner_uid, inner_uid, inner_uid) != 0) die("setresuid");
    keep_capabilities();
    install_filter();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) die("pdeathsig");
    if (getppid() != starter) return 125; /* the starter died before the death signal was set */
    execv(argv[6], argv + 6);
    die(argv[6]);
}
