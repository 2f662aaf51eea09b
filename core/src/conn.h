/* conn.h — the libev driver's socket to one node: its address (a numeric
 * one at once, a host name looked up on a thread of its own, never on the
 * loop), a non-blocking connect, for rediss:// nodes the TLS handshake
 * after it (tls.c), reads and writes through TLS or not, and the socket's
 * send queue. No policy: the engine decides when to connect, when to give
 * up, and when to close. */
#ifndef RL_CONN_H
#define RL_CONN_H

#include "redlock.h"
#include "resolve.h"
#include "tls.h"
#include "url.h"

typedef struct rl_conn {
    const rl_url *url;
    rl_addrs addrs;          /* TCP: where the host is (empty until a lookup found it) */
    int addr_next;           /* which of addrs the next connect tries */
    int named;               /* TCP host is a name, not a numeric address: it needs lookups */
    rl_lookup *lookup;       /* a lookup of the name running on its own thread, or NULL */
    int first_lookup;        /* lookup is the one rl_conn_init began, and nobody has waited for it */
    int fd;                  /* -1 when closed */
    int connecting;          /* a connect is in progress on fd */
    int handshaking;         /* connected; the TLS handshake is not done */
    rl_tls *tls;             /* the client's TLS context for a rediss:// node, else NULL */
    rl_tls_session session;  /* the connection's TLS session (tls only) */
    int want;                /* after RL_CONN_AGAIN: RL_TLS_WANT_READ or RL_TLS_WANT_WRITE */
    char errstr[RL_NODE_ERR_LEN];  /* why the last open, connect, read or write failed */
} rl_conn;

enum { RL_CONN_AGAIN = 0, RL_CONN_FAIL = -1 };

/* Prepare c for url; start finding its address (a host name on a thread).
 * tls: the context for a rediss:// url (NULL for the others). */
void rl_conn_init(rl_conn *c, const rl_url *url, rl_tls *tls);

/* Wait for the name lookup begun by rl_conn_init until the clock passes
 * deadline_ms (rl_now_ms); a lookup not finished by then goes on in the
 * background, and errstr says it timed out after timeout_ms. */
void rl_conn_wait_lookup(rl_conn *c, double deadline_ms, int timeout_ms);

/* 1 while the name's first lookup (begun by rl_conn_init) runs and nothing
 * has waited for it yet (rl_conn_wait_lookup): rl_conn_open then fails
 * with "name resolution in progress", and a connect should try again once
 * this is 0, rather than give up, within its connect timeout. Polls the
 * lookup (never waits). */
int rl_conn_first_lookup_running(rl_conn *c);

/* Begin a non-blocking connect (fd set, connecting = 1). Return 0, or -1
 * with the reason in errstr (no address yet, a socket error). */
int rl_conn_open(rl_conn *c);

/* The connect in progress finished (the socket became writable): return 0
 * if it succeeded, -1 with the reason in errstr (then closed). A TLS node
 * is then handshaking: call rl_conn_handshake until it says done. */
int rl_conn_finish_connect(rl_conn *c);

/* One step of a TLS handshake: 1 when done (at once for plain TCP),
 * RL_CONN_AGAIN (want says for what), or RL_CONN_FAIL with the reason in
 * errstr (then closed). */
int rl_conn_handshake(rl_conn *c);

/* At most a read of RL_CONN_DRAIN_MAX bytes a call: a node that sends
 * without pause (a reply that never ends) cannot keep the loop from its
 * timers; what is left keeps the socket readable for the next turn. */
#define RL_CONN_DRAIN_MAX (256 * 1024)

/* Read what there is, up to about RL_CONN_DRAIN_MAX bytes (over TLS, every
 * byte already decrypted too), handing each chunk to take(arg, data, len);
 * take returns nonzero to stop. Return RL_CONN_AGAIN once there is nothing
 * more or the call has read its share (want: RL_TLS_WANT_READ, or
 * RL_TLS_WANT_WRITE when a TLS read waits for the socket to be writable),
 * 1 when take stopped, or RL_CONN_FAIL with the reason in errstr. */
int rl_conn_drain(rl_conn *c, int (*take)(void *arg, const char *data, size_t len), void *arg);

/* Write up to len bytes: the count taken, RL_CONN_AGAIN (want says for
 * what; offer the same bytes, or more, again), or RL_CONN_FAIL with the
 * reason in errstr. Never raises SIGPIPE. */
ssize_t rl_conn_write(rl_conn *c, const char *data, size_t len);

/* Bytes written to the socket that the node's end has not taken yet. */
long long rl_conn_unsent(const rl_conn *c);

/* Close the socket (if open), sending a TLS close_notify if it fits. */
void rl_conn_close(rl_conn *c);

/* Close, and abandon a lookup still running (its thread frees it). */
void rl_conn_free(rl_conn *c);

#endif
