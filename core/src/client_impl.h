/* client_impl.h — the libev client's state, shared by client.c (the loop,
 * its links and the client's life) and client_calls.c (the calls of
 * redlock.h's rl_client API). Nothing else includes it. */
#ifndef RL_CLIENT_IMPL_H
#define RL_CLIENT_IMPL_H

#include <ev.h>

#include "client.h"
#include "evsock.h"

struct rl_client {
    rl_engine *engine;
    int nnodes;
    struct ev_loop *loop;
    rl_evsock links[RL_MAX_LINKS]; /* by link: the nodes' command connections, then their subscribers, then
                                      two per shard of the cluster nodes (redlock.h, "Links") */
    rl_url addrs[RL_MAX_NODES];  /* where each node is, as the engine says (both its links connect there) */
    rl_url *shard_addrs[RL_MAX_SHARDS]; /* where each shard is, once its links are first wanted */
    int nlinks;              /* links placed (links[0 .. nlinks) know where they connect) */
    ev_prepare flusher;      /* before the loop polls: write what was queued */
    ev_check gauge;          /* after it polls: whether what it found waited unread (rl_engine_untimed_reads) */
    double poll_began;       /* when the loop last began to poll (rl_now_ms) */
    double poll_ended;       /* when it last came back from one (0: never) */
    ev_timer deadline;       /* the engine's next deadline */
    double armed_at;         /* when the deadline timer fires (0: not armed) */
    ev_timer run_timer;      /* bounds rl_run / rl_sleep */
    int run_expired;
    int run_fd;              /* a timerfd bounding rl_run_until to the microsecond (-1: not made yet) */
    ev_io run_fd_watcher;
    int run_reached;         /* run_fd fired since it was last armed */
    double run_fd_at;        /* the deadline run_fd was last armed for (0: none) */
    int node_timeout_ms;     /* bounds the tails served by rl_client_free */
    int connect_timeout_ms;  /* with reconnect_max_ms, bounds the unwritten commands served by rl_client_free */
    int reconnect_max_ms;
    rl_tls *tls;             /* one TLS context for every rediss:// node (NULL: none) */
    unsigned generation;     /* rl_fork_generation() when made: a forked child's calls are refused */
    int closed;              /* rl_client_close ran: its sockets are gone, every call using them is refused */
    void (*unlock)(void *);  /* rl_client_share: around the loop's waits */
    void (*lock)(void *);
    void *lock_arg;
};

/* Close and connect what the engine asks to, until it asks nothing more
 * (a connect that fails at once answers commands, which may ask for more);
 * writes are left to the flush. Then re-arm the deadline. */
void rl_client_service(rl_client *c);

/* Write what every link has queued: one write per node for all the
 * commands begun or re-sent since the last flush. Then service. */
void rl_client_flush(rl_client *c);

/* Do what the engine had due by now_ms (its deadline passed while nobody
 * ran the loop: a caller whose rounds are all decided at once never runs
 * it), as the deadline timer would have. */
void rl_client_catch_up(rl_client *c, double now_ms);

/* Between calls nobody reads the sockets: a connection the server closed
 * meanwhile (its idle timeout, CLIENT KILL, a proxy's) would take the next
 * command and lose it (the node's vote failed, "connection lost: closed by
 * the server"). A call that begins after a gap in the polls takes what the
 * sockets have first: such an EOF ends that connection before anything is
 * queued on it (and a new one is made for the command at once, the stream
 * having owed nothing), replies that came meanwhile are read (untimed). */
void rl_client_take_after_gap(rl_client *c, double now_ms);

/* Write what the subscriber links have queued (a watch's SUBSCRIBE). Then
 * service. */
void rl_client_flush_subscribers(rl_client *c);

/* Bound the loop's run to ms from now: c->run_expired is set then. */
void rl_client_arm_run_timer(rl_client *c, int ms);

/* Bound the loop's run to deadline_ms (rl_now_ms's clock), to the
 * microsecond: c->run_reached is set then. libev's own timers wait at
 * least a millisecond on epoll; this one is a timerfd among the loop's
 * descriptors, made on first use. Return 0, or -1 if it cannot be made
 * (out of descriptors): the caller bounds the run by rl_client_arm_run_timer
 * instead. */
int rl_client_arm_run_at(rl_client *c, double deadline_ms);

#endif
