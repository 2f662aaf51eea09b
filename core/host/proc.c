/*
 * proc.c — child processes of the host: fork + execve with only
 * async-signal-safe calls in between (the host has threads), in a process
 * group of their own when asked, with the signal mask and dispositions a
 * freshly started program expects, and optionally killed with the host
 * (PR_SET_PDEATHSIG): a command run under a lock must not outlive the process
 * that keeps the lock, even when that one is SIGKILLed. PR_SET_PDEATHSIG
 * reaches only the child itself; a watcher process (RL_HOST_WATCHDOG) stops
 * the rest of its process group when the host dies.
 *
 * At most one child at a time is *supervised*: when a signal ends the host,
 * the signal thread stops it (exec's COMMAND gets the signal itself, an
 * os.execute child SIGTERM), gives it its grace period, SIGKILLs what is left
 * and only then releases the locks, so that nothing protected by a lock still
 * runs once the lock is free.
 *
 * os.execute children (rl_host_system) lead a process group of their own, so
 * that stopping one reaches everything it started in that group; a group that
 * still has members when its shell returns (`cmd &`) is remembered, and is
 * stopped with SIGTERM too, as are io.popen's groups (popen.c). A script's
 * commands get SIGTERM whatever the signal: a shell's background job ignores
 * SIGINT and SIGQUIT, and many commands ignore SIGHUP, which would hold the
 * release back for the whole grace period.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "host.h"

#define RL_HOST_SYSTEM_GRACE_MS 2000 /* for os.execute children */

/* A spawn flag of proc.c's own (beside host.h's): on a signal, stop the
 * supervised child with SIGTERM rather than with the signal the host got. */
#define RL_HOST_STOP_WITH_TERM 0x100

extern char **environ;

static pthread_mutex_t sup_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    pid_t pid;     /* 0: nothing supervised */
    int group;     /* pid leads its own process group */
    int grace_ms;
    int stop_sig;  /* the signal that stops it when the host ends on one; 0: that one */
    int terminal;  /* we made its group the terminal's foreground */
    int watch_fd;  /* > 0: the write end of the watcher's pipe */
    pid_t watcher;
    int leader_gone; /* pid is reaped; its group, still running, is what is supervised */
    int stops_ignored; /* the host ignores STOP_SIGNALS meanwhile (stops_saved: as they were) */
} sup;

/* The signals that stop a process unless it handles or ignores them, but
 * SIGSTOP. The host ignores them while it supervises a child: stopped alone,
 * it would stop extending the lock and let it run out under the child, which
 * runs on. (Ctrl-Z reaches the child's group, the terminal's foreground;
 * the host sees the child stop, and stops itself: rl_host_stop_self.) */
static const int STOP_SIGNALS[] = {SIGTSTP, SIGTTIN, SIGTTOU};
#define RL_HOST_STOP_SIGNALS (sizeof(STOP_SIGNALS) / sizeof(STOP_SIGNALS[0]))
static struct sigaction stops_saved[RL_HOST_STOP_SIGNALS];

/* Ignore STOP_SIGNALS, or restore them as they were (under sup_lock). */
static void ignore_stops(int ignore) {
    if (ignore == sup.stops_ignored) return;
    struct sigaction ign;
    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    for (size_t i = 0; i < RL_HOST_STOP_SIGNALS; i++) {
        if (ignore) sigaction(STOP_SIGNALS[i], &ign, &stops_saved[i]);
        else sigaction(STOP_SIGNALS[i], &stops_saved[i], NULL);
    }
    sup.stops_ignored = ignore;
}

/* Set once a signal is ending the host: a child that ends from then on was
 * stopped by the signal thread, which still waits for the rest of its group
 * and exits the process itself. The Lua thread must not go on (and release a
 * lock) meanwhile, so the waits below never return once this is set. */
static atomic_int stopping;

static void wait_for_exit(void) {
    for (;;) pause();
}

static void (*on_interrupt)(int sig);

void rl_host_on_interrupt(void (*fn)(int sig)) {
    on_interrupt = fn;
}

/* Process groups left behind by os.execute children (their shell has
 * returned, some of its group still runs). 0: a free slot. */
#define RL_HOST_LEFTOVERS 64
static pid_t leftovers[RL_HOST_LEFTOVERS];

/* Remember pgrp as a leftover group (under sup_lock); forget groups now empty. */
static void remember_leftover(pid_t pgrp) {
    int slot = -1;
    for (int i = 0; i < RL_HOST_LEFTOVERS; i++) {
        if (leftovers[i] != 0 && !rl_host_group_alive(leftovers[i])) leftovers[i] = 0;
        if (leftovers[i] == 0 && slot < 0) slot = i;
    }
    if (slot >= 0) leftovers[slot] = pgrp;
}

void rl_host_track_group(pid_t pgrp) {
    pthread_mutex_lock(&sup_lock);
    remember_leftover(pgrp);
    pthread_mutex_unlock(&sup_lock);
}

void rl_host_hold_if_stopping(void) {
    if (atomic_load(&stopping)) wait_for_exit();
}

/* Give the terminal back to the host's process group. */
static void reclaim_terminal(void) {
    sigset_t ttou, old;
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU);
    pthread_sigmask(SIG_BLOCK, &ttou, &old);
    tcsetpgrp(STDIN_FILENO, getpgrp());
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Tell the watcher, if any, that the host stops the child itself: it exits
 * without a signal sent. Reap it unless the host is about to exit anyway.
 * Under sup_lock. */
static void disarm_watcher(int reap) {
    if (sup.watch_fd <= 0) return;
    char b = 0;
    ssize_t n;
    do n = write(sup.watch_fd, &b, 1);
    while (n < 0 && errno == EINTR);
    close(sup.watch_fd);
    sup.watch_fd = 0;
    if (reap && sup.watcher > 0) {
        pid_t r;
        do r = waitpid(sup.watcher, NULL, 0);
        while (r < 0 && errno == EINTR);
    }
    sup.watcher = 0;
}

/* Forget pid if it is the supervised child (and give the terminal back). */
static void forget(pid_t pid) {
    pthread_mutex_lock(&sup_lock);
    if (sup.pid == pid && pid != 0) {
        if (sup.terminal) reclaim_terminal();
        ignore_stops(0);
        disarm_watcher(1);
        memset(&sup, 0, sizeof(sup));
    }
    pthread_mutex_unlock(&sup_lock);
}

/* pid has been reaped by rl_host_wait. If it is the supervised child and led
 * a process group that still has live members, that group stays supervised
 * (a signal to the host stops it, the watcher still watches it) until
 * rl_host_forget; the terminal comes back to the host meanwhile, so that
 * Ctrl-C reaches the host, which stops the group (Ctrl-Z then stops nothing:
 * the host ignores it, see STOP_SIGNALS). Otherwise forget pid. */
static void reaped(pid_t pid) {
    pthread_mutex_lock(&sup_lock);
    int keep = sup.pid == pid && pid != 0 && sup.group && rl_host_group_alive(pid);
    if (keep && !sup.leader_gone) {
        sup.leader_gone = 1;
        if (sup.terminal) {
            reclaim_terminal();
            sup.terminal = 0;
        }
    }
    pthread_mutex_unlock(&sup_lock);
    if (!keep) forget(pid);
}

/* The watcher, a forked copy of the host between fork and _exit (so
 * async-signal-safe calls only): it waits on a pipe whose only write end the
 * host holds. A byte means the host dealt with the child itself; EOF means
 * the host died without doing so (SIGKILL, a crash), and then the watcher
 * stops the child's process group: SIGTERM, SIGKILL after grace_ms. */
static void watcher(int fd, pid_t pgrp, int grace_ms) {
    static const int ign[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTTOU, SIGTTIN, SIGTSTP};
    struct sigaction sa;
    sigset_t none;
    /* a group of its own: a SIGKILL to the host's group (`timeout -s KILL`,
     * `kill -9 %job`, a supervisor ending the job) must not take the
     * watcher with the host (the host sets it too, for the moment between) */
    setpgid(0, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(ign) / sizeof(ign[0]); i++) sigaction(ign[i], &sa, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* hold none of the host's files open (its output pipes, its sockets) */
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
    }
    if (fd != 3) {
        dup2(fd, 3);
        fd = 3;
    }
    for (int i = 4; i < 1024; i++) close(i);
    char b;
    ssize_t n;
    do n = read(fd, &b, 1);
    while (n < 0 && errno == EINTR);
    if (n == 1) _exit(0);
    kill(-pgrp, SIGTERM);
    kill(-pgrp, SIGCONT);
    struct timespec tick = {0, 10 * 1000000L};
    for (int waited = 0; waited < grace_ms; waited += 10) {
        if (kill(-pgrp, 0) != 0 && errno == ESRCH) _exit(0);
        nanosleep(&tick, NULL);
    }
    kill(-pgrp, SIGKILL);
    _exit(0);
}

/* Start a watcher for the supervised child's group (under sup_lock). */
static void start_watcher(pid_t pgrp, int grace_ms) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    pid_t w = fork();
    if (w == 0) {
        close(fds[1]);
        watcher(fds[0], pgrp, grace_ms);
    }
    close(fds[0]);
    if (w < 0) {
        close(fds[1]);
        return;
    }
    setpgid(w, w);
    sup.watch_fd = fds[1];
    sup.watcher = w;
}

static int decode(int st) {
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 128;
}

/* Find file in PATH like execvp(3) would, before forking (the child of a
 * threaded process should only make async-signal-safe calls). Return 0 with
 * out filled, or an errno: ENOENT (nowhere), EACCES (found, not executable),
 * ENAMETOOLONG (a path longer than outlen). */
static int resolve(const char *file, char *out, size_t outlen) {
    if (strchr(file, '/')) /* a path cut short would run another program */
        return snprintf(out, outlen, "%s", file) < (int)outlen ? 0 : ENAMETOOLONG;
    const char *path = getenv("PATH");
    if (path == NULL || *path == '\0') path = "/usr/local/bin:/usr/bin:/bin";
    int found_unexecutable = 0;
    for (const char *p = path;; p++) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (snprintf(out, outlen, "%.*s%s%s", (int)len, p, len ? "/" : "", file) < (int)outlen) {
            struct stat st;
            if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) {
                if (access(out, X_OK) == 0) return 0;
                found_unexecutable = 1;
            }
        }
        if (!end) break;
        p = end;
    }
    return found_unexecutable ? EACCES : ENOENT;
}

/* The signals a caller may have set to be ignored before starting us, and
 * which of them it had. */
static const int INHERITED[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
static int ignored_at_start[sizeof(INHERITED) / sizeof(INHERITED[0])];

void rl_host_note_ignored_signals(void) {
    for (size_t i = 0; i < sizeof(INHERITED) / sizeof(INHERITED[0]); i++) {
        struct sigaction was;
        ignored_at_start[i] = sigaction(INHERITED[i], NULL, &was) == 0 && was.sa_handler == SIG_IGN;
    }
}

int rl_host_ignored_at_start(int sig) {
    for (size_t i = 0; i < sizeof(INHERITED) / sizeof(INHERITED[0]); i++)
        if (INHERITED[i] == sig) return ignored_at_start[i];
    return 0;
}

void rl_host_child_defaults(void) {
    static const int dflt[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTTOU, SIGTTIN, SIGTSTP};
    struct sigaction sa;
    sigset_t none;
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(dflt) / sizeof(dflt[0]); i++) {
        /* what the caller ignored when it started us stays ignored (nohup) */
        sa.sa_handler = rl_host_ignored_at_start(dflt[i]) ? SIG_IGN : SIG_DFL;
        sigaction(dflt[i], &sa, NULL);
    }
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The child between fork and exec: async-signal-safe calls only. A file
 * without a #! line (ENOEXEC) runs under /bin/sh, as execvp(3) and flock(1)
 * run it: sh_argv is "sh", path, then argv's arguments (NULL: no memory for
 * it, and ENOEXEC is the error). */
static void child(const char *path, const char *const *argv, const char *const *sh_argv, int flags, pid_t parent,
                  int errfd) {
    int e;
    rl_host_child_defaults();
    if ((flags & RL_HOST_NEWPGRP) && setpgid(0, 0) != 0) goto fail;
    if (flags & RL_HOST_DIE_WITH_HOST) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) goto fail;
        if (getppid() != parent) _exit(127); /* the host is already gone */
    }
    execve(path, (char *const *)argv, environ);
    if (errno == ENOEXEC && sh_argv != NULL) execve("/bin/sh", (char *const *)sh_argv, environ);
fail:
    e = errno;
    if (write(errfd, &e, sizeof(e)) < 0) { /* nothing more to do */ }
    _exit(127);
}

static int spawn(const char *file, int search, const char *const *argv, int flags, int grace_ms,
                 int *errnum) {
    char path[4096];
    int fds[2], e = 0;
    pid_t parent = getpid();
    if (search) {
        if ((e = resolve(file, path, sizeof(path))) != 0) {
            *errnum = e;
            return -1;
        }
    } else if (snprintf(path, sizeof(path), "%s", file) >= (int)sizeof(path)) {
        *errnum = ENAMETOOLONG;
        return -1;
    }
    size_t argc = 0;
    while (argv[argc] != NULL) argc++;
    const char **sh_argv = malloc((argc + 2) * sizeof(*sh_argv));
    if (sh_argv != NULL) {
        sh_argv[0] = "sh";
        sh_argv[1] = path;
        for (size_t i = 1; i <= argc; i++) sh_argv[i + 1] = argv[i];
    }
    if (pipe2(fds, O_CLOEXEC) != 0) {
        *errnum = errno;
        free(sh_argv);
        return -1;
    }

    pthread_mutex_lock(&sup_lock);
    pid_t pid = fork();
    if (pid == 0) child(path, argv, sh_argv, flags, parent, fds[1]);
    if (pid < 0) e = errno;
    free(sh_argv);
    close(fds[1]);
    if (pid > 0) {
        /* EOF: exec succeeded (the pipe is close-on-exec); else the child's errno */
        ssize_t n;
        do n = read(fds[0], &e, sizeof(e));
        while (n < 0 && errno == EINTR);
        if (n == (ssize_t)sizeof(e)) {
            waitpid(pid, NULL, 0);
            pid = -1;
        } else {
            e = 0;
        }
    }
    close(fds[0]);
    if (pid > 0 && (flags & RL_HOST_SUPERVISE)) {
        sup.pid = pid;
        sup.group = (flags & RL_HOST_NEWPGRP) != 0;
        sup.grace_ms = grace_ms;
        sup.stop_sig = (flags & RL_HOST_STOP_WITH_TERM) ? SIGTERM : 0;
        sup.terminal = 0;
        ignore_stops(1);
        if ((flags & RL_HOST_WATCHDOG) && sup.group) start_watcher(pid, grace_ms);
        if ((flags & RL_HOST_FOREGROUND) && sup.group && isatty(STDIN_FILENO) &&
            tcgetpgrp(STDIN_FILENO) == getpgrp()) {
            if (tcsetpgrp(STDIN_FILENO, pid) == 0) {
                sup.terminal = 1;
                kill(-pid, SIGCONT); /* in case it read the terminal before it was its own */
            }
        }
    }
    pthread_mutex_unlock(&sup_lock);
    if (pid < 0) {
        *errnum = e;
        return -1;
    }
    return pid;
}

int rl_host_spawn(const char *const *argv, int flags, int grace_ms, int *errnum) {
    if (argv == NULL || argv[0] == NULL) {
        *errnum = EINVAL;
        return -1;
    }
    return spawn(argv[0], 1, argv, flags, grace_ms, errnum);
}

int rl_host_wait(int pid, int block, int *code) {
    int st;
    pid_t r;
    int options = ((block & RL_HOST_WAIT_BLOCK) ? 0 : WNOHANG) | ((block & RL_HOST_WAIT_STOPS) ? WUNTRACED : 0);
    do r = waitpid(pid, &st, options);
    while (r < 0 && errno == EINTR);
    if (r != 0 && atomic_load(&stopping)) wait_for_exit();
    if (r == 0) return 0;
    if (r > 0 && WIFSTOPPED(st)) {
        *code = WSTOPSIG(st);
        return 2;
    }
    if (r < 0) {
        *code = errno;
        if (errno == ECHILD) forget(pid);
        return -1;
    }
    reaped(pid);
    *code = decode(st);
    return 1;
}

void rl_host_forget(int pid) {
    forget(pid);
    if (atomic_load(&stopping)) wait_for_exit();
}

int rl_host_stop_self(int pid, int sig) {
    /* Only a job-control stop with a terminal (Ctrl-Z, a background read or
     * write): the shell is there to continue us. Any other stop (SIGSTOP from
     * a debugger or a CPU limiter, which may continue the child alone) is the
     * child's: the host goes on supervising it and keeping its lock. */
    if (!((sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU) && isatty(STDIN_FILENO))) return 0;
    raise(SIGSTOP); /* (sig itself is ignored while the host supervises) */
    /* continued: the terminal back to the child, if it had it and we have it */
    pthread_mutex_lock(&sup_lock);
    if (sup.pid == pid && sup.terminal && isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp()) {
        sigset_t ttou, old;
        sigemptyset(&ttou);
        sigaddset(&ttou, SIGTTOU);
        pthread_sigmask(SIG_BLOCK, &ttou, &old);
        tcsetpgrp(STDIN_FILENO, pid);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    pthread_mutex_unlock(&sup_lock);
    return 1;
}

int rl_host_kill(int pid, int sig, int group) {
    if (pid <= 0) {
        errno = EINVAL;
        return -1;
    }
    return kill(group ? -pid : pid, sig);
}

/* True if /proc/NAME/stat shows a live (not zombie) member of process group pgrp. */
static int live_member(const char *name, pid_t pgrp) {
    char path[300], buf[512];
    snprintf(path, sizeof(path), "/proc/%s/stat", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    /* pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses */
    char *rp = strrchr(buf, ')');
    char state;
    int ppid, group;
    return rp && sscanf(rp + 1, " %c %d %d", &state, &ppid, &group) == 3 && group == pgrp &&
           state != 'Z' && state != 'X';
}

/* The last live member rl_host_group_alive found: checked first next time, so
 * that polling a group that keeps running reads one file, not all of /proc. */
static atomic_int member_hint;

/* A zombie still counts for kill(-pgrp, 0), and an orphaned zombie may never
 * be reaped (a container's init may not wait), so read /proc instead. */
int rl_host_group_alive(int pid) {
    if (pid <= 0) return 0;
    if (kill(-pid, 0) != 0 && errno == ESRCH) return 0;
    char name[24];
    int hint = atomic_load(&member_hint);
    snprintf(name, sizeof(name), "%d", hint);
    if (hint > 0 && live_member(name, pid)) return 1;
    DIR *d = opendir("/proc");
    if (d == NULL) return 1;
    int alive = 0;
    struct dirent *de;
    while (!alive && (de = readdir(d)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        if (live_member(de->d_name, pid)) {
            alive = 1;
            atomic_store(&member_hint, atoi(de->d_name));
        }
    }
    closedir(d);
    return alive;
}

int rl_host_system(const char *cmd) {
    const char *argv[] = {"sh", "-c", cmd, NULL};
    int err;
    if (cmd == NULL) return access("/bin/sh", X_OK) == 0;
    int pid = spawn("/bin/sh", 0, argv,
                    RL_HOST_NEWPGRP | RL_HOST_SUPERVISE | RL_HOST_FOREGROUND | RL_HOST_STOP_WITH_TERM,
                    RL_HOST_SYSTEM_GRACE_MS, &err);
    if (pid < 0) {
        errno = err;
        return -1;
    }
    int st;
    pid_t r;
    do r = waitpid(pid, &st, 0);
    while (r < 0 && errno == EINTR);
    if (atomic_load(&stopping)) wait_for_exit();
    pthread_mutex_lock(&sup_lock);
    int terminal = sup.pid == pid && sup.terminal;
    if (rl_host_group_alive(pid)) remember_leftover(pid);
    pthread_mutex_unlock(&sup_lock);
    forget(pid);
    /* Ctrl-C or Ctrl-\ reached only the command, whose group had the
     * terminal: it was meant for the host too, as when the host kept the
     * terminal (unless the host ignores that signal: see signals.c). */
    int sig = r == pid && WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    if (terminal && (sig == SIGINT || (sig == SIGQUIT && !rl_host_ignored_at_start(SIGQUIT))) && on_interrupt)
        on_interrupt(sig);
    return r == pid ? st : -1;
}

void rl_host_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* True once the supervised child (and, for a group, everyone in it) is gone.
 * Reaps the child when it has ended. */
static int gone(pid_t pid, int group) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (group) return !rl_host_group_alive(pid);
    return r == pid || (r < 0 && errno == ECHILD) || (kill(pid, 0) != 0 && errno == ESRCH);
}

/* True once every target is gone. */
static int all_gone(const pid_t *pids, const int *groups, int n) {
    for (int i = 0; i < n; i++)
        if (!gone(pids[i], groups[i])) return 0;
    return 1;
}

void rl_host_stop_supervised(int sig) {
    pid_t pids[RL_HOST_LEFTOVERS + 1];
    int groups[RL_HOST_LEFTOVERS + 1], sigs[RL_HOST_LEFTOVERS + 1], n = 0;
    atomic_store(&stopping, 1);
    pthread_mutex_lock(&sup_lock);
    int grace_ms = RL_HOST_SYSTEM_GRACE_MS, terminal = sup.terminal;
    if (sup.pid > 0) {
        pids[n] = sup.pid;
        sigs[n] = sup.stop_sig ? sup.stop_sig : sig;
        groups[n++] = sup.group;
        grace_ms = sup.grace_ms;
    }
    for (int i = 0; i < RL_HOST_LEFTOVERS; i++) {
        if (leftovers[i] == 0) continue;
        pids[n] = leftovers[i];
        sigs[n] = SIGTERM; /* os.execute's and io.popen's groups */
        groups[n++] = 1;
        leftovers[i] = 0;
    }
    pthread_mutex_unlock(&sup_lock);
    if (n == 0) return;
    for (int i = 0; i < n; i++) {
        rl_host_kill(pids[i], sigs[i], groups[i]);
        rl_host_kill(pids[i], SIGCONT, groups[i]); /* a stopped child cannot act on it */
    }
    for (int waited = 0; waited < grace_ms && !all_gone(pids, groups, n); waited += 10)
        rl_host_sleep_ms(10);
    if (!all_gone(pids, groups, n)) {
        for (int i = 0; i < n; i++) rl_host_kill(pids[i], SIGKILL, groups[i]);
        for (int waited = 0; waited < 1000 && !all_gone(pids, groups, n); waited += 10)
            rl_host_sleep_ms(10);
    }
    pthread_mutex_lock(&sup_lock);
    disarm_watcher(0);
    pthread_mutex_unlock(&sup_lock);
    if (terminal) reclaim_terminal();
}
