/*
 * proc.c — child processes of the host: started with posix_spawn (safe in a
 * process with threads), in a process group of their own when asked, with the
 * signal mask and dispositions a freshly started program expects.
 *
 * At most one child at a time is *supervised*: when a signal ends the host,
 * the signal thread forwards the signal to it, gives it its grace period,
 * SIGKILLs what is left and only then releases the locks, so that nothing
 * protected by a lock still runs once the lock is free.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "host.h"

#define RL_HOST_SYSTEM_GRACE_MS 2000 /* for os.execute children */

extern char **environ;

static pthread_mutex_t sup_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    pid_t pid;     /* 0: nothing supervised */
    int group;     /* pid leads its own process group */
    int grace_ms;
    int terminal;  /* we made its group the terminal's foreground */
} sup;

/* Give the terminal back to the host's process group. */
static void reclaim_terminal(void) {
    sigset_t ttou, old;
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU);
    pthread_sigmask(SIG_BLOCK, &ttou, &old);
    tcsetpgrp(STDIN_FILENO, getpgrp());
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Forget pid if it is the supervised child (and give the terminal back). */
static void forget(pid_t pid) {
    pthread_mutex_lock(&sup_lock);
    if (sup.pid == pid && pid != 0) {
        if (sup.terminal) reclaim_terminal();
        memset(&sup, 0, sizeof(sup));
    }
    pthread_mutex_unlock(&sup_lock);
}

static int decode(int st) {
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 128;
}

static int spawn(const char *path, int search, const char *const *argv, int flags, int grace_ms,
                 int *errnum) {
    posix_spawnattr_t attr;
    sigset_t none, dflt;
    short how = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    pid_t pid = -1;
    int rc;

    posix_spawnattr_init(&attr);
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    sigemptyset(&dflt);
    sigaddset(&dflt, SIGINT);
    sigaddset(&dflt, SIGTERM);
    sigaddset(&dflt, SIGHUP);
    sigaddset(&dflt, SIGQUIT);
    sigaddset(&dflt, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &dflt);
    if (flags & RL_HOST_NEWPGRP) {
        how |= POSIX_SPAWN_SETPGROUP;
        posix_spawnattr_setpgroup(&attr, 0);
    }
    posix_spawnattr_setflags(&attr, how);

    pthread_mutex_lock(&sup_lock);
    rc = search ? posix_spawnp(&pid, path, NULL, &attr, (char *const *)argv, environ)
                : posix_spawn(&pid, path, NULL, &attr, (char *const *)argv, environ);
    posix_spawnattr_destroy(&attr);
    if (rc == 0 && (flags & RL_HOST_SUPERVISE)) {
        sup.pid = pid;
        sup.group = (flags & RL_HOST_NEWPGRP) != 0;
        sup.grace_ms = grace_ms;
        sup.terminal = 0;
        if ((flags & RL_HOST_FOREGROUND) && sup.group && isatty(STDIN_FILENO) &&
            tcgetpgrp(STDIN_FILENO) == getpgrp()) {
            setpgid(pid, pid); /* may already be done by the child: harmless */
            if (tcsetpgrp(STDIN_FILENO, pid) == 0) {
                sup.terminal = 1;
                kill(-pid, SIGCONT); /* in case it read the terminal before it was its own */
            }
        }
    }
    pthread_mutex_unlock(&sup_lock);
    if (rc != 0) {
        *errnum = rc;
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
    do r = waitpid(pid, &st, block ? 0 : WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == 0) return 0;
    if (r < 0) {
        *code = errno;
        if (errno == ECHILD) forget(pid);
        return -1;
    }
    forget(pid);
    *code = decode(st);
    return 1;
}

int rl_host_kill(int pid, int sig, int group) {
    if (pid <= 0) {
        errno = EINVAL;
        return -1;
    }
    return kill(group ? -pid : pid, sig);
}

int rl_host_group_alive(int pid) {
    if (pid <= 0) return 0;
    return kill(-pid, 0) == 0 || errno == EPERM;
}

int rl_host_system(const char *cmd) {
    const char *argv[] = {"sh", "-c", cmd, NULL};
    int err, code;
    if (cmd == NULL) return access("/bin/sh", X_OK) == 0;
    int pid = spawn("/bin/sh", 0, argv, RL_HOST_SUPERVISE, RL_HOST_SYSTEM_GRACE_MS, &err);
    if (pid < 0) {
        errno = err;
        return -1;
    }
    int st;
    pid_t r;
    do r = waitpid(pid, &st, 0);
    while (r < 0 && errno == EINTR);
    forget(pid);
    (void)code;
    return r == pid ? st : -1;
}

/* True once the supervised child (and, for a group, everyone in it) is gone.
 * Reaps the child when it has ended. */
static int gone(pid_t pid, int group) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (group) return !rl_host_group_alive(pid);
    return r == pid || (r < 0 && errno == ECHILD) || (kill(pid, 0) != 0 && errno == ESRCH);
}

void rl_host_stop_supervised(int sig) {
    pthread_mutex_lock(&sup_lock);
    pid_t pid = sup.pid;
    int group = sup.group, grace_ms = sup.grace_ms, terminal = sup.terminal;
    pthread_mutex_unlock(&sup_lock);
    if (pid <= 0) return;
    rl_host_kill(pid, sig, group);
    rl_host_kill(pid, SIGCONT, group); /* a stopped child cannot act on sig */
    for (int waited = 0; waited < grace_ms && !gone(pid, group); waited += 10) rl_host_sleep_ms(10);
    if (!gone(pid, group)) {
        rl_host_kill(pid, SIGKILL, group);
        for (int waited = 0; waited < 1000 && !gone(pid, group); waited += 10) rl_host_sleep_ms(10);
    }
    if (terminal) reclaim_terminal();
}
