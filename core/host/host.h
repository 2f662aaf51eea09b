/*
 * host.h — the pieces of the `redlock` host executable.
 *
 * main.c    runs the Lua side (lua/redlock/host/init.lua) the way luajit.c runs a script;
 * paths.c   finds the Lua modules next to the executable (build tree or install prefix);
 * signals.c turns SIGINT/SIGTERM/SIGHUP/SIGQUIT into "stop the child, release every kept lock, exit";
 * proc.c    starts and supervises child processes (exec, os.execute, demo workers);
 * probe.c   reads what one node holds under a key (redlock status), over TLS too;
 * probe_all.c runs those reads on every node at once.
 *
 * Dependencies go one way: main.c uses the others, signals.c uses proc.c (to
 * stop the supervised child), probe_all.c uses probe.c; proc.c, paths.c and
 * probe.c use none of them.
 *
 * The rl_host_* functions of the "exported for the FFI" section are exported
 * from the executable (-Wl,-E) for the LuaJIT FFI; lua/redlock/host/sys.lua
 * declares them and must agree with this file. Everything else is internal:
 * the host is compiled with -fvisibility=hidden, and only that section (and
 * redlock.h, see core/src/exports.h) has default visibility.
 */
#ifndef RL_HOST_H
#define RL_HOST_H

#include <stddef.h>
#include <sys/types.h>

#include "lua.h"

#define RL_HOST_PROGNAME "redlock"

/* How long the exit paths wait for kept locks to be released: about 1 s,
 * as docs/host.md says (and as the core's own exit handler waits). */
#define RL_HOST_RELEASE_TIMEOUT_MS 1000

/* paths.c: prepend the host's Lua module directories to package.path and
 * package.cpath. Return 0, or -1 (and leave the paths alone) if the
 * executable's own path is unknown. */
int rl_host_set_paths(lua_State *L);

/* signals.c: install the handlers (SIGINT, SIGTERM, SIGHUP, SIGQUIT) and
 * start the signal thread. Return 0 or -1 with errno set. A SIGHUP or
 * SIGQUIT ignored when redlock started (nohup; a non-interactive shell's
 * `cmd &`) stays ignored: no handler is installed for it. SIGINT and SIGTERM
 * are always redlock's (a shell starts a script's background jobs with SIGINT
 * ignored, and they must still release their locks on it). */
int rl_host_signals_start(void);

/* proc.c: note which of SIGINT, SIGTERM, SIGHUP and SIGQUIT are ignored now
 * (at start, before any handler is installed); a command redlock starts
 * gets them ignored too, as flock(1) passes them on. */
void rl_host_note_ignored_signals(void);

/* proc.c: 1 if sig was ignored when rl_host_note_ignored_signals ran, else
 * 0. Async-signal-safe: it reads what was noted then. */
int rl_host_ignored_at_start(int sig);

/* signals.c: the process is about to exit normally. Release every kept lock,
 * unless the signal thread has already taken over the exit, in which case this
 * never returns (that thread calls _exit). Idempotent; also run by atexit. */
void rl_host_finish(void);

/* proc.c: stop the supervised child, if any, and the process groups that
 * os.execute and io.popen children left running: sig for exec's COMMAND,
 * SIGTERM for the script's commands, then SIGKILL after the grace period.
 * Called by the signal thread, which then exits the process: from this call
 * on, rl_host_wait and rl_host_system never return once their child ended. */
void rl_host_stop_supervised(int sig);

/* proc.c, for popen.c: a forked child's signal dispositions and mask back to
 * the defaults (async-signal-safe); remember a process group the host must
 * stop before it releases its locks on a signal; and never return once a
 * signal is ending the host (the signal thread releases, then exits). */
void rl_host_child_defaults(void);
void rl_host_track_group(pid_t pgrp);
void rl_host_hold_if_stopping(void);

/* proc.c: fn is called (on the Lua thread) with SIGINT or SIGQUIT when an
 * os.execute command that had the terminal died of it: the user's Ctrl-C or
 * Ctrl-\ was meant for the host too (SIGQUIT only if the host does not leave
 * it ignored). signals.c handles it as if the host got the signal. */
void rl_host_on_interrupt(void (*fn)(int sig));

/* ---- exported for the FFI (see lua/redlock/host/sys.lua) ---- */

#pragma GCC visibility push(default)

enum {
    RL_HOST_NEWPGRP = 1,    /* the child leads a new process group */
    RL_HOST_SUPERVISE = 2,  /* a signal to the host stops the child before the host exits */
    RL_HOST_FOREGROUND = 4,  /* and, on a terminal, the child's group becomes the foreground */
    RL_HOST_DIE_WITH_HOST = 8, /* SIGKILL the child when the host dies (PR_SET_PDEATHSIG) */
    RL_HOST_WATCHDOG = 16      /* with NEWPGRP and SUPERVISE: a watcher process stops the
                                  child's group (SIGTERM, SIGKILL after the grace period)
                                  when the host dies in any way, SIGKILL included */
};

/* Start argv[0] (searched in PATH) with argv and the current environment,
 * default signal dispositions and an empty signal mask. Return its pid once it
 * has exec'd, or -1 with *errnum set (ENOENT: not found; EACCES, ENOEXEC: not
 * executable). */
int rl_host_spawn(const char *const *argv, int flags, int grace_ms, int *errnum);

/* Reap pid if it has ended. Return 0 while it runs (or, with
 * RL_HOST_WAIT_BLOCK in block, wait), 1 when it ended, with *code its exit
 * status or 128+signal, or -1 with *code = errno (ECHILD: already reaped
 * elsewhere). Forgets a supervised pid, except one that led its own process
 * group (RL_HOST_NEWPGRP) while that group still has live members: the group
 * stays supervised (a signal to the host stops it; the watcher watches it)
 * until rl_host_forget, the terminal is the host's again, and the host
 * ignores SIGTSTP meanwhile. With RL_HOST_WAIT_STOPS, also return 2 when it
 * has stopped, with *code the signal that stopped it. */
enum { RL_HOST_WAIT_BLOCK = 1, RL_HOST_WAIT_STOPS = 2 };
int rl_host_wait(int pid, int block, int *code);

/* Stop supervising pid (reaped) and the rest of its process group: disarm
 * the watcher, give the terminal back, SIGTSTP as it was. Call it once the
 * group has ended or been stopped. Never returns once a signal is ending the
 * host (the signal thread stops the group, releases and exits). */
void rl_host_forget(int pid);

/* The supervised child pid stopped with sig. A job-control stop (SIGTSTP,
 * SIGTTIN, SIGTTOU) on a terminal, Ctrl-Z: stop the host with it, so that
 * the shell sees its job stopped; once continued, give the terminal back to
 * the child if it had it, and return 1 (the caller then continues the
 * child, or, its lock lost meanwhile, stops it). Any other stop is the
 * child's alone (a debugger, a CPU limiter): return 0 at once, and the host
 * goes on keeping the lock. */
int rl_host_stop_self(int pid, int sig);

/* Send sig to pid, or to its process group when group is nonzero. Return 0
 * or -1 (errno ESRCH: nobody left). */
int rl_host_kill(int pid, int sig, int group);

/* True while pid's process group still has a member that is not a zombie
 * (kill(-pid, 0), then /proc, starting with the member found last time). A
 * process that left the group (setsid, setpgid) no longer counts. */
int rl_host_group_alive(int pid);

/* os.execute for the host: /bin/sh -c cmd in a process group of its own
 * (the terminal's foreground group while it runs), supervised, without
 * ignoring SIGINT/SIGQUIT in the host as system(3) does; if part of the group
 * outlives the shell, the group is still stopped when a signal ends the host. Return the raw wait status as
 * system(3) does, or -1. cmd NULL: return 1 (a shell is available). */
int rl_host_system(const char *cmd);

/* Signals: with defer nonzero, SIGINT/SIGTERM/SIGHUP/SIGQUIT are only
 * recorded (the Lua side polls rl_host_pending_signal and cleans up itself);
 * a third one exits at once. With defer zero (the default), the signal thread stops the
 * supervised child, releases every kept lock and exits 128+signal. */
void rl_host_defer_signals(int defer);

/* The first signal recorded while deferred, or 0. */
int rl_host_pending_signal(void);

/* signals.c: the Lua thread is acquiring a lock (dlm:lock, try_lock,
 * lock_many) between these two calls: a signal that ends the host meanwhile
 * waits, at most bound_ms, for rl_host_acquire_end, so that whatever the
 * acquisition got is released (the keeper has it by then, or the library
 * released it on failure). Once a signal has taken over the exit,
 * rl_host_acquire_begin and the outermost rl_host_acquire_end never return.
 * Pairs nest; the outermost pair's bound counts. */
void rl_host_acquire_begin(int bound_ms);
void rl_host_acquire_end(void);

/* proc.c: sleep ms milliseconds; a signal does not cut the sleep short. */
void rl_host_sleep_ms(int ms);

/* probe.c: what one node holds under one key (key NULL: only whether it
 * answers a PING, and how fast). */

#define RL_HOST_PROBE_VALUE_LEN 128
#define RL_HOST_PROBE_READERS 64    /* shared holders listed per node, at most (sys.lua too) */
#define RL_HOST_PROBE_READER_LEN 41 /* a lock value and its NUL */

enum {
    RL_HOST_PROBE_EINVAL = 1, /* bad URL or argument: no node was asked */
    RL_HOST_PROBE_ENODE = 2   /* the node could not be reached, or answered with an error or a
                                 reply of the wrong type */
};

/* What a probe found under a lock's fence counter (has_fence): nothing, a
 * string (a token or not: fence_token), or a key of another type (GET
 * answered WRONGTYPE), which is no token either; the node answers all the
 * same, and a plain lock's key beside it is read as usual. */
enum { RL_HOST_FENCE_NONE = 0, RL_HOST_FENCE_STRING = 1, RL_HOST_FENCE_OTHER_TYPE = 2 };

typedef struct rl_host_probe_result {
    int err;                              /* 0, or RL_HOST_PROBE_E* with errstr saying why */
    char errstr[256];
    char name[416];                       /* the node's URL without its password */
    int exists;                           /* 1 when GET found a string under the key */
    long long pttl;                       /* PTTL: ms left, -1 no expiry, -2 no key */
    size_t value_len;                     /* the whole value's length */
    unsigned long long value_digest;      /* 64-bit FNV-1a of the whole value: tells apart two
                                             values longer than value keeps */
    char value[RL_HOST_PROBE_VALUE_LEN];  /* its first bytes (all of a lock value), NUL-terminated */
    int has_fence;                        /* RL_HOST_FENCE_*: what GET key:fence found under the
                                             fenced lock's counter */
    size_t fence_len;                     /* a string counter: its whole length */
    long long fence_token;                /* that counter as a fencing token (1 to 2^63-1, read by
                                             the engine's rule, rl_fence_token), 0 when it is none */
    char fence[24];                       /* its first bytes (up to 23), NUL-terminated */
    double latency_ms;                    /* the round trip of GET, GET and PTTL (or of PING) */
    int readers;                          /* the value is the shared mark: the live shared holders */
    char reader[RL_HOST_PROBE_READERS][RL_HOST_PROBE_READER_LEN]; /* the first of them (their values) */
    long long reader_pttl[RL_HOST_PROBE_READERS];                 /* and the ms each has left */
    char run_id[41];                      /* the server's run_id (INFO server), "" if it said none */
} rl_host_probe_result;

/* What rl_host_probe reads under a key (its what): the lock, a semaphore's
 * slot k (k >= 1: redlock:slot:<k>:<key>), or the limit a semaphore's
 * waiters left (redlock:limit:<key>). */
enum { RL_HOST_PROBE_LOCK = 0, RL_HOST_PROBE_LIMIT = -1 };

/* TLS settings for probing rediss:// nodes (as rl_tls_options; NULL strings
 * for none). */
typedef struct rl_host_tls {
    const char *cafile, *capath, *certfile, *keyfile, *server_name;
    int verify;
} rl_host_tls;

/* Read what the node at url holds under key[0..keylen) (key NULL: PING
 * it), all within timeout_ms (connect, AUTH and SELECT as the URL says,
 * the commands, every redirection). The node: redis://..., rediss://...
 * with the TLS settings tls (NULL: verify against the system's CAs),
 * unix://..., or a Redis Cluster, redis-cluster://h:p+h:p (or
 * rediss-cluster://), as the core reads them.
 *
 * what RL_HOST_PROBE_LOCK: GET and PTTL of the lock's key (key itself on
 * every node), GET of its fence counter (of another type: WRONGTYPE, said in
 * out->has_fence, not a failure) and, when the key holds the mark
 * of shared holders (core/src/shared.h), the live ones with the ms each
 * has left (the RL_HOST_PROBE_READERS that expire first, at most;
 * out->readers counts them all). what k >= 1 or RL_HOST_PROBE_LIMIT: GET
 * and PTTL of that semaphore key. Companion keys are named as the engine
 * names them: after key on a plain node, after key's base
 * (rl_cluster_base) on a cluster node.
 *
 * A cluster node is asked at the master serving key's slot: its seeds in
 * order until one answers (connects and replies), then the master a MOVED
 * names (ASK: behind ASKING), RL_CLUSTER_REDIRECTS times at most; without
 * key, the first seed that answers. Return 0 with *out filled, or -1 with
 * out->err and out->errstr set (bad URL or TLS files:
 * RL_HOST_PROBE_EINVAL). */
int rl_host_probe(const char *url, const char *key, size_t keylen, int what, int timeout_ms,
                  const rl_host_tls *tls, rl_host_probe_result *out);

/* probe_all.c: rl_host_probe(urls[i], key, keylen, what, timeout_ms, tls,
 * &out[i]) for each of the n nodes at once, each on a thread of its own
 * (inline when one cannot start), so that all of them take timeout_ms at
 * most, not n times it; rc[i] is each probe's return value. Return 0 once
 * every probe has ended, or -1 (nothing probed) for n <= 0, a NULL array,
 * or no memory. */
int rl_host_probe_all(const char *const *urls, int n, const char *key, size_t keylen, int what, int timeout_ms,
                      const rl_host_tls *tls, rl_host_probe_result *out, int *rc);

/* Check tls as a client's TLS context takes it (its files read, core/src/
 * tls.c), connecting nowhere. Return 0, or -1 with out->errstr saying why
 * (out->err RL_HOST_PROBE_EINVAL). */
int rl_host_check_tls(const rl_host_tls *tls, rl_host_probe_result *out);

#pragma GCC visibility pop

#endif
