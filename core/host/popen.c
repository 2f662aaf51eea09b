/* popen.c — io.popen for the host. The executable exports its own popen and
 * pclose, and LuaJIT's io.popen reaches them through the dynamic linker (the
 * executable's definitions come first), so a job's popen'd command leads a
 * process group of its own that the host stops, like os.execute's, before it
 * releases its locks on SIGINT/SIGTERM/SIGHUP/SIGQUIT. Otherwise they behave
 * as the C library's: /bin/sh -c CMD, mode "r" or "w" (plus "e": close on
 * exec). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host.h"

#define RL_HOST_POPENS 64

/* The streams popen handed out and their shells, for pclose. */
static struct {
    FILE *f;
    pid_t pid;
} opened[RL_HOST_POPENS];
static pthread_mutex_t opened_lock = PTHREAD_MUTEX_INITIALIZER;

/* File f as pid's stream; 0, or -1 when the table is full. */
static int file_stream(FILE *f, pid_t pid) {
    int rc = -1;
    pthread_mutex_lock(&opened_lock);
    for (int i = 0; i < RL_HOST_POPENS && rc < 0; i++)
        if (opened[i].f == NULL) opened[i].f = f, opened[i].pid = pid, rc = 0;
    pthread_mutex_unlock(&opened_lock);
    return rc;
}

/* The shell of stream f, forgotten; or -1. */
static pid_t take_stream(FILE *f) {
    pid_t pid = -1;
    pthread_mutex_lock(&opened_lock);
    for (int i = 0; i < RL_HOST_POPENS && pid < 0; i++)
        if (opened[i].f == f) pid = opened[i].pid, opened[i].f = NULL;
    pthread_mutex_unlock(&opened_lock);
    return pid;
}

__attribute__((visibility("default"))) FILE *popen(const char *cmd, const char *mode) {
    if (cmd == NULL || mode == NULL || (mode[0] != 'r' && mode[0] != 'w')) {
        errno = EINVAL;
        return NULL;
    }
    int reading = mode[0] == 'r', fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return NULL;
    int ours = reading ? fds[0] : fds[1], theirs = reading ? fds[1] : fds[0];
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        errno = e;
        return NULL;
    }
    if (pid == 0) { /* async-signal-safe calls only */
        rl_host_child_defaults();
        setpgid(0, 0);
        if (dup2(theirs, reading ? STDOUT_FILENO : STDIN_FILENO) < 0) _exit(127);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid); /* also here: the group exists before anyone signals it */
    rl_host_track_group(pid);
    close(theirs);
    if (strchr(mode, 'e') == NULL) fcntl(ours, F_SETFD, 0);
    FILE *f = fdopen(ours, reading ? "r" : "w");
    if (f == NULL || file_stream(f, pid) != 0) {
        int e = f ? EMFILE : errno;
        if (f) fclose(f);
        else close(ours);
        waitpid(pid, NULL, 0);
        errno = e;
        return NULL;
    }
    return f;
}

__attribute__((visibility("default"))) int pclose(FILE *f) {
    pid_t pid = take_stream(f);
    if (pid < 0) {
        errno = ECHILD;
        return -1;
    }
    fclose(f);
    int st;
    pid_t r;
    do r = waitpid(pid, &st, 0);
    while (r < 0 && errno == EINTR);
    rl_host_hold_if_stopping(); /* the signal thread stops the group and releases */
    return r == pid ? st : -1;
}
