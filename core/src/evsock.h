/* evsock.h — the libev driver's socket for one engine link: a node's
 * command connection or its subscriber connection (redlock.h, "Links"),
 * driven alike. One holder per link: the socket (conn.c, TLS included),
 * its two libev watchers, and which direction a TLS call waits for. The
 * holder starts and stops its watchers by calls that are safe to repeat
 * (hiredis' adapters/libev.h is the model), connects, finishes the connect
 * and the TLS handshake, reads everything there is into the engine and
 * writes what the engine has, and tells the engine how each step went. No
 * policy: the engine says when to connect and when to close.
 *
 * Over TLS a read may need the socket writable and a write may need it
 * readable; the holder remembers which of its calls waits for the other
 * direction. A rediss:// link is reported connected only once its
 * handshake is done, so the engine's connect timeout covers it. */
#ifndef RL_EVSOCK_H
#define RL_EVSOCK_H

#include <ev.h>

#include "conn.h"

typedef struct rl_evsock {
    rl_conn conn;
    int opened;              /* conn initialised (its name lookup begun) */
    const rl_url *url;
    rl_tls *tls;             /* the client's TLS context for a rediss:// node, else NULL */
    struct ev_loop *loop;
    ev_io readable;          /* while connected: bytes to read; a handshake waiting to read */
    ev_io writable;          /* while connecting, or while output (or a TLS step) waits for room */
    ev_timer resolving;      /* a connect waiting for the name's first lookup: when to look again */
    rl_engine *engine;
    int link;                /* the engine's link index */
    int read_wants_write;    /* TLS: the last read waits for the socket to be writable */
    int write_wants_read;    /* TLS: the last write waits for the socket to be readable */
    void (*after)(void *owner);  /* called after every event the holder handled (the owner services the engine) */
    void *owner;
} rl_evsock;

/* Prepare s for link of engine e, whose node is at url (tls: the context
 * for a rediss:// node, else NULL), on loop; after(owner) runs after every
 * event s handles. Nothing is looked up or connected yet. */
void rl_evsock_init(rl_evsock *s, struct ev_loop *loop, rl_engine *e, int link, const rl_url *url, rl_tls *tls,
                    void (*after)(void *owner), void *owner);

/* Begin finding the node's address (a host name on a thread) if not yet
 * begun; rl_evsock_connect does it too. */
void rl_evsock_lookup(rl_evsock *s);

/* The engine wants a connection: begin one, or tell the engine at once why
 * there is none (rl_engine_node_down). A name whose first lookup is still
 * running (a shard's, a subscriber's: links looked up when first asked to
 * connect) is waited for without blocking, the lookup looked at every few
 * ms, within the engine's connect timeout: the connect begins once it has
 * an address. */
void rl_evsock_connect(rl_evsock *s);

/* Close the socket (the engine asked, or is done with it). */
void rl_evsock_close(rl_evsock *s);

/* Write what the engine has for the link, as much as the socket takes now;
 * the rest waits for the socket to be writable. */
void rl_evsock_flush(rl_evsock *s);

/* Take what the sockets of socks[0 .. n-1] already have (finished
 * connects, handshake steps, bytes to read) without waiting, and tell the
 * engine how much each has left unsent: before the engine judges anyone
 * late. */
void rl_evsock_take_ready(rl_evsock *socks, int n);

/* rl_evsock_take_ready at the first look after a gap in the polls: a TLS
 * handshake begun before it that fails now is reported as a connection
 * that had outlived its server's idle timeout unused
 * (rl_engine_node_closed_unused), not as a node down. */
void rl_evsock_take_after_gap(rl_evsock *socks, int n);

/* Take what the sockets of socks[i] whose bit i is set in which already
 * have, without waiting (the send queues are not asked). */
void rl_evsock_take_ready_of(rl_evsock *socks, int n, unsigned which);

/* Free s without a word to its peer: no TLS close_notify, only close(2)
 * (a forked child's copy of a socket its parent goes on using). */
void rl_evsock_disown(rl_evsock *s);

/* Close, and abandon a name lookup still running. */
void rl_evsock_free(rl_evsock *s);

#endif
