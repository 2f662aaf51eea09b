/*
 * signals.c — SIGINT, SIGTERM, SIGHUP and SIGQUIT end the host cleanly,
 * whatever the Lua thread is doing (a long loop, os.execute, a blocking read).
 * SIGHUP and SIGQUIT ignored when the host started stay ignored (nohup; a
 * non-interactive shell's `cmd &`); SIGINT and SIGTERM are always the host's.
 * All four are unblocked (a caller may start us with them blocked), and
 * SIGCHLD is back at its default (ignored, the kernel would reap COMMAND).
 *
 * The handler only writes the signal number into a pipe; a dedicated thread
 * reads it and does the work no handler may do: stop the supervised child,
 * release every kept lock (rl_keeper_release_all), _exit(128 + signal).
 * Handlers, not a blocked mask, so that children started by io.popen and
 * friends inherit an ordinary signal mask and default dispositions.
 *
 * Exactly one of two paths ends the process: the signal thread, or a normal
 * exit through rl_host_finish. Whichever claims the exit first wins; the other
 * waits for it (so the exit status is the winner's).
 *
 * A lock being acquired on the Lua thread (rl_host_acquire_begin/_end around
 * dlm:lock and friends) is not the keeper's yet: its SETs may already be on
 * the nodes. A signal that comes then makes the signal thread wait, at most
 * the bound the Lua side gave, until that acquisition is over: an attempt in
 * flight ends within its node and connect timeouts and either releases what
 * it got (no quorum) or hands the lock to the keeper. Between attempts the
 * library ends the acquisition while it sleeps and begins it again after
 * (its sleeping and awake hooks, redlock.hooks), so a signal then never waits. rl_host_acquire_end then never
 * returns, and the signal thread releases every kept lock and exits as usual.
 * An acquisition that would begin once the signal thread has taken over the
 * exit never begins.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host.h"
#include "redlock.h"

static int pipe_fd[2] = {-1, -1};
static atomic_int exit_claim;     /* 0: nobody; -1: normal exit; > 0: that signal */
static atomic_int defer_mode;
static atomic_int pending_sig;
static atomic_int deferred_count;

/* Acquisitions under way on the Lua thread (acq_lock guards them). */
static pthread_mutex_t acq_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t acq_done;
static int acq_depth;        /* nested begin/end pairs under way */
static int acq_bound_ms;     /* how long the outermost one may still take after a signal */
static pthread_t acq_thread; /* the thread inside them */

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(pipe_fd[1], &b, 1) < 0) { /* pipe full: a signal is pending anyway */ }
    errno = saved;
}

/* A write to a closed pipe or socket reports EPIPE instead of killing the
 * host (being caught, not ignored, SIGPIPE is back at SIG_DFL in every child
 * after execve). Our sockets never raise it (MSG_NOSIGNAL); the one write
 * that must end the host is a script's to a standard output whose reader is
 * gone (`redlock run job.lua | head -1`): then the host ends as a plain
 * program would (141), releasing what it holds on the way out. */
static void on_sigpipe(int sig) {
    int saved = errno;
    struct pollfd out = {.fd = STDOUT_FILENO, .events = POLLOUT};
    if (poll(&out, 1, 0) == 1 && (out.revents & POLLERR)) on_signal(sig);
    errno = saved;
}

/* Claim the exit for who (-1 normal, > 0 signal). Return 1 if it was ours. */
static int claim_exit(int who) {
    int expected = 0;
    return atomic_compare_exchange_strong(&exit_claim, &expected, who);
}

static void never_return(void) {
    for (;;) pause();
}

/* Flush what the script printed, unless the Lua thread is inside stdio with
 * the stream locked (it may be blocked writing to a full pipe). */
static void flush_if_free(FILE *f) {
    if (ftrylockfile(f) == 0) {
        fflush_unlocked(f);
        funlockfile(f);
    }
}

/* Wait (bounded) for the acquisition under way, if any, to be over. Called
 * once the exit is claimed: none can begin from then on. */
static void await_acquisition(void) {
    pthread_mutex_lock(&acq_lock);
    if (acq_depth > 0 && !pthread_equal(acq_thread, pthread_self())) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += acq_bound_ms / 1000;
        until.tv_nsec += (long)(acq_bound_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (acq_depth > 0)
            if (pthread_cond_timedwait(&acq_done, &acq_lock, &until) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&acq_lock);
}

static void terminate(int sig) {
    pthread_mutex_lock(&acq_lock); /* an acquisition begins before the claim, or never */
    int mine = claim_exit(sig);
    pthread_mutex_unlock(&acq_lock);
    if (!mine) return; /* a normal exit is under way; let it finish */
    rl_host_stop_supervised(sig);
    await_acquisition();
    rl_keeper_release_all(RL_HOST_RELEASE_TIMEOUT_MS);
    flush_if_free(stdout);
    flush_if_free(stderr);
    _exit(128 + sig);
}

/* A signal meant for the host reached only a child (rl_host_on_interrupt):
 * act as if the host had received it. */
static void interrupted(int sig) {
    if (atomic_load(&defer_mode) && atomic_fetch_add(&deferred_count, 1) < 2) {
        int none = 0;
        atomic_compare_exchange_strong(&pending_sig, &none, sig);
        return;
    }
    terminate(sig);
}

static void *signal_thread(void *ud) {
    (void)ud;
    for (;;) {
        unsigned char b;
        ssize_t n = read(pipe_fd[0], &b, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL;
        int sig = b;
        if (atomic_load(&defer_mode) && atomic_fetch_add(&deferred_count, 1) < 2) {
            int none = 0;
            atomic_compare_exchange_strong(&pending_sig, &none, sig);
            continue;
        }
        terminate(sig);
    }
}

/* The signals the host leaves ignored when they were at start. SIGINT is not
 * one: a shell starts a script's background jobs with it ignored, and they
 * must still release their locks on it. */
static int leaves_ignored(int sig) {
    return sig == SIGHUP || sig == SIGQUIT;
}

int rl_host_signals_start(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    struct sigaction sa;
    rl_host_note_ignored_signals();
    sigset_t all, old;
    pthread_t tid;
    /* Close-on-exec: a command must not inherit the pipe (a byte written to it
     * would fake a signal). Non-blocking write end: a handler never blocks on
     * a full pipe. */
    if (pipe2(pipe_fd, O_CLOEXEC) != 0) return -1;
    if (fcntl(pipe_fd[1], F_SETFL, O_NONBLOCK) != 0) return -1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&acq_done, &ca);
    pthread_condattr_destroy(&ca);
    rl_host_on_interrupt(interrupted);
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_sigpipe;
    if (sigaction(SIGPIPE, &sa, NULL) != 0) return -1;
    /* The thread itself takes no signals; it only reads the pipe. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&tid, NULL, signal_thread, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    pthread_detach(tid);
    sa.sa_handler = on_signal;
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        if (!(leaves_ignored(sigs[i]) && rl_host_ignored_at_start(sigs[i])) && sigaction(sigs[i], &sa, NULL) != 0)
            return -1;
    /* SIGCHLD ignored by whoever started us would have the kernel reap our
     * children: waitpid could not tell how COMMAND ended, and the lock would
     * not wait for its process group. */
    sa.sa_handler = SIG_DFL;
    if (sigaction(SIGCHLD, &sa, NULL) != 0) return -1;
    /* Ours to end on even when the caller started us with them blocked (the
     * handlers are in place first: one pending is caught, not fatal). */
    sigset_t ours;
    sigemptyset(&ours);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) sigaddset(&ours, sigs[i]);
    pthread_sigmask(SIG_UNBLOCK, &ours, NULL);
    return 0;
}

void rl_host_finish(void) {
    static atomic_int done;
    if (atomic_exchange(&done, 1)) return;
    if (!claim_exit(-1) && atomic_load(&exit_claim) > 0) never_return();
    rl_keeper_release_all(RL_HOST_RELEASE_TIMEOUT_MS);
}

void rl_host_defer_signals(int defer) {
    atomic_store(&defer_mode, defer != 0);
    if (!defer) {
        atomic_store(&deferred_count, 0);
        int sig = atomic_exchange(&pending_sig, 0);
        if (sig) terminate(sig);
    }
}

int rl_host_pending_signal(void) {
    return atomic_load(&pending_sig);
}

void rl_host_acquire_begin(int bound_ms) {
    pthread_mutex_lock(&acq_lock);
    if (atomic_load(&exit_claim) > 0) {
        pthread_mutex_unlock(&acq_lock);
        never_return(); /* the signal thread releases and exits */
    }
    if (acq_depth++ == 0) {
        acq_thread = pthread_self();
        acq_bound_ms = bound_ms > 0 ? bound_ms : 0;
    }
    pthread_mutex_unlock(&acq_lock);
}

void rl_host_acquire_end(void) {
    pthread_mutex_lock(&acq_lock);
    if (acq_depth > 0 && --acq_depth == 0) pthread_cond_broadcast(&acq_done);
    int outer = acq_depth == 0;
    pthread_mutex_unlock(&acq_lock);
    if (outer && atomic_load(&exit_claim) > 0) never_return();
}
