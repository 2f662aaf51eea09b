/* notify.h — the libev client's subscriber connections: one per node,
 * opened on the first rl_watch, listening on two channels per resource
 * someone waits for, both published by the release script: the resource's
 * ("redlock:released:" .. prefix .. resource) and this client's wake
 * channel for it (RL_WAKE_PREFIX .. waiter id .. ":" .. prefix .. resource),
 * counting the messages heard that are a release's: on the resource's
 * channel a positive decimal number (the listeners), on the wake channel
 * "1"; any other message is ignored.
 *
 * A frame (a message, a confirmation) longer than 64 KB plus the longest
 * channel name watched ends the connection as soon as that many of its
 * bytes are in (a PUBLISH of megabytes is never buffered whole); it is then
 * opened again after the backoff, as after any failure.
 *
 * No policy beyond the connection's own: a node that cannot be reached is
 * retried after a doubling backoff, and meanwhile simply sends no wake-ups.
 * Connections stay open once opened, unsubscribed when nobody waits. */
#ifndef RL_NOTIFY_H
#define RL_NOTIFY_H

#include <stddef.h>

#include <ev.h>

#include "engine.h"
#include "tls.h"

#define RL_CHANNEL_PREFIX "redlock:released:"

typedef struct rl_notify rl_notify;

/* For the engine's nodes and options (reconnect and connect timeouts, key
 * prefix) on loop, with tls (the client's context, which must outlive n)
 * for rediss:// nodes; nothing is connected yet. NULL when out of memory. */
rl_notify *rl_notify_new(struct ev_loop *loop, const rl_engine *e, const rl_options *opts, rl_tls *tls);

/* Close every connection and free. NULL is ignored. */
void rl_notify_free(rl_notify *n);

/* Listen for releases of resource (one more waiter): subscribes on the first,
 * connecting the subscribers if they are not yet. RL_OK, or RL_ERR when out
 * of memory. */
int rl_notify_watch(rl_notify *n, const char *resource, size_t len);

/* One waiter fewer; at none the channel is unsubscribed. Unknown: ignored. */
void rl_notify_unwatch(rl_notify *n, const char *resource, size_t len);

/* Messages heard for resource while watched (0 if not watched); resource
 * NULL: for every resource, since the client began. */
unsigned rl_notify_heard(const rl_notify *n, const char *resource, size_t len);

/* Clients that listened on resource's channel (this one included) when the
 * last release heard for it was published; resource NULL: the most over
 * every watched resource. 0 when unknown (nothing heard yet). */
int rl_notify_listeners(const rl_notify *n, const char *resource, size_t len);

/* Subscriber connections up (connected, with AUTH and SUBSCRIBE sent). */
int rl_notify_up(const rl_notify *n);

#endif
