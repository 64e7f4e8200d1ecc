
def stat_of(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2:].split()

def scan():
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                f = stat_of(int(name))
                procs[int(name)] = (int(f[1]), int(f[3]), f[19], f[0])  # ppid, session, start, state
            except (OSError, ValueError, IndexError):
                pass
    return procs

def start_of(pid):
    try:
        return stat_of(pid)[19]
    except (OSError, ValueError, IndexError):
        return None

def send(pid, start, sig):
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except AttributeError:
        pass
    except OSError as e:
        if e.errno != 38:  # ENOSYS: no pidfd here, fall back to kill
            return
    try:
        if start_of(pid) != start:
            return
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)

def below(roots, procs):
    kids = {}
    for p, info in procs.items():
        kids.setdefault(info[0], []).append(p)
    found, todo = set(), list(roots)
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found

def reap_any():
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        except InterruptedError:
            continue
        if not pid:
            return out
        out.append((pid, status))

def uid_of(pid):
    # The real uid (/proc/PID/status is readable for every process, non-dumpable ones included).
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None

MYUID = os.getuid()

def kill_all(targets, limit=5.0, on_reaped=None):
    # Stop first: a stopped process cannot fork, so a fork bomb cannot refill what a kill frees. Only
    # processes of this uid: no capability lets another user's be signalled (another user's agent and its
    # commands are that user's to kill), and retrying them would only spend the limit.
    stopped = set()
    end = time.monotonic() + limit
    while True:
        procs = scan()
        victims = [p for p in targets(procs)
                   if p != SELF and p in procs and procs[p][3] not in b"ZX" and uid_of(p) == MYUID]
        if not victims or time.monotonic() > end:
            return procs
        fresh = [p for p in victims if p not in stopped]
        for p in fresh or victims:
            send(p, procs[p][2], signal.SIGSTOP if fresh else signal.SIGKILL)
        stopped.update(fresh)
        if not fresh:
            for pid, status in reap_any():
                if on_reaped is not None:
                    on_reaped(pid, status)
            time.sleep(0.001)

def argv_of(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []

def marker_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(MARK):
                    return entry[len(MARK):]
    except OSError:
        pass
    return None

def parse_protected(text):
    return set((int(p), s.encode()) for p, _, s in (e.partition(":") for e in text.split(",") if e))

