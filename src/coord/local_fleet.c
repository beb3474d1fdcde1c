/* local_fleet.c - a fleet of child processes on loopback. */
#include "local_fleet.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "split_cache.h"

/* How long a worker may take to load its shard and start listening. */
#define START_TIMEOUT_MS 120000

/* The fleets of this process between mkdtemp and their stop, for ps_local_fleet_abort_all
 * (a signal handler): slots taken and left with lock-free atomics only. */
#define LIVE_MAX 8
static _Atomic(ps_local_fleet *) live[LIVE_MAX];

/* Registers lf in a free slot of live (none free: lf is only stopped the normal way). */
static void live_add(ps_local_fleet *lf) {
    for (int i = 0; i < LIVE_MAX; i++) {
        ps_local_fleet *none = NULL;
        if (atomic_compare_exchange_strong(&live[i], &none, lf)) return;
    }
}

/* Forgets lf. */
static void live_remove(ps_local_fleet *lf) {
    for (int i = 0; i < LIVE_MAX; i++) {
        ps_local_fleet *me = lf;
        atomic_compare_exchange_strong(&live[i], &me, NULL);
    }
}

/* Reads the line a starting worker writes to fd once listening (its port, or its unix:
 * address), within START_TIMEOUT_MS. Returns the port, 0 for a Unix socket, -1 for none. */
static int read_port(int fd) {
    char buf[4400];
    size_t n = 0;
    while (n < sizeof buf - 1) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, START_TIMEOUT_MS) <= 0) return -1;
        ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
        if (memchr(buf, '\n', n)) break;
    }
    buf[n] = 0;
    if (ps_net_is_unix(buf)) return 0;
    int port = atoi(buf);
    return port > 0 && port < 65536 ? port : -1;
}

/* With --pin, in the child of stage k of n: when every stage's threads fit the CPUs side by
 * side, keeps the k-th block of `threads` of them (stage 0, the coordinator, pins to the
 * first block), so that each stage has cores of its own, as on a machine of its own (a
 * prompt's chunks then overlap: stage k on chunk i while stage k+1 on chunk i-1). Otherwise
 * every stage keeps them all, and they take turns on the same cores. */
static void own_cores(int k, int n, int threads) {
    int cpus[CPU_SETSIZE], m = ps_first_cpus(cpus, CPU_SETSIZE);
    if (m <= 0 || (long long)threads * n > m) return;
    cpu_set_t mine;
    CPU_ZERO(&mine);
    for (int i = 0; i < threads; i++) CPU_SET(cpus[k * threads + i], &mine);
    sched_setaffinity(0, sizeof mine, &mine);
}

/* Starts the worker of stage k, listening on loopback TCP or on dir/stage-K.sock; its
 * messages go to dir/worker-K.log. */
static ps_status spawn(ps_local_fleet *lf, int k, const ps_local_fleet_opts *o, const char *key_path, char *err,
                       size_t errlen) {
    const ps_stage_opts *so = o->stage;
    const ps_link_sim *sim = o->sim;
    bool unix_socket = o->unix_sockets;
    char listen[sizeof lf->fleet.stages[k].address] = "127.0.0.1:0";
    if (unix_socket &&
        (size_t)snprintf(listen, sizeof listen, "unix:%s/stage-%d.sock", lf->dir, k) - 5 > PS_UNIX_PATH_MAX)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "the socket path %s is longer than %d bytes (set TMPDIR to a shorter "
                       "directory)",
                       listen + 5, PS_UNIX_PATH_MAX);
    int pfd[2];
    if (pipe(pfd)) return ps_errf(err, errlen, PS_ERR_IO, "pipe: %s", strerror(errno));
    char log[4200], t[16], rfd[16], lat[32], bw[32];
    snprintf(log, sizeof log, "%s/worker-%d.log", lf->dir, k);
    snprintf(t, sizeof t, "%d", so->threads);
    snprintf(rfd, sizeof rfd, "%d", pfd[1]);
    snprintf(lat, sizeof lat, "%g", sim->latency_ms);
    snprintf(bw, sizeof bw, "%g", sim->bandwidth_mbps);
    /* Signals wait until the child is in lf->pids, where ps_local_fleet_abort_all finds it. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pid_t pid = fork();
    if (pid < 0) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        close(pfd[0]), close(pfd[1]);
        return ps_errf(err, errlen, PS_ERR_IO, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);      /* never outlive the coordinator */
        setpgid(0, 0);                         /* a terminal's Ctrl-C is the coordinator's to handle */
        for (int sig = 1; sig < NSIG; sig++) { /* the caller's handlers are not the worker's */
            struct sigaction cur;
            if (!sigaction(sig, NULL, &cur) && cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN)
                signal(sig, SIG_DFL);
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        ps_thread_unpin(); /* a --pin'd coordinator's thread has one CPU left */
        if (so->pin) own_cores(k, lf->fleet.n_stages, so->threads);
        close(pfd[0]);
        int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (lfd >= 0) dup2(lfd, 2), close(lfd);
        char *args[] = {"pipeshard",
                        "worker",
                        "--shard",
                        lf->fleet.stages[k].shard,
                        "--listen",
                        listen,
                        "-t",
                        t,
                        "--key-file",
                        (char *)key_path,
                        "--ready-fd",
                        rfd,
                        "--sim-latency-ms",
                        lat,
                        "--sim-bandwidth-mbps",
                        bw,
                        "--max-ctx",
                        "16777216" /* ours: whatever run -c asks */,
                        "--plain-frames" /* this host: sealing buys nothing */,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL};
        char **flag = args;
        while (*flag) flag++;
        if (o->prefix_dir) *flag++ = "--prefix-dir", *flag++ = (char *)o->prefix_dir;
        if (so->pin) *flag++ = "--pin";
        if (so->mmap) *flag++ = "--mmap";
        if (o->host_hops) *flag++ = "--host-hops";
        char dev[16];
        int device = o->n_devices ? o->devices[k < o->n_devices ? k : o->n_devices - 1] : so->device;
        if (device != PS_DEVICE_CPU) *flag++ = "--device", *flag++ = (char *)ps_device_name(device, dev, sizeof dev);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(pfd[1]);
    lf->pids[k] = pid;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    int port = read_port(pfd[0]);
    close(pfd[0]);
    if (port < 0) {
        char tail[512] = "";
        FILE *f = fopen(log, "r");
        if (f) {
            size_t n = fread(tail, 1, sizeof tail - 1, f);
            tail[n] = 0;
            fclose(f);
            for (char *p = tail; *p; p++)
                if (*p == '\n') *p = ' ';
        }
        return ps_errf(err, errlen, PS_ERR_IO, "the local worker of stage %d did not start: %s", k,
                       tail[0] ? tail : "no message");
    }
    if (unix_socket)
        snprintf(lf->fleet.stages[k].address, sizeof lf->fleet.stages[k].address, "%s", listen);
    else
        snprintf(lf->fleet.stages[k].address, sizeof lf->fleet.stages[k].address, "127.0.0.1:%d", port);
    return PS_OK;
}

/* Writes the key file: key_file's key, or 32 fresh random bytes. */
static ps_status make_key(ps_local_fleet *lf, const char *key_file, char *path, size_t cap, char *err, size_t errlen) {
    if (key_file) {
        snprintf(path, cap, "%s", key_file);
        return ps_net_key_load(key_file, lf->key, err, errlen);
    }
    uint8_t raw[32];
    if (getrandom(raw, sizeof raw, 0) != sizeof raw)
        return ps_errf(err, errlen, PS_ERR_IO, "no random bytes for a key");
    snprintf(path, cap, "%s/key", lf->dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    bool ok = fd >= 0 && write(fd, raw, sizeof raw) == (ssize_t)sizeof raw;
    if (fd >= 0) close(fd);
    if (!ok) return ps_errf(err, errlen, PS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return ps_net_key_load(path, lf->key, err, errlen);
}

ps_status ps_local_fleet_start(const char *model, int n_stages, const ps_local_fleet_opts *o, ps_local_fleet *lf,
                               char *err, size_t errlen) {
    const ps_progress *progress = o->progress;
    memset(lf, 0, sizeof *lf);
    const char *tmp = getenv("TMPDIR");
    snprintf(lf->dir, sizeof lf->dir, "%s/pipeshard-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(lf->dir)) {
        ps_status s = ps_errf(err, errlen, PS_ERR_IO, "cannot create %s: %s", lf->dir, strerror(errno));
        lf->dir[0] = 0;
        return s;
    }
    live_add(lf);
    char key_path[4200];
    ps_status s = ps_split_cache_get(model, n_stages, lf->dir, progress, &lf->fleet, err, errlen);
    if (!s) s = make_key(lf, o->key_file, key_path, sizeof key_path, err, errlen);
    lf->n = lf->fleet.n_stages;
    char what[64];
    snprintf(what, sizeof what, "starting %d worker%s", lf->n - 1, lf->n > 2 ? "s" : "");
    for (int k = 1; !s && k < lf->n; k++) {
        if (k == 1) ps_progress_report(progress, what, 0, 0);
        s = spawn(lf, k, o, key_path, err, errlen);
    }
    return s;
}

/* Removes the files of dir and dir itself (one level: the run's directory has no others
 * but shards/, emptied first). */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4400];
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!strcmp(e->d_name, "shards"))
            remove_dir(path);
        else
            unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* The fleet stays in live until its directory is gone: a signal meanwhile (on_signal of
 * run.c, while this waits for a worker) still finds what to remove. */
void ps_local_fleet_stop(ps_local_fleet *lf) {
    for (int k = 1; k < lf->n; k++)
        if (lf->pids[k] > 0) kill(lf->pids[k], SIGTERM);
    for (int k = 1; k < lf->n; k++) {
        if (lf->pids[k] <= 0) continue;
        int st;
        for (int i = 0; i < 500 && waitpid(lf->pids[k], &st, WNOHANG) == 0; i++) usleep(10000);
        if (waitpid(lf->pids[k], &st, WNOHANG) == 0) {
            kill(lf->pids[k], SIGKILL);
            waitpid(lf->pids[k], &st, 0);
        }
        lf->pids[k] = 0;
    }
    if (lf->dir[0]) remove_dir(lf->dir);
    live_remove(lf);
    lf->dir[0] = 0;
}

/* Removes the entries of the directory open as fd and, with shards/ (the only directory
 * there), its files, through system calls only (async-signal-safe; getdents64 is a raw
 * system call). Entries removed while reading may hide others: the caller repeats. */
static void abort_remove_entries(int fd, int depth) {
    char buf[4096] __attribute__((aligned(8)));
    lseek(fd, 0, SEEK_SET);
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            struct {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *e = (void *)(buf + off);
            off += e->reclen;
            if (!strcmp(e->name, ".") || !strcmp(e->name, "..")) continue;
            if (!unlinkat(fd, e->name, 0) || errno != EISDIR || depth > 0) continue;
            int sub = openat(fd, e->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (sub < 0) continue;
            for (int pass = 0; pass < 4; pass++) abort_remove_entries(sub, depth + 1);
            close(sub);
            unlinkat(fd, e->name, AT_REMOVEDIR);
        }
    }
}

/* See local_fleet.h. */
void ps_local_fleet_abort_all(void) {
    for (int i = 0; i < LIVE_MAX; i++) {
        ps_local_fleet *lf = atomic_load(&live[i]);
        if (!lf) continue;
        for (int k = 1; k < lf->n && k < PS_SHARD_MAX_STAGES; k++)
            if (lf->pids[k] > 0) kill(lf->pids[k], SIGKILL);
        for (int k = 1; k < lf->n && k < PS_SHARD_MAX_STAGES; k++)
            if (lf->pids[k] > 0) waitpid(lf->pids[k], NULL, 0);
        int fd = lf->dir[0] ? open(lf->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        for (int pass = 0; fd >= 0 && rmdir(lf->dir) && pass < 4; pass++) abort_remove_entries(fd, 0);
        if (fd >= 0) close(fd);
    }
}
