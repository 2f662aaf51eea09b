/* conn.h — the libev driver's socket to one node: its address (a numeric
 * one at once, a host name looked up on a thread of its own, never on the
 * loop), a non-blocking connect, and the socket's send queue. No policy:
 * the engine decides when to connect, when to give up, and when to close. */
#ifndef RL_CONN_H
#define RL_CONN_H

#include "redlock.h"
#include "resolve.h"
#include "url.h"

typedef struct rl_conn {
    const rl_url *url;
    rl_addrs addrs;          /* TCP: where the host is (empty until a lookup found it) */
    int addr_next;           /* which of addrs the next connect tries */
    int named;               /* TCP host is a name, not a numeric address: it needs lookups */
    rl_lookup *lookup;       /* a lookup of the name running on its own thread, or NULL */
    int fd;                  /* -1 when closed */
    int connecting;          /* a connect is in progress on fd */
    char errstr[RL_NODE_ERR_LEN];  /* why the last open or connect failed */
} rl_conn;

/* Prepare c for url; start finding its address (a host name on a thread). */
void rl_conn_init(rl_conn *c, const rl_url *url);

/* Wait for the name lookup begun by rl_conn_init until the clock passes
 * deadline_ms (rl_now_ms); a lookup not finished by then goes on in the
 * background, and errstr says it timed out after timeout_ms. */
void rl_conn_wait_lookup(rl_conn *c, double deadline_ms, int timeout_ms);

/* Begin a non-blocking connect (fd set, connecting = 1). Return 0, or -1
 * with the reason in errstr (no address yet, a socket error). */
int rl_conn_open(rl_conn *c);

/* The connect in progress finished (the socket became writable): return 0
 * if it succeeded, -1 with the reason in errstr (then closed). */
int rl_conn_finish_connect(rl_conn *c);

/* Bytes written to the socket that the node's end has not taken yet. */
long long rl_conn_unsent(const rl_conn *c);

/* Close the socket (if open). */
void rl_conn_close(rl_conn *c);

/* Close, and abandon a lookup still running (its thread frees it). */
void rl_conn_free(rl_conn *c);

#endif
