/* node.h — one node's connection: a non-blocking socket on a libev loop,
 * its address found outside any round (resolve.h), connect with a deadline,
 * AUTH/SELECT/INFO on connect (nothing else goes out until they have
 * succeeded), reconnect with doubling backoff, commands queued and written
 * in one write per flush, replies parsed once (reply.h), and a FIFO of
 * tickets that pairs every reply with the operation that asked for it.
 *
 * A node knows which server it reached by the run_id INFO reports. A node
 * whose server already votes through another node of the same client (its
 * peers) is refused like a failed AUTH: one server never votes twice, however
 * its address is spelled. */
#ifndef RL_NODE_H
#define RL_NODE_H

#include <ev.h>

#include "command.h"
#include "redlock.h"
#include "reply.h"
#include "resolve.h"
#include "url.h"

/* Which operation (slot) and which phase of it (gen) a command belongs to,
 * what the command was (RL_OP_*, to check that a reply fits it), when it
 * was sent (a clock reading the sender takes once for all nodes; the stall
 * watchdog measures from it), and whether it is already the EVAL sent after
 * a NOSCRIPT (there is no second fallback). */
typedef struct rl_ticket {
    int slot;
    unsigned gen;
    int kind;
    double sent_ms;
    int eval;
    unsigned long long end;  /* where the command ends in the connection's output (set when queued) */
} rl_ticket;

/* Called for every reply to a command sent with rl_node_send, in order.
 * reply is NULL when the command failed without a reply; errstr then says why.
 * reply is valid only during the call. */
typedef void (*rl_reply_fn)(void *owner, int node, rl_ticket ticket, const rl_reply *reply, const char *errstr);

enum { RL_LINK_DOWN = 0, RL_LINK_CONNECTING = 1, RL_LINK_UP = 2 };

/* A position in a connection's output: everything queued so far. */
typedef struct rl_mark {
    unsigned conn;
    unsigned long long end;
} rl_mark;

typedef struct rl_node {
    rl_url url;
    int index;
    struct ev_loop *loop;
    const rl_options *opts;
    rl_reply_fn on_reply;
    void *owner;
    struct rl_node *peers;   /* every node of the client (n itself included) */
    int npeers;

    rl_addrs addrs;          /* TCP: where the host is (empty until a lookup found it) */
    int addr_next;           /* which of addrs the next connect tries */
    int named;               /* TCP host is a name, not a numeric address: it needs lookups */
    rl_lookup *lookup;       /* a lookup of the name running on its own thread, or NULL */

    int fd;                  /* -1 while down */
    int link;                /* RL_LINK_* */
    unsigned conn;           /* bumped when a connection ends: callbacks can tell it is gone */
    int closing;             /* rl_node_close in progress: no reconnects */
    int backoff_ms;          /* next reconnect delay */
    double retry_at_ms;      /* while down: when the next connect may start */
    int step_check;          /* a step check (ECHO) is in flight on this connection */
    int scripts_loading;     /* SCRIPT LOADs are in flight on this connection */
    unsigned step_nonce;     /* its nonce's number; a new one for every connection */
    /* What the stall watchdog measures on this connection: */
    double read_ms;          /* when bytes last came from the node */
    unsigned long long acked;  /* bytes the node's end had taken (written less the send queue) at the last look */
    double acked_ms;         /* when that last grew */
    unsigned long long head_end;  /* the oldest unanswered command (its end) the watchdog saw wholly taken, */
    double head_ms;          /* and when it first saw that */
    ev_io readable;          /* while up: replies to read */
    ev_io writable;          /* while connecting, or while queued bytes wait for room */
    ev_timer connect_timer;  /* deadline of a connect in progress */
    ev_timer retry_timer;    /* delay before the next connect */
    ev_timer watchdog;       /* every stall_reset_ms / 2: reset the connection if stalled */
    char errstr[RL_NODE_ERR_LEN];  /* why the node is down (or the last connection ended) */

    rl_buf out;              /* bytes not written yet: out.data[out_off .. out.len) */
    size_t out_off;
    unsigned long long queued_total, written_total;  /* bytes queued / handed to the kernel on this connection */
    int setup_left;          /* setup replies (AUTH, SELECT, INFO) still awaited on this connection */
    int holding;             /* setup not answered yet: out.data[hold_at ..) waits for it */
    size_t hold_at;
    double setup_ms;         /* when the setup was queued */
    char seen_id[RL_RUN_ID_LEN + 1];  /* run_id the setup's INFO reported on this connection, or "" */
    char run_id[RL_RUN_ID_LEN + 1];   /* the server this node last voted for ("" if it never said);
                                         kept while down, so the server keeps its one voter */
    rl_reader reader;

    rl_ticket *ring;         /* tickets of commands awaiting replies, oldest first */
    unsigned ring_head, ring_count, ring_cap;
} rl_node;

/* Prepare n, node index of the npeers nodes at peers; nothing is looked up
 * or connected. */
void rl_node_init(rl_node *n, const rl_url *url, int index, struct ev_loop *loop,
                  const rl_options *opts, rl_reply_fn on_reply, void *owner, rl_node *peers, int npeers);

/* Start finding n's address: a numeric address (or a unix socket path) at
 * once, a host name on a thread of its own (rl_node_start waits for it). */
void rl_node_resolve(rl_node *n);

/* Wait for n's name lookup until the clock (rl_now_ms) passes deadline_ms,
 * then begin a non-blocking connect. A name not resolved by then leaves n
 * down, saying why in errstr; its lookup goes on in the background and a
 * later connect attempt takes its result. Failures are retried with
 * backoff. */
void rl_node_start(rl_node *n, double deadline_ms);

/* Queue a pre-encoded command; rl_node_flush writes it. A node that is down
 * and past its reconnect delay starts connecting first (what is queued goes
 * out once connected); it never waits for a name lookup. Return 0, or -1 if
 * the node cannot take it now (down, its name not resolved yet, out of
 * memory); the reason is then in n->errstr. Never calls on_reply. */
int rl_node_send(rl_node *n, const char *cmd, size_t len, rl_ticket ticket);

/* Write everything queued, in one write when the socket has room (the rest
 * waits for the socket to be writable). Never calls on_reply: a failed write
 * is noticed by the loop. */
void rl_node_flush(rl_node *n);

/* Where n's output stands after everything queued so far. */
rl_mark rl_node_mark(const rl_node *n);

/* 1 once everything queued up to m has been handed to the kernel, or the
 * connection m was taken on is gone (nothing of it is left to wait for). */
int rl_node_passed(const rl_node *n, rl_mark m);

/* Drop n's connection (answering its commands with why) if its setup is
 * still unanswered: nothing queued behind the setup has been sent, so
 * nothing of it has run, and nothing is lost by dropping it. */
void rl_node_drop_if_unready(rl_node *n, const char *why);

/* n answered NOSCRIPT: load the scripts again (once per NOSCRIPT spell). */
void rl_node_load_scripts(rl_node *n);

/* Check that n's replies are in step with its commands: queue an ECHO of a
 * nonce (unless one is in flight, or n is down); a reply that is not that
 * nonce means a reply was lost (the stream is shifted for good), and the
 * connection is reset. For a node that did not answer a round in time: that
 * is a lost reply, a hang (the stall watchdog's), or a backlog (harmless). */
void rl_node_check_step(rl_node *n);
/* While commands queued on n wait for the setup of a new connection to
 * succeed: when that setup was sent (rl_now_ms); otherwise 0. */
double rl_node_held_since(const rl_node *n);

/* Why a connection whose replies no longer pair with its commands is reset. */
#define RL_OUT_OF_STEP "connection reset: replies out of step with commands (a reply was lost)"

/* Drop the connection now (its unanswered commands are answered with why
 * through on_reply before this returns) and reconnect with backoff. Safe
 * inside on_reply. */
void rl_node_reset(rl_node *n, const char *why);

/* Close the connection and stop timers. Unanswered commands are dropped
 * without a call to on_reply. A lookup still running is abandoned (its
 * thread frees it). */
void rl_node_close(rl_node *n);

#endif
