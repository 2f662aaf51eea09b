/* substream.h — hand-off's subscriptions, free of I/O: the resources
 * watched and what was heard for each (watches.c), and per node the
 * subscriber connection's stream (substream.c; the engine's links
 * N .. 2N-1, redlock.h).
 *
 * A watched resource listens on two channels, both published by the release
 * script: the resource's (RL_CHANNEL_PREFIX .. prefix .. resource) and this
 * engine's wake channel for it (RL_WAKE_PREFIX .. waiter id .. ":" .. prefix
 * .. resource). Only a release's message counts: on the resource's channel a
 * positive decimal number (the listeners), on the wake channel "1"; any
 * other message is ignored.
 *
 * Per node the stream decides everything but moving bytes and reading the
 * clock: a connection is asked for on the first watch (and while anything
 * is watched after a failure, after a backoff doubling from
 * reconnect_min_ms to reconnect_max_ms, started over by a confirmed
 * SUBSCRIBE); on a fresh connection AUTH (when the URL has a password) and
 * one SUBSCRIBE of every channel watched; then SUBSCRIBE and UNSUBSCRIBE as
 * watches come and go. Replies are parsed by the command streams' reader
 * (reply.c). A frame (a message, a confirmation) longer than
 * RL_REPLY_MAX_STRING plus the longest channel name watched so far ends the
 * connection as soon as that many of its bytes are in (it is never
 * buffered whole), as do garbage, an error reply (a refused AUTH or
 * SUBSCRIBE) and the connect timeout. Connections stay open once opened,
 * unsubscribed when nobody watches. */
#ifndef RL_SUBSTREAM_H
#define RL_SUBSTREAM_H

#include "command.h"
#include "names.h"
#include "redlock.h"
#include "reply.h"
#include "url.h"

#define RL_CHANNEL_PREFIX "redlock:released:"

/* One watched resource (a slot; waiters 0: free). */
typedef struct rl_watched {
    int waiters;             /* rl_subs_watch calls not undone */
    char *channel;           /* RL_CHANNEL_PREFIX prefix resource: every listener */
    size_t len;
    char *wake;              /* RL_WAKE_PREFIX id ":" prefix resource: this engine, from the queue */
    size_t wake_len;
    unsigned heard;          /* release messages heard while watched */
    int listeners;           /* what the last one said (1 on the wake channel); 0: none yet */
    int news;                /* heard since rl_subs_news last handed it out: 1, | 2 if on the resource's channel */
    /* With cluster nodes (rl_subs.clusters): the same channels named with
     * the key's companion base (hashslot.h), which cluster nodes publish
     * on (SPUBLISH), and the key's hash slot. */
    char *cchannel, *cwake;
    size_t clen, cwake_len;
    int hslot;
    double linger_until;     /* waiters 0: still subscribed until then (rl_subs_unwatch); 0: not lingering */
} rl_watched;

/* w is subscribed: watched, or lingering after its last waiter won. */
static inline int rl_watched_live(const rl_watched *w) {
    return w->waiters > 0 || w->linger_until > 0;
}

/* One node's subscriber connection. */
typedef struct rl_substream {
    const rl_url *url;
    int state;               /* RL_STREAM_* (stream.h) */
    int wants;               /* RL_WANT_CONNECT / RL_WANT_CLOSE not yet taken by the driver */
    int handshaking;         /* CONNECTING: connected, the TLS handshake under way */
    int backoff_ms;          /* the last reconnect delay (0: the next failure waits reconnect_min_ms) */
    double retry_at_ms;      /* DOWN: when to connect again (if anything is watched then) */
    double connect_by_ms;    /* CONNECTING: the connect deadline (from the ask; once the driver
                                takes the ask, from then) */
    rl_buf out;              /* bytes not written yet: out.data[out_off .. out.len) */
    size_t out_off;
    rl_reader reader;
    unsigned long long frame_start; /* where the frame being read began in the stream */
    char errstr[RL_NODE_ERR_LEN];   /* why the connection is down, or the last one ended */
    int sharded;             /* a cluster's shard: SSUBSCRIBE of the watches it serves, one by one */
} rl_substream;

typedef struct rl_subs {
    const rl_options *opts;  /* the engine's (its prefix too) */
    int nnodes;
    char *head;              /* RL_CHANNEL_PREFIX prefix */
    size_t head_len;
    rl_watched *w;             /* slots, by watch id */
    rl_names by_resource;    /* each live watch's resource (its channel past head) -> id */
    rl_names by_channel;     /* each live watch's channel and wake channel on plain nodes -> id */
    rl_names by_shard_channel; /* the same on a cluster's shards (cchannel, cwake): the names of
                                  two resources may meet across the two ("{a}"'s and "a"'s) */
    int nw, capw, used;      /* slots made, room, slots subscribed (rl_watched_live) */
    double linger_next;      /* the earliest linger_until set since the last look (maybe over early), or 0 */
    int *news;               /* ids whose news is not handed out yet (each at most once) */
    int nnews;
    size_t longest;          /* the longest channel name watched so far */
    unsigned total;          /* release messages heard, every resource */
    unsigned long long heard_total; /* the same, never wrapping (rl_stats.wakeups) */
    int clusters;            /* the engine has cluster nodes: watches get their cluster names too */
    int nsubs;               /* streams in nodes[]: one per node, then one per shard (rl_subs_add) */
    /* Which watches stream j serves (NULL: all): the engine's routing. */
    int (*serves)(void *owner, int j, const rl_watched *w);
    /* Shard stream j's server ended a live watch's subscription (Redis 7
     * ends the sharded subscriptions of a slot it gives up) or refused
     * one (MOVED): the engine asks for the cluster's map again, whose
     * reading subscribes every watch where its slot is now
     * (rl_subs_rerouted); after a refusal at most once a while, since a map
     * that still names the refusing master would have it refuse again. */
    void (*lost_shard)(void *owner, int j, int refused);
    void *owner;
    rl_substream nodes[RL_MAX_NODES + RL_MAX_SHARDS];
} rl_subs;

/* Prepare s for nodes urls[0 .. n-1] with opts (kept, with its prefix, for
 * s's life). Return 0, or -1 when out of memory. */
int rl_subs_init(rl_subs *s, const rl_url *urls, int n, const rl_options *opts);
void rl_subs_free(rl_subs *s);

/* A stream for a cluster's shard at url (sharded pub/sub): its index, or
 * -1 when there is no room. Idle until a watch it serves asks for it. */
int rl_subs_add(rl_subs *s, const rl_url *url);

/* Start stream i (a shard's, reused for another master at its URL) over,
 * idle: its connection, if the driver has one (made, being made, or asked
 * to be closed), is to be closed (RL_WANT_CLOSE). Return 1 if the driver
 * had one, else 0. */
int rl_subs_restart(rl_subs *s, int i);

/* The map of a cluster node changed: every shard's stream subscribes the
 * watches it serves now (asking for its connection if it has none). */
void rl_subs_rerouted(rl_subs *s, double now_ms);

/* One more waiter of resource (its channels named with waiter, this
 * engine's id); the first subscribes on every node, asking for the
 * connections that are not up. Return the watch id (>= 0, the same for
 * every waiter of resource), or -1 (empty or too long, out of memory). */
int rl_subs_watch(rl_subs *s, const char *resource, size_t len, const char *waiter, double now_ms);

/* One waiter fewer; at none the channels are unsubscribed and what was heard
 * is forgotten, or, linger_ms > 0, that happens linger_ms later unless a
 * watch of the resource comes first: that watch subscribes nothing. While
 * it lingers the watch counts nothing heard, and a message on its wake
 * channel (a node still has this engine in its queue) ends it at once, so
 * that the node passes the turn on. A resource not watched is ignored. */
void rl_subs_unwatch(rl_subs *s, const char *resource, size_t len, double now_ms, int linger_ms);

/* What was heard for resource while watched (0 if not watched; resource
 * NULL: for every resource, ever), and what the last message said (the
 * listeners; resource NULL: the most over every watch; 0: nothing heard). */
unsigned rl_subs_heard(const rl_subs *s, const char *resource, size_t len);
int rl_subs_listeners(const rl_subs *s, const char *resource, size_t len);

/* The id of a watch that heard something since it was last handed out
 * here (and *broadcast: whether on the resource's channel), or -1. */
int rl_subs_news(rl_subs *s, int *broadcast);

/* Subscriber connections up. */
int rl_subs_listening(const rl_subs *s);

/* Between the two halves. rl_subs_message: a message on channel ch, from
 * a plain node or (sharded) a cluster's shard, counted for the watch it
 * belongs to if it is a release's (that watch then has news). rl_subs_changed: watch w was added (subscribe 1) or
 * is going (0; s->used already counts it out): SUBSCRIBE or UNSUBSCRIBE
 * its channels on every node up; a watch asks idle nodes for a connection,
 * and with nothing watched any more a connection not yet begun is not
 * needed. */
void rl_subs_message(rl_subs *s, const char *ch, size_t len, const char *payload, size_t plen, int sharded);
void rl_subs_changed(rl_subs *s, const rl_watched *w, int subscribe, double now_ms);

/* End the lingers that are over by now_ms (rl_subs_advance's part in watches.c). */
void rl_subs_linger_advance(rl_subs *s, double now_ms);

/* A linger_until that is over whatever the clock says: the smallest moment
 * rl_subs_deadline can report (0 means none). */
#define RL_LINGER_OVER 1e-9

/* Node i's stream, as the command streams' rl_stream_* (stream.h): the
 * driver's wishes, what it reports, the bytes to write, the bytes read. */
int rl_subs_take_wants(rl_subs *s, int i, double now_ms);
int rl_subs_wanting(const rl_subs *s, int i);
void rl_subs_open(rl_subs *s, int i, double now_ms);
int rl_subs_connected(rl_subs *s, int i, double now_ms);
void rl_subs_handshaking(rl_subs *s, int i);
void rl_subs_down(rl_subs *s, int i, const char *why, double now_ms);
int rl_subs_detach(rl_subs *s, int i, double now_ms);
size_t rl_subs_output(const rl_subs *s, int i, const char **data);
void rl_subs_wrote(rl_subs *s, int i, size_t n);
int rl_subs_feed(rl_subs *s, int i, const char *data, size_t len, double now_ms);

/* The earliest moment rl_subs_advance has work (a reconnect, a connect
 * deadline, a linger's end), or 0 for none; and doing it. */
double rl_subs_deadline(const rl_subs *s);
void rl_subs_advance(rl_subs *s, double now_ms);

#endif
