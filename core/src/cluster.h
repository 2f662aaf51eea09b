/* cluster.h — a node that is a Redis Cluster (cluster.c): one vote, the
 * vote of the shard that serves the resource's hash slot.
 *
 * Such a node is written redis-cluster://[user:password@]host:port+host:port
 * (rediss-cluster:// for TLS): seeds, every one with the same password and
 * TLS. Its own stream (e->nodes[i], link i) connects to the first seed and
 * asks for the map (CLUSTER NODES); every master the map names, and every
 * other seed, is a *shard*: a command stream of its own under the node
 * (links 2N + 2k, and 2N + 2k + 1 for its subscriber stream, k the shard's
 * number in the engine). A command for node i goes to the shard serving
 * its hash slot (rl_route_send); until the first map is in it waits
 * (answered with an error if no seed gives one). A reply MOVED updates the
 * map, asks for a fresh one and sends the command again to the shard
 * named; ASK sends ASKING and the command to the shard named, once. A
 * command is redirected RL_CLUSTER_REDIRECTS times at most: after that its
 * reply (the last MOVED or ASK) is a failed vote, as CLUSTERDOWN and a
 * shard that cannot be reached are (the latter also asks for the map
 * again: a failover may have promoted a replica). TRYAGAIN (a command naming several
 * keys of a slot in migration, not all of them in one place) sends the
 * command to the same shard again after a pause (cluster_retry.c), up to
 * RL_TRYAGAIN_MAX times and only while rl_op_may_resend allows; then it is
 * a failed vote too. */
#ifndef RL_CLUSTER_H
#define RL_CLUSTER_H

#include "hashslot.h"
#include "stream.h"
#include "substream.h"

#define RL_CLUSTER_REDIRECTS 5  /* MOVED/ASK followed per command, at most */
#define RL_TRYAGAIN_MAX 12      /* sends again after TRYAGAIN per command, at most */
#define RL_TRYAGAIN_MIN_MS 2    /* the pause before each: an eighth of the node timeout, */
#define RL_TRYAGAIN_MAX_MS 100  /* within these bounds */
#define RL_CLUSTER_REMAP_MS 1000 /* a shard that cannot be reached asks for the map at most this often */
/* The longest CLUSTER NODES text taken (a line a node: replicas, and slots
 * in many ranges, make it long): a cluster node's connections (its seeds',
 * its shards') take strings up to this long, where others take 64 KB. */
#define RL_CLUSTER_TEXT_MAX (1024 * 1024)

_Static_assert(RL_MAX_LINKS == 2 * RL_MAX_NODES + 2 * RL_MAX_SHARDS, "RL_MAX_LINKS");
_Static_assert(RL_MAX_SHARDS < 255, "a hash slot's owner is a shard number + 1 in a byte");
_Static_assert(RL_MAX_SHARDS < 63, "rl_cluster.tried has a bit per shard");

/* Ticket kinds of the cluster's own commands (beside RL_OP_*: they reach
 * the cluster's callbacks, never an operation). */
enum { RL_KIND_TOPOLOGY = 100, RL_KIND_ASKING = 101 };

struct rl_engine;

/* One master of a cluster node (or a seed): its address and streams. */
typedef struct rl_shard {
    struct rl_engine *e;
    int node;            /* the cluster node it serves */
    int number;          /* k: its links are 2N + 2k and 2N + 2k + 1 */
    rl_url url;          /* the seed's URL (password, TLS) at this shard's host and port */
    char alias[256];     /* the hostname its master announces (Redis 7), which MOVED names in
                            cluster-preferred-endpoint-type hostname; "" if none known */
    int seed;            /* a seed of the cluster URL (never reused for another master) */
    int replying;        /* its stream's replies are being handled (on the stack: never reused then) */
    unsigned stale;      /* reused for another master while the driver still had a socket to the one
                            before: bit 0 its command link, bit 1 its subscriber link; the driver's
                            reports on such a link are about that socket and are refused, until it
                            takes the link's wishes (RL_WANT_CLOSE first) */
    rl_stream st;        /* its command stream */
    /* The bytes of every command awaiting its reply, oldest first, so that
     * MOVED or ASK can send it again: sent.data[sent_off ..), each lens[] long. */
    rl_buf sent;
    size_t sent_off;
    size_t *lens;
    unsigned head, count, cap;
} rl_shard;

/* A command that waits for a cluster node's first map. */
typedef struct rl_pending {
    rl_ticket t;
    int hslot;
    size_t len;
} rl_pending;

typedef struct rl_cluster {
    unsigned char owner[RL_HASH_SLOTS]; /* each hash slot's shard number + 1; 0: not served (or not known) */
    int known;           /* a map was read */
    int asking;          /* a CLUSTER NODES is in flight */
    rl_stream *asked;    /* on this stream (the seed's, or a shard's: shards live as long as the engine) */
    int refresh;         /* a MOVED came since it was sent: ask again once it is in */
    int full;            /* the map in use names a master no shard was left for (RL_MAX_SHARDS) */
    unsigned long long tried; /* the streams asked in this spell: bit 0 the seed's, bit k + 1 shard k's */
    double remap_at;     /* engine time before which an unreachable shard asks for no map */
    rl_buf pend;         /* the bytes of the commands waiting for the first map, back to back */
    rl_pending *pends;
    unsigned npend, cappend;
    char name[RL_NODE_ERR_LEN]; /* "redis-cluster://h:p+h:p" (no password) */
} rl_cluster;

/* 1 if text is a cluster URL (redis-cluster:// or rediss-cluster://). */
int rl_cluster_url(const char *text);

/* The name of the cluster URL text, for messages: text without its
 * user and password ("redis-cluster://h:p+h:p"). Return 0, or -1 when it
 * does not fit in len. */
int rl_cluster_name(const char *text, char *buf, size_t len);

/* Parse the seed k (0 the first) of the cluster URL text into *u: a
 * redis:// URL (rediss:// for rediss-cluster://) with the cluster's user,
 * password and query. Return 1; 0 when text has no seed k (the seeds
 * before it were parsed); -1 with the reason in err for a seed that is
 * empty, not a URL or names a database, and for text without seeds. Pure:
 * the engine's nodes and `redlock status` read the seeds with it. */
int rl_cluster_seed(const char *text, int k, rl_url *u, char *err, size_t errlen);

/* Set up node i of e as the cluster text names: e->urls[i] becomes its
 * first seed, and the other seeds become shards. Return 0, or -1 with the
 * reason in err. */
int rl_cluster_add(struct rl_engine *e, int i, const char *text, char *err, size_t errlen);

/* Give e's subscriptions (made after the nodes) the shards' streams made
 * so far, and the routing of watches: a plain node's stream serves every
 * watch, a cluster node's own none, a shard's those of the slots it
 * serves (sharded pub/sub). */
void rl_cluster_subs(struct rl_engine *e);

/* Free what e's clusters and shards hold. */
void rl_cluster_free(struct rl_engine *e);

/* The seed stream's replies (on_reply of a cluster node's own stream). */
void rl_cluster_seed_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr);

/* The stream that carries node i's commands for hash slot hslot: node i's
 * own stream on a plain node; on a cluster node the shard serving hslot,
 * or the seed's stream while no shard does (no map yet, a slot not
 * served). */
rl_stream *rl_route(struct rl_engine *e, int i, int hslot);

/* The votes of res's cluster nodes that timed out (silence: "no reply
 * within 100 ms", a suspect's "not answering ...", a setup unanswered)
 * and do not name a master yet get " (master host:port)" of the master
 * serving hslot, where it fits (RL_NODE_ERR_LEN): a seed list of three
 * addresses does not say which one is stopped. A lost connection names
 * its master already (rl_engine_node_down); an error reply is the
 * master's own words, kept whole. */
void rl_cluster_name_masters(struct rl_engine *e, rl_result *res, int hslot);

/* Send a command to node i for hslot (rl_stream_send's contract: 0, or -1
 * with the reason in rl_route(e, i, hslot)->errstr). */
int rl_route_send(struct rl_engine *e, int i, int hslot, const char *cmd, size_t len, rl_ticket t);

/* Send two commands to node i for hslot, the second right behind the
 * first on the same connection (a write and its WAIT). As rl_route_send
 * for the first; once the first is sent, 0 even if the second could not
 * be (only out of memory): a reply then waits for the second in vain,
 * which the caller's round deadline ends. */
int rl_route_send_pair(struct rl_engine *e, int i, int hslot, const char *cmd, size_t len, rl_ticket t,
                       const char *cmd2, size_t len2, rl_ticket t2);

/* The shard of node i at host:port (host: its address, or the hostname
 * its master announces), made at host:port if there is none yet (its URL
 * is the seed's, moved there). Once RL_MAX_SHARDS are made, a shard that
 * is free is reused instead: one that no cluster node's map names (so no
 * watch is served by its subscriber stream), that is no seed, whose
 * replies are not being handled, and that owes nothing (no reply owed,
 * nothing unwritten, no release kept, no TRYAGAIN to send again). Its connections
 * are closed through the engine (the driver is asked to close them) and it
 * starts over at host:port, its links' numbers the same. NULL when none is
 * free or memory ran out. */
rl_shard *rl_cluster_shard_at(struct rl_engine *e, int i, const char *host, int port);

/* Ask node i's cluster for its map: CLUSTER NODES on the seed's stream,
 * or on the first shard that will take it. Unless one is in flight (then
 * once more after it); one in flight on a stream that has become suspect
 * is given up (a stopped seed keeps its connection: it neither answers nor
 * fails), and the next stream of this spell is asked. */
void rl_cluster_ask_map(struct rl_engine *e, int i);

/* A command for node i could not reach the shard serving its slot (the
 * connection is down or lost, or the shard stopped answering): a master
 * that is gone sends no MOVED, and the cluster may have promoted its
 * replica meanwhile, so ask for the map again, at most once per
 * RL_CLUSTER_REMAP_MS while the shard stays unreachable. */
void rl_cluster_shard_unreachable(struct rl_engine *e, int i);

/* A reply to CLUSTER NODES (reply NULL: its failure, errstr) that came on
 * stream s of node i: the map is read and the commands waiting for it
 * go, or another seed is asked, or they fail. */
void rl_cluster_map_reply(struct rl_engine *e, int i, rl_stream *s, const rl_reply *reply, const char *errstr);

/* Send cmd through shard sh (rl_stream_send's contract), its bytes kept
 * until its reply comes (cluster_redirect.c). */
int rl_shard_send(rl_shard *sh, const char *cmd, size_t len, rl_ticket t);

/* A shard stream's replies (its on_reply; owner: the shard): MOVED and ASK
 * followed, everything else to the operation (cluster_redirect.c). */
void rl_shard_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr);

/* Send ASKING through shard sh: the next command there is served in a
 * slot it is importing. resend: that command is a release kept for the
 * next connection if this one ends unanswered (ticket.resend), and the
 * ASKING is kept with it, in front (sent bare, the importing master would
 * answer MOVED, and nobody reads a kept release's reply). Return
 * rl_shard_send's result. */
int rl_shard_send_asking(rl_shard *sh, int resend);

/* A reply on shard sh to the command of ticket t, whose bytes are in
 * e->redirect: if it is TRYAGAIN and the command may go again, keep it to
 * go again after a pause and return 1 (the reply is not passed on);
 * else 0. */
int rl_cluster_retry_later(struct rl_engine *e, rl_shard *sh, rl_ticket t, const rl_reply *reply);

/* When the next kept command is due (engine time, ms), or -1 if none. */
double rl_cluster_retry_deadline(const struct rl_engine *e);

/* Send every kept command that is due (or, if it may no longer go again,
 * answer its operation with the TRYAGAIN it met). */
void rl_cluster_retry_advance(struct rl_engine *e);

/* Drop every kept command (the engine is being freed). */
void rl_cluster_retry_free(struct rl_engine *e);

/* The TRYAGAIN that a command of the operation at slot (of generation
 * gen) met on cluster node i and that keeps it waiting to go again, told
 * in out ("TRYAGAIN ... (the slot still migrating after N sends)"): 1, or
 * 0 when none waits. For a vote whose node timeout ends meanwhile. */
int rl_cluster_retry_text(const struct rl_engine *e, int slot, unsigned gen, int i, char *out, size_t cap);

/* 1 if a command is kept to go to shard sh again, else 0. */
int rl_cluster_retry_holds(const struct rl_engine *e, const rl_shard *sh);

/* Why a master of node i has no shard: "too many cluster masters (48)"
 * once RL_MAX_SHARDS are made and none is free to be reused, else "out of
 * memory"; into buf, with what (a hash slot, a MOVED) after it. */
void rl_cluster_no_shard(const struct rl_engine *e, const char *what, char *buf, size_t len);

/* Shard number k of e, or NULL. */
rl_shard *rl_cluster_shard(const struct rl_engine *e, int k);

#endif
