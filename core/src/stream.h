/* stream.h — one node's command stream, free of I/O: the link state a
 * driver's socket is in, the bytes waiting to go out, the reply parser fed
 * with what came in, and a FIFO of tickets that pairs every reply with the
 * command that asked for it. It decides everything about a connection
 * except how bytes move and what time it is:
 *   - AUTH/SELECT/INFO first on a fresh connection; nothing else goes out
 *     until they have succeeded; SCRIPT LOAD of our scripts after them;
 *   - INFO's run_id: a server that already votes through another node of
 *     the same engine (its peers), connected and set up, is refused like a
 *     failed AUTH;
 *   - the connect deadline, which bounds the connect with its TLS
 *     handshake, and then the setup, and reconnecting with doubling backoff;
 *   - the step check (ECHO of a nonce) of a stream whose replies may no
 *     longer pair with its commands, and the stall watchdog;
 *   - suspicion: a node that has stopped answering gets no new commands,
 *     only the step check as its probe (and the releases kept for it),
 *     until it answers (see rl_stream_suspect).
 * A driver learns what the stream wants (rl_stream_take_wants) and reports
 * what its socket did; every call takes the time, now_ms. */
#ifndef RL_STREAM_H
#define RL_STREAM_H

#include "command.h"
#include "redlock.h"
#include "reply.h"
#include "skipped.h"
#include "stats.h"
#include "url.h"

/* Which operation (slot) and which phase of it (gen) a command belongs to,
 * what the command was (RL_OP_*, to check that a reply fits it), when it
 * was queued, whether it is already the EVAL sent after a NOSCRIPT (there
 * is no second fallback), and where it ends in the connection's output. */
typedef struct rl_ticket {
    int slot;
    unsigned gen;
    int kind;
    double sent_ms;
    int eval;
    long long end;
    int unsent;   /* answered without a reply because its connection ended before all of it was written */
    int redirects; /* on a cluster node: MOVED/ASK redirections it followed (cluster.c) */
    int asked;     /* on a cluster node: sent after ASKING (an ASK is followed once) */
    int tryagains; /* on a cluster node: times sent again after TRYAGAIN (cluster_redirect.c) */
    int resend;    /* a user's release: kept until answered, and if its connection ends first, sent again
                      on the next one (rl_stream_redo), whether or not it went out */
} rl_ticket;

/* Called for every reply to a command sent with rl_stream_send, in order.
 * reply is NULL when the command failed without a reply; errstr then says
 * why. reply is valid only during the call, which may send more commands. */
typedef void (*rl_reply_fn)(void *owner, int node, rl_ticket ticket, const rl_reply *reply, const char *errstr);

/* A position in a connection's output: everything queued so far. */
typedef struct rl_mark {
    unsigned conn;
    long long end;
} rl_mark;

enum {
    RL_STREAM_IDLE = 0,        /* no connection, and none needed yet: a command asks for one */
    RL_STREAM_DOWN = 1,        /* the last connection failed: commands fail until retry_at_ms */
    RL_STREAM_CONNECTING = 2,  /* the driver is connecting; commands queue */
    RL_STREAM_UP = 3           /* connected; the setup may still be unanswered (holding) */
};

/* A server a node's connection voted for until that connection ended
 * (rl_stream.voted). A node keeps the last RL_ENDED_VOTES servers it
 * voted for: a round lasts at most a node timeout and its tail, and a
 * node reconnects at most once per reconnect backoff, so more servers than
 * that within one round would take a node moving between addresses faster
 * than it can connect. */
#define RL_ENDED_VOTES 4
typedef struct rl_ended_vote {
    char id[RL_RUN_ID_LEN + 1]; /* the server's run_id */
    double until_ms;            /* when the connection that voted for it ended (0: an empty record) */
} rl_ended_vote;

typedef struct rl_stream {
    const rl_url *url;
    int index;
    const rl_options *opts;
    rl_reply_fn on_reply;
    void *owner;
    struct rl_stream *peers;  /* every stream of the engine (this one included) */
    int npeers;

    int state;               /* RL_STREAM_* */
    int wants;               /* RL_WANT_CONNECT / RL_WANT_CLOSE not yet taken by the driver */
    unsigned conn;           /* bumped when a connection ends */
    int backoff_ms;          /* next reconnect delay */
    double retry_at_ms;      /* DOWN: when to connect again */
    double connect_by_ms;    /* CONNECTING: the connect deadline (from the ask; once the driver
                                takes the ask, from then) */
    int handshaking;         /* CONNECTING: connected, the driver's TLS handshake under way */
    int step_check;          /* step checks (ECHO) in flight on this connection, */
    unsigned checks_queued;  /* of the checks queued on it so far, */
    double check_ms;         /* the last one queued then */
    int suspect;             /* the node stopped answering: no new commands but releases (rl_stream_suspect) */
    double silent_ms;        /* suspect: since when it has not answered */
    rl_skipped skipped;      /* suspect: values of acquires it was not sent */
    double peeked_ms;        /* suspect: when the driver was last asked to look at its socket */
    double probe_at_ms;      /* suspect: when its next probe is due, */
    int probe_every_ms;      /* and the interval after that one (doubling) */
    int scripts_loading;     /* SCRIPT LOADs are in flight on this connection */
    unsigned step_nonce;     /* its nonce's number; a new one for every connection */
    /* What the stall watchdog measures on this connection: */
    double watch_at_ms;      /* its next look, or 0 */
    double read_ms;          /* when bytes last came from the node */
    double answered_ms;      /* when a reply last came whole (or the connection was made) */
    long long unsent;        /* written, but not yet taken by the node's end (the driver says) */
    long long acked;         /* where the node's end had taken bytes up to, at the last look */
    double acked_ms;         /* when that last grew */
    long long head_end;      /* the oldest unanswered command (its end) seen wholly taken, */
    double head_ms;               /* and when it was first seen so */
    char errstr[RL_NODE_ERR_LEN]; /* why the node is down (or the last connection ended) */
    char lost[RL_NODE_ERR_LEN];   /* why the last connection ended, if none was set up since ("" if one was) */

    rl_buf out;              /* bytes not written yet: out.data[out_off .. out.len) */
    size_t out_off;
    /* Positions in the connection's output, counted from the first command
     * that is not the setup (the setup, put in front at connect, sits
     * before 0): where everything queued ends, and how far it is written. */
    long long queued_total, written_total;
    int setup_left;          /* setup replies (AUTH, SELECT, INFO) still awaited */
    int holding;             /* setup not answered yet: out.data[hold_at ..) waits for it */
    size_t hold_at;
    double setup_ms;         /* when the connection was asked for (its setup queued behind it) */
    char seen_id[RL_RUN_ID_LEN + 1];  /* run_id the setup's INFO reported on this connection, or "" */
    char run_id[RL_RUN_ID_LEN + 1];   /* the server this node last voted for ("" if it never said);
                                         it counts only while the node is up (voter_of) */
    int idle_after_loss;     /* idle since a connection its server ended owing nothing (rl_stream_drop):
                                the next one made counts as a reconnect */
    rl_ended_vote voted[RL_ENDED_VOTES]; /* the servers this node's ended connections voted
                                for, each with when its last such connection ended; kept
                                whatever the node's later connections reach */
    rl_reader reader;
    rl_stream_counts counts; /* connection events (stats.h), kept across connections */

    rl_ticket *ring;         /* tickets of commands awaiting replies, oldest first */
    unsigned ring_head, ring_count, ring_cap;
    long long ring_start;    /* where the oldest ticket's command starts in the connection's output
                                (every byte queued is a ticket's: each command starts where the one
                                before ends, the first after the last one answered) */
    /* Releases to send again on the next connection once its setup has
     * succeeded (rl_stream_redo), kept until written; their replies are
     * ignored. Kept across connections, unlike everything above. */
    rl_buf redo;             /* the commands, back to back */
    size_t *redo_lens;       /* the length of each */
    unsigned redo_count, redo_cap;
    unsigned redo_queued;    /* the first redo_queued are queued on this connection, */
    long long redo_end;      /* ending there in its output */
    double redo_kept_ms;     /* when the newest was kept */
    /* The commands of this connection's tickets with resend set that are
     * not answered yet, oldest first, back to back from resends.data +
     * resend_off, their lengths from resend_lens[resend_first]: when the
     * connection ends, they join the releases kept above. */
    rl_buf resends;
    size_t resend_off;
    size_t *resend_lens;
    unsigned resend_first, resend_count, resend_cap;
} rl_stream;

/* Prepare s, node index of the npeers streams at peers. Idle: nothing is
 * connected until a command or rl_stream_open asks for it. */
void rl_stream_init(rl_stream *s, const rl_url *url, int index, const rl_options *opts,
                    rl_reply_fn on_reply, void *owner, rl_stream *peers, int npeers);

/* Ask the driver for a connection now (RL_WANT_CONNECT), unless one is up
 * or being made. A DOWN stream asks even before its backoff is over. */
void rl_stream_open(rl_stream *s, double now_ms);

/* The driver connected. fresh: a new connection, which gets the setup
 * first; 0: a pooled connection this node's setup already ran on, which
 * was handed back clean (rl_stream_detach). Return 0, or -1 if the stream
 * was not waiting for a connection (the driver closes it). */
int rl_stream_connected(rl_stream *s, int fresh, double now_ms);

/* The driver's connection failed or ended (why says how): every command on
 * it is answered with why (its resend tickets' commands are kept first, see
 * rl_stream_redo), and the stream reconnects after its backoff; but a
 * connection set up that ended with nothing it was sent unanswered (the
 * server closed it while idle) leaves the stream idle: no backoff, the next
 * command connects at once (at once too if releases were kept). */
void rl_stream_down(rl_stream *s, const char *why, double now_ms);

/* 1 if the stream's connection is still being made (connecting, or in its
 * TLS handshake) with nothing queued on it yet. */
int rl_stream_unused(const rl_stream *s);

/* Such an unused connection (rl_stream_unused; else nothing is done) ended
 * by its server: made before a gap in the driver's polls and never driven,
 * it outlived the server's idle timeout. The stream is idle afterwards, as
 * rl_stream_down leaves a connection set up that owed nothing: why is kept
 * as the last loss, the next command connects at once. */
void rl_stream_closed_unused(rl_stream *s, const char *why, double now_ms);

/* The driver stops using the connection (a pooled connection handed back).
 * Return 1 if it is clean (set up, nothing unanswered or unwritten: it may
 * be reused), 0 if not (the driver must close it; its commands are answered
 * with an error, its releases kept as by rl_stream_down, which asks for a
 * new connection). The stream is idle afterwards, with no backoff. */
int rl_stream_detach(rl_stream *s, double now_ms);

/* Queue a pre-encoded command. An idle stream, or one down past its
 * backoff, asks for a connection and queues behind it. With ticket.resend, a
 * copy is kept until it is answered (none past RL_REDO_MAX bytes or out of
 * memory: it then goes out once): if its connection ends first, or it is
 * taken back from behind a setup (rl_stream_withdraw_held), the copy is kept
 * for the next connection (rl_stream_redo), its ticket answered as usual.
 * Return 0, or -1 if it cannot take the command now (down, out of memory:
 * the reason is in s->errstr). Never calls on_reply. */
int rl_stream_send(rl_stream *s, const char *cmd, size_t len, rl_ticket ticket, double now_ms);

/* Queue two commands back to back (a write and the WAIT behind it), as
 * rl_stream_send: both, or neither (-1). */
int rl_stream_send_pair(rl_stream *s, const char *cmd, size_t len, rl_ticket ticket, const char *cmd2, size_t len2,
                        rl_ticket ticket2, double now_ms);

/* The bytes that may be written now (none until connected, and only the
 * setup until it has succeeded); *data is valid until the next call. */
size_t rl_stream_output(const rl_stream *s, const char **data);

/* The driver wrote n bytes of rl_stream_output. */
void rl_stream_wrote(rl_stream *s, size_t n, double now_ms);

/* Bytes the node sent: parse them and answer tickets (on_reply). Return 0,
 * or -1 if the stream dropped the connection on the way (garbage, a reply
 * nobody asked for, a refused setup, a stream out of step): the driver
 * must not feed the rest, and closes the socket (RL_WANT_CLOSE). */
int rl_stream_feed(rl_stream *s, const char *data, size_t len, double now_ms);

/* The driver's view of bytes written but not yet taken by the node's end
 * (the socket's send queue), for the stall watchdog. A driver that cannot
 * tell never calls it. */
void rl_stream_unsent(rl_stream *s, long long bytes);

/* The one-shot wishes for the driver (RL_WANT_CONNECT, RL_WANT_CLOSE), now
 * taken, plus RL_WANT_WRITE while output waits. now_ms: the time they are
 * taken; a connect's timeout counts from then (the driver begins it now). */
int rl_stream_take_wants(rl_stream *s, double now_ms);

/* 1 if the stream wants anything of the driver (see rl_stream_take_wants). */
int rl_stream_wanting(const rl_stream *s);

/* The earliest moment rl_stream_advance has work (a reconnect, a connect
 * deadline, a watchdog look), or 0 for none. */
double rl_stream_deadline(const rl_stream *s);

/* Do what is due at now_ms. */
void rl_stream_advance(rl_stream *s, double now_ms);

/* Drop the connection (if any) with why: its commands are answered with
 * why through on_reply before this returns, the driver is asked to close
 * it, and the stream reconnects after its backoff. Safe inside on_reply. */
void rl_stream_reset(rl_stream *s, const char *why, double now_ms);

/* While the connection is being made, in its TLS handshake, or its setup
 * (AUTH/SELECT/INFO) is unanswered: write what it is doing, for how long of
 * the connect timeout, and why the last connection ended if none has been
 * set up since, into buf ("TLS handshake under way, 120 of 1000 ms (last:
 * TLS handshake timed out after 1000 ms)") and return 1. Otherwise 0. Such
 * a connection lives until its connect deadline (connect_timeout_ms from
 * when it was asked for; for the setup, from when the driver reported it
 * connected): rounds that time out meanwhile neither reset nor step-check
 * it. */
int rl_stream_setup_text(const rl_stream *s, double now_ms, char *buf, size_t len);

/* While the connection's setup is under way (see rl_stream_setup_text):
 * take back every command queued behind the setup, none of which has gone
 * out, answering each (unsent) with that text. The connection goes on with
 * its setup; releases kept for it (rl_stream_redo) stay kept, and the
 * releases among those taken back (resend tickets) join them. */
void rl_stream_withdraw_held(rl_stream *s, double now_ms);

/* Take back every command of the connection that take(owner, node, ticket)
 * chooses and that has not gone out at all (none of its bytes written; a
 * command partly written goes on): its bytes leave the output, its ticket
 * the ring, and it is not answered (on_reply is not called: the caller
 * knows what it took back). What was queued after it moves up. Only the
 * commands of operations (kind > 0) are offered. */
void rl_stream_withdraw(rl_stream *s, int (*take)(void *owner, int node, rl_ticket t), void *owner);

/* Keep a pre-encoded release (of a failed acquire whose SET may have run)
 * that could not go out on the connection its SET went out on, or one
 * queued with a resend ticket whose connection ended unanswered: it is
 * queued on the next connection once its setup has succeeded (at once if
 * one is ready), and sent again on every later connection until it has
 * been written; its reply is ignored. An idle stream asks for a connection.
 * Return 0, or -1 if out of memory or past RL_REDO_MAX bytes kept (the key
 * then stays until its ttl). */
#define RL_REDO_MAX (1 << 20)
int rl_stream_redo(rl_stream *s, const char *cmd, size_t len, double now_ms);

/* Drop the releases kept (rl_stream_redo) that are not queued on a
 * connection, once the newest of them was kept more than kept_ms ago
 * (kept_ms > 0): by then every key they would delete has expired, so they
 * would only keep the stream wanting a node that does not come back. */
void rl_stream_expire_redo(rl_stream *s, double kept_ms, double now_ms);

/* s answered NOSCRIPT: load the scripts again (once per NOSCRIPT spell). */
void rl_stream_load_scripts(rl_stream *s, double now_ms);

/* Check that s's replies are in step with its commands: queue an ECHO of a
 * nonce (unless one is in flight, or s has no connection, or its setup is
 * under way: nothing behind the setup has gone out); a reply that is not
 * that nonce means a reply was lost, and the connection is reset. */
void rl_stream_check_step(rl_stream *s, double now_ms);

/* The driver's connection is made and its TLS handshake begun: a connect
 * deadline passing now is the handshake's. */
void rl_stream_handshaking(rl_stream *s);

/* The reconnect delay after cur_ms: twice it, at most max_ms, without
 * overflowing however large max_ms is. Shared with the subscribers. */
int rl_backoff_next(int cur_ms, int max_ms);

/* 1 when s holds commands not written yet: releases kept for its next
 * connection, or output queued on a connection being made or up. */
int rl_stream_unwritten(const rl_stream *s);

/* 1 when s owes replies on a connection that is up, set up and answering:
 * not suspect, and not sending the bytes of one reply for stall_reset_ms
 * without it ending (a reply that will not be whole soon, if ever). */
int rl_stream_unanswered(const rl_stream *s);

/* While commands wait for the setup of a new connection: when that setup
 * was queued; otherwise 0. */
double rl_stream_held_since(const rl_stream *s);

/* Where s's output stands after everything queued so far, and whether
 * everything up to m has been written (or m's connection is gone, or all
 * that is queued on it has been written: a mark taken before
 * rl_stream_withdraw may lie past the end of what is left). */
rl_mark rl_stream_mark(const rl_stream *s);
int rl_stream_passed(const rl_stream *s, rl_mark m);

/* Suspicion. A node that has stopped answering is suspect: while it is
 * connected (or being connected), rl_stream_send refuses every command at
 * once (errstr: "not answering for N ms (suspect: ...)", or what its
 * connection's setup is doing, see rl_stream_setup_text), so a round
 * counts its vote as a timeout without sending it anything. Releases
 * meant for it are kept (rl_stream_redo) and queued at once behind what
 * waits on the connection, so they run when the node runs again, even if
 * nobody drives the client then. A suspect node
 * whose connection is down fails commands as any node that is down. The connection stays open, quiet:
 * what was queued on it before stays queued, in order, and the step check
 * in flight is the probe: a suspect node is sent nothing else but another
 * probe now and then (at doubling intervals, up to one a second: see the
 * stall watchdog). The first bytes that come from the node (the
 * probe's answer, or any reply before it) clear the suspicion.
 * A node becomes suspect when
 *   - a step check is in flight (a round timed out on the node) and no
 *     byte has come from it for node_timeout_ms since the check was
 *     queued or since its last bytes, whichever is later; or
 *   - its connection is still being made or set up node_timeout_ms after
 *     it was asked for (the connection lives on until its connect
 *     deadline: nothing more waits behind it); or
 *   - the stall watchdog finds it silent for stall_reset_ms with commands
 *     wholly at its end (it queues the probe then).
 * A slow node is never silent that long while it works: one answering
 * every command late still sends bytes as often as it is sent commands.
 * Only silence makes a node suspect, never lateness. A connection whose
 * bytes the node's end stops taking is still reset by the watchdog; the
 * node stays suspect across the reconnect until it answers. */
/* 1 while s is suspect and connected or being connected, else 0. */
int rl_stream_suspect(const rl_stream *s);

/* While s is suspect (rl_stream_suspect): write why into buf ("not
 * answering for N ms (suspect: only a probe goes to it)", or the setup's
 * text) and return 1; otherwise 0. */
int rl_stream_suspect_text(const rl_stream *s, double now_ms, char *buf, size_t len);

/* Start s over as a new stream of node index, idle, with its counts kept
 * (its URL, in the same place, says where it connects now): its
 * connection, if the driver has one (made, being made, or asked to be
 * closed), is to be closed (RL_WANT_CLOSE). Only for a stream that owes
 * nothing: no reply owed, nothing unwritten, no release kept. Return 1 if
 * the driver had a connection, else 0. */
int rl_stream_restart(rl_stream *s, int index);

/* Free what s holds. Unanswered commands are dropped without on_reply. */
void rl_stream_free(rl_stream *s);

/* Why a connection is reset when a step check's ECHO is answered by
 * another reply: its replies no longer pair with its commands (one was
 * lost, or the node sent one too many), or the node answers wrongly. */
#define RL_OUT_OF_STEP "connection reset: a step check (ECHO) got another reply (replies out of step?)"

#endif
