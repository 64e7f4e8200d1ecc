/* adk-sandbox microVM init: PID 1 of the guest after the initramfs switched to the read-only root.
 *
 * Started as  vminit <ports> <memory_mb> <pids>  (executor/backends/microvm/guest/init.sh):
 *   1. mounts cgroup2, makes the "sandbox" cgroup with memory.max = <memory_mb> MiB (no swap) and
 *      pids.max = <pids>: every agent and command of the VM runs in it;
 *   2. forks one port loop per virtio-serial port /dev/adk-port1..<ports> (links made by init.sh), each in the sandbox cgroup, in a
 *      cgroup namespace of its own with cgroup2 mounted read-only at /sys/fs/cgroup (so the agent reads the
 *      sandbox's memory.events as a container's agent reads its container's);
 *   3. forks the seed loop on the last port, /dev/adk-seed (see seed_loop below);
 *   4. reaps every orphan, and starts a port loop or the seed loop again if one dies.
 *
 * A port loop: open the port, write GREETING (the host connected to the port's socket discards what came
 * before it), read one header, start that program with the port as its stdin and stdout (stderr: the
 * kernel console), wait for it, and again. The header, host to guest:
 *     "ADKVM1 <uid> <gid> <argc>\n" then per argument "<length>\n<bytes>"
 * The program runs in a new session, as uid:gid with no supplementary groups, with an empty capability
 * bounding set and no_new_privs (what a hardened container gives), cwd "/", PATH and HOME set.
 * Everything after the header (the agent's bytes for its loader, then frames) is the program's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <linux/capability.h>
#include <linux/random.h>

#define GREETING "\nadk-vm-port-ready-1\n"
#define SEED_GREETING "\nadk-vm-seed-ready-1\n"
#define SEED_BYTES 32
#define MAX_PORTS 32
#define MAX_ARGS 64
#define MAX_ARG (1 << 20)
#define CG "/sys/fs/cgroup"

static void say(const char *fmt, const char *a) {
    dprintf(2, "vminit: ");
    dprintf(2, fmt, a);
    dprintf(2, "\n");
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

static int read_exact(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* One line of at most cap-1 bytes, byte by byte (nothing past the newline is consumed). */
static int read_line(int fd, char *buf, size_t cap) {
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        if (c == '\n') { buf[n] = 0; return 0; }
        if (n + 1 >= cap) return -1;
        buf[n++] = c;
    }
}

static int write_all(int fd, const char *text) {
    size_t left = strlen(text);
    while (left > 0) { /* on a port: blocks until the host is connected */
        ssize_t w = write(fd, text, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        text += w;
        left -= (size_t)w;
    }
    return 0;
}

static void run_program(int port) {
    char line[128];
    unsigned long uid, gid, argc;
    if (read_line(port, line, sizeof line) != 0) return;
    if (sscanf(line, "ADKVM1 %lu %lu %lu", &uid, &gid, &argc) != 3 || argc == 0 || argc > MAX_ARGS) {
        say("bad header: %s", line);
        return;
    }
    char *args[MAX_ARGS + 1] = {0};
    for (unsigned long i = 0; i < argc; i++) {
        unsigned long len;
        if (read_line(port, line, sizeof line) != 0 || sscanf(line, "%lu", &len) != 1 || len > MAX_ARG) return;
        args[i] = calloc(1, len + 1);
        if (!args[i] || read_exact(port, args[i], len) != 0) return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        int console = open("/dev/console", O_WRONLY | O_NOCTTY);
        dup2(port, 0);
        dup2(port, 1);
        if (console >= 0) dup2(console, 2);
        for (int fd = 3; fd < 1024; fd++) close(fd);
        setsid();
        if (chdir("/") != 0) _exit(126);
        for (int cap = 0; cap <= 63; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || setgroups(0, NULL) != 0 || setgid((gid_t)gid) != 0 ||
            setuid((uid_t)uid) != 0) {
            dprintf(2, "vminit: cannot become %lu:%lu: %s\n", uid, gid, strerror(errno));
            _exit(126);
        }
        char *env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       "HOME=/home/sandbox", "LANG=C.UTF-8", NULL};
        execve(args[0], args, env);
        dprintf(2, "vminit: cannot run %s: %s\n", args[0], strerror(errno));
        _exit(127);
    }
    for (unsigned long i = 0; i < argc; i++) free(args[i]);
    if (pid < 0) return;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
}

static void port_loop(int index) {
    char path[64];
    snprintf(path, sizeof path, "/dev/adk-port%d", index);
    /* Into the sandbox cgroup, then a cgroup namespace rooted there with its own read-only cgroup2 mount. */
    write_file(CG "/sandbox/cgroup.procs", "0");
    if (unshare(CLONE_NEWNS | CLONE_NEWCGROUP) == 0) {
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
        umount2(CG, MNT_DETACH);
        if (mount("cgroup2", CG, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, NULL) != 0)
            say("cgroup2 mount in the namespace failed: %s", strerror(errno));
    } else {
        say("unshare failed: %s", strerror(errno));
    }
    for (;;) {
        int port = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
        if (port < 0) {
            sleep(1);
            continue;
        }
        if (write_all(port, GREETING) == 0) run_program(port);
        close(port);
    }
}

/* The seed loop: a copy of this VM started from another's memory (a fork) draws the same kernel randomness
 * as every other copy until its pool is reseeded. The host connects to this port only then, before the copy
 * runs: the loop greets, reads SEED_BYTES fresh bytes from the host, mixes them into the input pool with
 * full credit (RNDADDENTROPY) and makes the kernel's generator take a new key from it at once
 * (RNDRESEEDCRNG: what the VM generation id device's notification does), then answers "reseeded" or
 * "failed <errno>". It runs as root in the root cgroup: both ioctls need CAP_SYS_ADMIN, which no program
 * of a port has. The host trusts nothing it reads here beyond that one line. How many reseeds this VM's
 * line of copies took is in /run/adk-vm/reseeds (for the guest's own programs and the tests). */
static void seed_loop(void) {
    unsigned long reseeds = 0;
    struct {
        int entropy_count;
        int buf_size;
        unsigned char buf[SEED_BYTES];
    } seed;
    for (;;) {
        int port = open("/dev/adk-seed", O_RDWR | O_CLOEXEC | O_NOCTTY);
        if (port < 0) {
            sleep(1);
            continue;
        }
        if (write_all(port, SEED_GREETING) == 0 && read_exact(port, (char *)seed.buf, SEED_BYTES) == 0) {
            char answer[64] = "reseeded\n";
            int random = open("/dev/random", O_WRONLY | O_CLOEXEC);
            seed.entropy_count = SEED_BYTES * 8;
            seed.buf_size = SEED_BYTES;
            if (random < 0 || ioctl(random, RNDADDENTROPY, &seed) != 0 || ioctl(random, RNDRESEEDCRNG) != 0) {
                snprintf(answer, sizeof answer, "failed %d\n", errno);
            } else {
                char count[32];
                int fd = open("/run/adk-vm/reseeds", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
                snprintf(count, sizeof count, "%lu\n", ++reseeds);
                if (fd >= 0) {
                    write_all(fd, count);
                    close(fd);
                }
            }
            if (random >= 0) close(random);
            memset(seed.buf, 0, sizeof seed.buf);
            write_all(port, answer);
        }
        close(port);
    }
}

int main(int argc, char **argv) {
    int ports = argc > 1 ? atoi(argv[1]) : 1;
    const char *memory_mb = argc > 2 ? argv[2] : "0";
    const char *pids = argc > 3 ? argv[3] : "max";
    if (ports < 1 || ports > MAX_PORTS) ports = 1;
    int console = open("/dev/console", O_RDWR | O_NOCTTY);
    if (console >= 0) { dup2(console, 0); dup2(console, 1); dup2(console, 2); if (console > 2) close(console); }
    mkdir(CG, 0755);
    if (mount("cgroup2", CG, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        say("cannot mount cgroup2: %s", strerror(errno));
    if (write_file(CG "/cgroup.subtree_control", "+memory +pids") != 0)
        say("cannot enable the memory and pids controllers: %s", strerror(errno));
    mkdir(CG "/sandbox", 0755);
    char value[64];
    snprintf(value, sizeof value, "%sM", memory_mb);
    if (strcmp(memory_mb, "0") != 0 && write_file(CG "/sandbox/memory.max", value) != 0)
        say("cannot set memory.max: %s", strerror(errno));
    write_file(CG "/sandbox/memory.swap.max", "0");
    if (write_file(CG "/sandbox/pids.max", pids) != 0) say("cannot set pids.max: %s", strerror(errno));
    /* What the host's probe reads: the limits really in force. */
    pid_t loops[MAX_PORTS + 1] = {0};
    pid_t seeder = 0;
    for (;;) {
        if (seeder <= 0) {
            seeder = fork();
            if (seeder == 0) {
                seed_loop();
                _exit(1);
            }
        }
        for (int i = 1; i <= ports; i++) {
            if (loops[i] > 0) continue;
            pid_t pid = fork();
            if (pid == 0) {
                port_loop(i);
                _exit(1);
            }
            if (pid > 0) loops[i] = pid;
        }
        int status;
        pid_t dead = wait(&status);
        if (dead < 0) {
            if (errno != EINTR) sleep(1);
            continue;
        }
        for (int i = 1; i <= ports; i++)
            if (loops[i] == dead) loops[i] = 0;
        if (seeder == dead) seeder = 0;
    }
}
