/*
 * redlock.h — the public C API of the redlock core.
 *
 * A client talks to N independent Redis masters and runs the Redlock
 * algorithm: every operation is a *round* that sends one command to all
 * nodes at once and counts replies until the outcome is certain.
 *
 * Every round (acquire, release, extend) is decided as soon as a quorum
 * agrees or a quorum has become impossible; the caller gets its result
 * then, and never waits for a node slower than the quorum. What the slower
 * nodes still owe is the round's *tail*, served without the caller: their
 * late replies still pair with their commands (and a late NOSCRIPT still
 * gets its EVAL re-sent), until they are in or the node timeout has passed.
 * The cleanup after a failed acquire (a release on every node the SET may
 * have reached) is a tail too. A result shows a node that had not answered
 * at the decision as RL_NODE_PENDING. Who drives a tail:
 *   - rl_client: whatever next drives the client's loop (any rl_* call that
 *     waits: rl_run, rl_wait, rl_sleep, the blocking calls) and
 *     rl_client_free, which serves tails for at most the node timeout.
 *     Every call that drives the loop ends by writing what the sockets
 *     take, and a failed acquire's cleanup is written before rl_wait or
 *     rl_collect hands back its result: while a node's socket is full (the
 *     node still reading a large batch) they drive the loop until it has
 *     taken the cleanup, or taken nothing for stall_reset_ms and been
 *     reset (the cleanup then waits for its next connection), or, with its
 *     connection still being set up, until the cleanup's node timeout
 *     drops it (neither SET nor release went out). So a caller
 *     that stops calling after a failed acquire leaves no release in our
 *     buffers; the replies wait in the socket until the next call, and a
 *     tail is over by its node timeout, so tails never outnumber the
 *     operations begun within one node timeout (plus those of the last
 *     call);
 *   - rl_keeper: its own thread, all the time;
 *   - the engine (rl_engine_*): its driver, through rl_engine_tails;
 *   - inside nginx (lua/redlock): the worker's hub, whose connections and
 *     readers outlive every request, so a tail is served like any reply.
 *
 * The API is pull-style and written for the LuaJIT FFI:
 *   - the library never calls back into foreign code;
 *   - functions return RL_OK or RL_ERR (or a count, or an id >= 0) and fill
 *     caller-owned structs; an operation's verdict (ok, busy, ...) is in
 *     rl_result.status, never in a return value, so "ok" means one thing:
 *         if (rl_acquire(c, "r", 1, 10000, &res) == RL_OK && res.status == RL_STATUS_OK) ...
 *   - many operations may be in flight on one client: rl_begin_* starts one,
 *     rl_run drives the I/O, rl_collect / rl_wait hand back finished ones;
 *   - the blocking calls (rl_acquire, rl_release, rl_extend) are built on that.
 *
 * A client is not thread-safe: use it from one thread at a time. Nor does it
 * survive fork(): in a forked child its calls are refused (RL_ERR, and
 * rl_sleep / rl_sleep_until only sleep), since its sockets are the parent's
 * too; rl_client_free there only closes them. Make a new one in the child.
 * Nor does a keeper (its thread stays in the parent): in a forked child its
 * calls refuse or do nothing, at once (see "Keep-alive in a thread").
 * Plain declarations only (no macros in prototypes, no varargs) so that
 * lua/redlock/cdefs.lua can mirror this file; a spec checks that it does.
 */
#ifndef REDLOCK_H
#define REDLOCK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header: MAJOR.MINOR.PATCH, the same as rl_version()
 * of the library built from this tree and as the packages. Before 1.0 a new
 * minor version may change the API and the ABI (the shared library's soname
 * is libredlock.so.MAJOR.MINOR); a patch version changes neither. */
#define RL_VERSION "0.4.0"
#define RL_VERSION_MAJOR 0
#define RL_VERSION_MINOR 4
#define RL_VERSION_PATCH 0

#define RL_OK 0
#define RL_ERR -1
#define RL_ERR_FULL -2 /* RL_ID_SLOTS operations in flight, finished and not collected, or in their tails: nothing was sent; try again once some end */

#define RL_ERR_LEN 256      /* size of caller-owned error buffers */
#define RL_MAX_NODES 16     /* most nodes one client may use */
#define RL_MAX_SHARDS 48    /* most shards (masters) of its cluster nodes one client may use, all together */
#define RL_MAX_LINKS 128    /* most links of an engine (rl_engine_links): 2 * RL_MAX_NODES + 2 * RL_MAX_SHARDS */
#define RL_VALUE_LEN 40     /* hex characters in a lock value (20 random bytes) */
#define RL_NODE_ERR_LEN 96  /* error text kept per node in a result */
#define RL_ID_SLOTS 65536   /* operations in flight on one client: ids % RL_ID_SLOTS differ */
#define RL_MAX_KEY_LEN 65536     /* longest key (prefix + resource): every round sends it to every node
                                    within a node timeout, and a longer name would hold up later calls */
#define RL_WAITER_ID_LEN 16 /* hex characters of a client's waiter id (hand-off's queue) */
#define RL_MAX_LIMIT 1024   /* most slots a semaphore may have */
#define RL_MAX_SLOT_KEYS 1048576 /* a semaphore's acquire names every slot's key: limit * (key + 24)
                                    bytes at most (1 MB a node, within a node timeout) */
#define RL_LABEL_MAX 15     /* longest holder label a lock value carries (rl_options.label) */
#define RL_MAX_REPLICAS 64  /* most replicas a vote may wait for (rl_options.replicas, ?replicas=N) */

/* What an operation does. */
enum {
    RL_OP_ACQUIRE = 1,   /* SET key value NX PX ttl */
    RL_OP_RELEASE = 2,   /* delete key if it holds value */
    RL_OP_EXTEND = 3     /* PEXPIRE key ttl if it holds value */
};

/* How an operation ended (rl_result.status). */
enum {
    RL_STATUS_PENDING = 0,      /* not decided yet (every round decides at quorum, or once quorum is impossible) */
    RL_STATUS_OK = 1,           /* quorum agreed (and, for acquire/extend, validity > 0) */
    RL_STATUS_BUSY = 2,         /* acquire: enough nodes hold another value that quorum is impossible */
    RL_STATUS_UNAVAILABLE = 3,  /* too few nodes answered usefully (errors, timeouts, down) */
    RL_STATUS_TIMEOUT = 4,      /* quorum reached, but too late: no validity left */
    RL_STATUS_NOT_HELD = 5      /* release/extend: enough nodes do not hold our value */
};

/* What one node said in a round (rl_node_result.state). */
enum {
    RL_NODE_PENDING = 0,  /* no answer yet when the round was decided (it is in the tail) */
    RL_NODE_OK = 1,       /* voted for: key set / deleted / extended */
    RL_NODE_TAKEN = 2,    /* voted against: key holds another value (or none, for release/extend) */
    RL_NODE_ERROR = 3,    /* error reply, bad reply, lost or absent connection */
    RL_NODE_TIMEOUT = 4   /* no reply within the node timeout */
};

/* TLS for rediss:// nodes; the drivers use it, the engine does not. The
 * strings are read when the client is created and may be freed after. */
typedef struct rl_tls_options {
    const char *cafile;       /* PEM bundle of CAs to verify nodes with (NULL: the system's) */
    const char *capath;       /* directory of hashed CA certificates (NULL: none) */
    const char *certfile;     /* client certificate, PEM, for mutual TLS (NULL: none) */
    const char *keyfile;      /* its private key, PEM (NULL: none) */
    const char *server_name;  /* SNI, and the name verified (NULL: each URL's host); 255 bytes at most */
    int verify;               /* 1 (default): verify the chain and the host name or IP; 0: don't */
} rl_tls_options;

/* Check the TLS files of tls as a client for rediss:// nodes loads them
 * (rl_client_new), connecting nowhere: RL_OK, or RL_ERR with the reason in
 * err, naming the option and the file ("tls.keyfile '...': the key is
 * encrypted (a passphrase cannot be given)", "... the key does not match
 * tls.certfile"). For drivers that do TLS with other means (nginx's
 * cosockets) and want the client's own checks of the files. */
int rl_tls_check(const rl_tls_options *tls, char *err, size_t errlen);

/* Client options. Fill with rl_options_init, then change what you need. */
typedef struct rl_options {
    int node_timeout_ms;     /* longest wait for one node's reply in a round (default 50) */
    int connect_timeout_ms;  /* longest wait for a TCP/unix connect with its TLS handshake, and
                                then for the AUTH/SELECT/INFO setup on it, however many rounds
                                time out meanwhile; and for the host name lookups of
                                rl_client_new (default 1000) */
    int reconnect_min_ms;    /* first delay before reconnecting a lost node (default 50) */
    int reconnect_max_ms;    /* cap of the doubling reconnect delay (default 1000) */
    int stall_reset_ms;      /* the stall watchdog (default 500): a node whose end takes none of our
                                bytes this long is reset and reconnected; one silent this long with
                                commands wholly at its end becomes suspect (rl_engine_suspects_due),
                                probed at stall_reset_ms / 2, then doubling up to reconnect_max_ms
                                (a connection still in its setup is connect_timeout_ms's) */
    int quorum;              /* votes needed; 0 means N/2+1; never below N/2+1, never above N */
    double drift_factor;     /* clock drift allowance, fraction of ttl (default 0.01) */
    const char *prefix;      /* prepended to every resource name to form the key (default ""; not
                                starting with "redlock:": see rl_reserved_key) */
    size_t prefix_len;       /* length of prefix in bytes */
    rl_tls_options tls;      /* for rediss:// nodes (default: verify against the system's CAs) */
    const char *label;       /* the holder's label, carried in every lock value this client makes:
                                "label/" then random hex, RL_VALUE_LEN characters in all (at least 24
                                hex: 96 random bits). 1 to RL_LABEL_MAX printable ASCII characters,
                                no '/' and no space; NULL or "" (default): no label, 40 hex. Copied
                                when the client is created. Other clients see an opaque value;
                                `redlock status` shows the label (docs/observability.md) */
    int no_stats;            /* 1: count nothing (rl_engine_stats then reports zeros); default 0:
                                counting is on. For measuring what counting costs */
    int replicas;            /* 0 (default): a node's reply is its vote. 1 to RL_MAX_REPLICAS: a write
                                that grants or prolongs a hold (every acquire, extension, keep-alive
                                renewal, fenced commit) is followed on the same connection by
                                WAIT replicas timeout, and the node's vote for it counts only once
                                WAIT reports at least that many replicas have it; fewer is a failed
                                vote ("0 of 1 replicas acknowledged ..."), undone like any other.
                                WAIT's timeout is half the smaller of node_timeout_ms and
                                stall_reset_ms (at least 1 ms), so the vote comes within the node
                                timeout. A node's URL may say otherwise for that node: ?replicas=N
                                (0 turns it off there). Releases never wait */
} rl_options;

/* One node's part of a result. */
typedef struct rl_node_result {
    int state;                     /* RL_NODE_* */
    char errstr[RL_NODE_ERR_LEN];  /* NUL-terminated error text when state is ERROR or TIMEOUT */
} rl_node_result;

/* The outcome of one operation. Caller-owned; reuse one for many calls. */
typedef struct rl_result {
    int id;                  /* operation id returned by rl_begin_* */
    int op;                  /* RL_OP_* */
    int status;              /* RL_STATUS_* */
    int nodes;               /* number of nodes asked (entries used in node[]) */
    int quorum;              /* votes that were needed */
    int ok;                  /* nodes that voted for */
    int taken;               /* nodes that voted against */
    int failed;              /* nodes that errored or timed out */
    double elapsed_ms;       /* from before the first send to the decision */
    double validity_ms;      /* acquire/extend: ttl - elapsed - drift, left at the decision; > 0
                                exactly when status is OK. The lock is valid until the clock
                                reading before the call + elapsed_ms + validity_ms (its keys were
                                set no earlier than that reading, and last ttl from then) */
    long long token;         /* a fenced acquire whose status is OK: its fencing token, 1 to
                                LLONG_MAX (2^63-1), exact; else 0 */
    int heard;               /* release: nodes (of those counted before the decision) where a waiter
                                was subscribed to hear it; a releaser about to lock the resource
                                again should give that waiter a head start */
    int slot;                /* a semaphore's acquire whose status is OK: the slot held (1 to its
                                limit); an operation on a slot: that slot; else 0 */
    char value[RL_VALUE_LEN + 1];       /* the lock value (acquire: freshly generated), NUL-terminated */
    rl_node_result node[RL_MAX_NODES];  /* per-node detail, in server order */
} rl_result;

typedef struct rl_client rl_client;

/* Fill *opts with the defaults listed in rl_options. */
void rl_options_init(rl_options *opts);

/*
 * Create a client for the nodes named by urls[0..nurls-1]:
 *   redis://[[user]:password@]host:port[/db]   unix:///path/to.sock[?db=N]
 *   rediss://... (TLS, with opts->tls)
 *   redis-cluster://[[user]:password@]host:port+host:port...  (rediss-cluster:// for TLS):
 *     a Redis Cluster, given by seeds, voting as one node: the master that
 *     serves the resource's hash slot (docs/cluster.md).
 * Host names are looked up here, all at once, waiting at most
 * connect_timeout_ms for them together; numeric addresses are not looked up.
 * A name not resolved by then is not an error: its node starts down (a failed
 * vote whose detail says why) and the name is looked up again in the
 * background; no round ever waits for that lookup. Names met later (a
 * cluster's other seeds and its masters, the subscriber connections) are
 * looked up when first connected, without blocking the loop; a command for
 * one waits for that lookup within the node timeout. Connections start at once,
 * without blocking; AUTH and SELECT follow each connect (for rediss:// nodes,
 * after the TLS handshake, which connect_timeout_ms also bounds). opts may be
 * NULL for the defaults. On error (bad URL, a node listed twice, no nodes, bad
 * options, a TLS file named in opts->tls that cannot be used: "tls.cafile
 * '<path>': <why>") NULL is returned, err holds the reason and nothing is
 * left allocated.
 */
rl_client *rl_client_new(const char *const *urls, int nurls, const rl_options *opts,
                         char *err, size_t errlen);

/* Close every connection and free the client. Operations in flight, and
 * results not collected, are abandoned (their results are lost); an
 * acquire among them holds nothing afterwards: one not yet written to a
 * node is never sent there, and one that went out, decided or not, is
 * released (quietly) on every node it went to, as a failed acquire is
 * (rl_engine_abandon; a Redis Cluster node is sent the acquire and the
 * release behind it). Acquires already collected stay held. Tails still
 * running (see above), those releases among them, are served first, for
 * at most the node timeout, then commands not yet written
 * (rl_engine_unwritten), and then replies still owed by nodes that answer
 * (rl_engine_unanswered: not a node sending one reply that has not ended
 * for stall_reset_ms), each for at most reconnect_max_ms +
 * connect_timeout_ms. NULL is ignored. */
void rl_client_free(rl_client *c);

/* Do to the nodes what rl_client_free does (the same tails, abandoned
 * operations and bounds), but keep c's memory: every later call that would
 * use a connection returns RL_ERR ("this client was closed"), rl_sleep
 * and rl_sleep_until only sleep, and the calls that read (rl_client_errstr,
 * rl_heard, rl_client_stats, ...) still answer. For a caller that cannot
 * know whether a call on c is still running further up its stack (code
 * run by a garbage collector's finalizer, say): rl_client_free later frees
 * what is left. Closing twice, or NULL, does nothing. */
void rl_client_close(rl_client *c);

/* Number of nodes, and the name of node i (its URL without password), or
 * NULL unless 0 <= i < rl_client_nodes(c). */
int rl_client_nodes(const rl_client *c);
const char *rl_client_node_name(const rl_client *c, int i);

/* Votes needed for a decision. */
int rl_client_quorum(const rl_client *c);

/* The text of the last error an rl_begin_* call (or rl_watch) on this
 * client reported. */
const char *rl_client_errstr(const rl_client *c);

/*
 * Start an operation; return its id (>= 0), or RL_ERR with the reason in
 * rl_client_errstr (resource empty, or longer than RL_MAX_KEY_LEN with the
 * prefix, or reserved: see rl_reserved_key; ttl <= 0, value not
 * RL_VALUE_LEN long, out of memory), or
 * RL_ERR_FULL when RL_ID_SLOTS operations are already in flight on this
 * client (the blocking forms below return it too; a finished operation
 * keeps its slot until it is collected, and one collected while its tail
 * still runs until the tail ends, at most its node timeout later).
 * The command is queued; it goes out when the client's loop next runs
 * (rl_run, rl_wait, rl_sleep), in one write per node for everything begun
 * since, so begin a batch, then drive. The clock and the node timeout start
 * here, before the first byte is sent. Resource names are binary-safe (they
 * may hold NUL bytes). An id stays valid until its result is collected; after
 * that it names no operation (rl_wait refuses it), even once its slot is
 * reused, for the next 32,767 uses of that slot (ids carry the slot's use
 * count, 15 bits of it): drop an id once you have its result. Ids of
 * operations in flight on one client differ in id % RL_ID_SLOTS, so that can
 * index a table of your own.
 */
int rl_begin_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms);

/*
 * Keys that are ours: a lock's key (prefix + resource) is the key other
 * Redlock clients use for the same lock, so our other keys and channels
 * must be names that no lock's key can be. Every begin refuses (RL_ERR) a
 * resource whose key
 *   - starts with "redlock:": hand-off's queues ("redlock:queue:" .. key)
 *     and channels live there (rl_client_new refuses such a prefix);
 *   - ends with ":fence": a fenced lock's counter is its key .. ":fence".
 * Return NULL if prefix .. resource may name a lock, else why not (a
 * static text). The prefix counts: "redlock" + ":queue:x" is refused, and
 * "app:" + "redlock:queue:x" is not.
 */
const char *rl_reserved_key(const char *prefix, size_t prefix_len, const char *resource, size_t len);

/*
 * Release and extend value's hold of resource: a compare-and-delete (or
 * compare-and-PEXPIRE) on every node. A release that a node's connection
 * lost unanswered (queued, in flight, or its reply lost) goes again on that
 * node's next connection, even after its result is collected: the node
 * frees the key then, not at its ttl; its vote in the result stays the
 * failure. An extension is not sent again.
 */
int rl_begin_release(rl_client *c, const char *resource, size_t len, const char *value);
int rl_begin_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms);

/*
 * A quiet release: the same compare-and-delete as rl_begin_release, but it
 * wakes nobody (see "Hand-off"): no message is published and the queue of
 * waiters is left as it is, as for a failed acquire's cleanup. For giving
 * back a lock that was only just taken and never used (the locks of a batch
 * that did not get every resource): a waiter of that resource woken by it
 * would only race for it again, and one that is this client itself would
 * retry at once, hearing its own release. Waiters of the resource learn of
 * it by polling.
 */
int rl_begin_release_quiet(rl_client *c, const char *resource, size_t len, const char *value);

/*
 * A fenced acquire (docs/design.md, "Fencing tokens"): the same lock, plus a
 * token in rl_result.token, strictly greater than every token granted for
 * the resource before this grant began, as long as the nodes keep their
 * data. Two rounds: SET NX PX with an INCR of the counter key (the lock's
 * key followed by ":fence"; it never expires), then a commit that raises
 * the counter to the token on every node that still holds our value. The
 * grant stands only if the commit reaches a quorum; if it does not, the
 * lock is released like any failed acquire and status says why (NOT_HELD:
 * our value was gone from too many nodes; UNAVAILABLE; TIMEOUT: no validity
 * left). elapsed_ms covers both rounds, and validity_ms is what was left
 * at the commit's decision.
 * Counters are exact up to 2^63-1, the end of Redis' INCR: a node whose
 * counter is there, or holds anything but a positive integer (another type,
 * "0", "-5", "abc"), writes nothing and votes as an error whose text names
 * the counter key and what it holds ("fence counter is at its end: ...",
 * "fence counter is not a positive integer: ..."). With a quorum of such
 * nodes no fenced lock is granted; plain locks are not affected.
 */
int rl_begin_acquire_fenced(rl_client *c, const char *resource, size_t len, int ttl_ms);

/*
 * A waiter's acquire (see "Hand-off"): the same lock as rl_begin_acquire;
 * refused on a node, the client joins that node's queue of waiters for the
 * resource (granted, it leaves it). A node whose last release by this
 * client woke a waiter of another client refuses it, the lock free or not,
 * until that waiter has attempted; where this client was the one woken and
 * someone took the lock first, it goes back to the queue's front. Use it
 * for the attempts made while the resource is watched.
 */
int rl_begin_acquire_queued(rl_client *c, const char *resource, size_t len, int ttl_ms);

/*
 * Semaphores (docs/semaphore.md; the argument in docs/design.md,
 * "Semaphores"): at most limit holders of resource at once. Slot k (1 to
 * limit) of resource is an ordinary lock on the key
 *     "redlock:slot:" .. k .. ":" .. prefix .. resource
 * and a holder holds one slot on a quorum. An acquire sends every node the
 * slots in a random order; each node takes one free slot (SET NX PX) and
 * answers its number: the first free in that order, or for a waiter whose
 * turn it is, the one of its place (docs/design.md, "Semaphores"). The slot that reaches a quorum of votes is
 * held, with validity as for a lock, and rl_result.slot says which; the
 * other slots the acquire set are released in its tail (a node that had not
 * answered, once it answers). When no slot can
 * reach a quorum any more, everything set is released (as after a failed
 * acquire) and status is BUSY (the nodes that refused or chose other slots
 * leave no slot a quorum) or UNAVAILABLE; a waiter's acquire (ticket > 0)
 * is decided so only once every node has answered or the node timeout has
 * passed. ticket > 0: a waiter's acquire,
 * which joins the nodes' queues of waiters of resource on refusal (see
 * "Hand-off": the channels are resource's, so a release of any slot wakes
 * the waiter of the semaphore whose turn it is; watch resource); ticket is
 * its place, the same in all its attempts of one wait: rl_wall_ms() when
 * the wait began, below 9e12 (NaN, negative or larger: RL_ERR). 0: not a
 * waiter. While waiters are queued, a node gives a
 * free slot only to those whose turn it is, lowest ticket first, and to a
 * caller outside the queue only when more slots are free than waiters
 * queued. Mixing locks and
 * semaphores on one resource, or semaphores of different limits, is misuse:
 * nothing checks it. limit from 1 to RL_MAX_LIMIT, and limit * (key length
 * + 24) at most RL_MAX_SLOT_KEYS (the acquire names every slot's key);
 * RL_ERR otherwise.
 */
int rl_begin_acquire_slot(rl_client *c, const char *resource, size_t len, int limit, int ttl_ms, double ticket);

/*
 * The release (kind RL_OP_RELEASE; it wakes the semaphore's waiters) or the
 * extension (RL_OP_EXTEND, to ttl_ms; ignored by a release) of slot of
 * resource held with value: the lock calls on the slot's key. RL_ERR for a
 * kind that is neither, or a slot not from 1 to RL_MAX_LIMIT.
 */
int rl_begin_on_slot(rl_client *c, int kind, const char *resource, size_t len, int slot, const char *value,
                     int ttl_ms);

/*
 * A shared (read) hold of resource (docs/design.md, "Shared holds"): granted
 * on a node while no writer holds the resource there and no waiting writer
 * has marked its intent; any number of shared holds go together, and
 * exclude every exclusive acquire (rl_begin_acquire and the others, ours or
 * any Redlock client's SET NX) until the last has ended. Decided at quorum
 * like any acquire (BUSY: a writer holds it, or one waits). The value
 * (rl_result.value) ends with 's' (never hex): rl_begin_extend,
 * rl_begin_release, a failed acquire's cleanup and keep-alive see from it
 * that it is a shared hold, and run the shared scripts. A shared hold has
 * no fencing token. Beside the lock's key, a node keeps the readers under
 * "redlock:readers:" .. key and a waiting writer's mark under
 * "redlock:writer-intent:" .. key: a writer that waits as a queued waiter
 * (rl_begin_acquire_queued) sets it, for its ttl, while readers hold, and
 * new shared holds are refused while it stands; its grant deletes it.
 */
int rl_begin_acquire_shared(rl_client *c, const char *resource, size_t len, int ttl_ms);

/*
 * Drive the I/O until at least one operation has finished or timeout_ms has
 * passed (0: do what is ready and return; < 0: no limit). Return the number of
 * finished operations waiting to be collected.
 */
int rl_run(rl_client *c, int timeout_ms);

/*
 * rl_run with a deadline instead of a timeout, for a program that schedules
 * its own work (holds, retries) between operations: drive the I/O until at
 * least one operation has finished, a release is heard on any resource this
 * client watches (rl_heard(c, NULL, 0) moves), or rl_now_ms() reaches
 * deadline_ms (already past, or NaN: do what is ready and return; HUGE_VAL:
 * no limit). The deadline is
 * kept to the microsecond (a timerfd among the client's descriptors, made
 * on the first call), where rl_run's timeout counts whole milliseconds and
 * the event loop may wait one more. Return the number of finished
 * operations waiting to be collected, or RL_ERR in a forked child.
 */
int rl_run_until(rl_client *c, double deadline_ms);

/* Copy the oldest finished operation into *out (out NULL: drop it) and
 * forget it. Return 1 if one was handed back, 0 if none had finished. A failed acquire is handed back once
 * its cleanup is written: if a node's socket has no room for it yet, this
 * drives the I/O until it has (see the top of this file). */
int rl_collect(rl_client *c, rl_result *out);

/* Drive the I/O until operation id has finished (a failed acquire: and its
 * cleanup is written), copy it into *out (out NULL: drop it) and forget it.
 * Return RL_OK, or RL_ERR if id is not an operation in flight. */
int rl_wait(rl_client *c, int id, rl_result *out);

/* Keep serving connections (reconnects, late replies) for ms milliseconds
 * without starting anything: a sleep that keeps the client alive. */
void rl_sleep(rl_client *c, int ms);

/* Blocking forms: begin, then wait. Return RL_OK with the verdict in
 * out->status (RL_STATUS_OK, RL_STATUS_BUSY, ...), or RL_ERR / RL_ERR_FULL
 * when the operation could not start (reason in rl_client_errstr; *out
 * untouched). */
int rl_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out);
int rl_acquire_fenced(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out);
int rl_acquire_queued(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out);
int rl_acquire_shared(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out);
int rl_release(rl_client *c, const char *resource, size_t len, const char *value, rl_result *out);
int rl_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms,
              rl_result *out);
int rl_acquire_slot(rl_client *c, const char *resource, size_t len, int limit, int ttl_ms, double ticket,
                    rl_result *out);
int rl_on_slot(rl_client *c, int kind, const char *resource, size_t len, int slot, const char *value, int ttl_ms,
               rl_result *out);

/*
 * Hand-off to waiters. A release that deletes the key wakes waiters, from
 * inside the release script (so only a release that deleted does), on every
 * node:
 *   - the oldest waiter in the node's queue of waiters for the key, a list
 *     of waiter ids under "redlock:queue:" .. key (key = prefix .. resource)
 *     that waiters join with rl_begin_acquire_queued: one message "1" on its
 *     own channel "redlock:wake:" .. id .. ":" .. key. A queued waiter that
 *     no longer listens there (gone, or given up) is dropped and the next
 *     one tried, at most 8 per release. A waiter of another client woken
 *     has its turn over the releasing client: for 100 ms or until it
 *     attempts, whichever is first, the node refuses the releasing
 *     client's waiter attempts (rl_begin_acquire_queued; a first attempt,
 *     rl_begin_acquire, is no waiter's); one that no longer listens has no
 *     turn. The queue expires a minute after
 *     the last refused attempt of a waiter in it. It takes at most 1024
 *     waiters: a waiter that finds it full, longer (written by others) or
 *     not a list is not queued, touches nothing, and hears the broadcast
 *     below; the lock works the same whatever the queue's key holds.
 *   - with no queued waiter woken (none queued, or 8 that no longer
 *     listen), every client listening on the channel
 *         "redlock:released:" .. key
 *     a message holding their number (the competition a woken waiter faces).
 * Nobody listening, nothing is published. A failed acquire's cleanup (the
 * release of a loser's key on a minority) and a quiet release
 * (rl_begin_release_quiet) wake nobody. Inside nginx too; a
 * user whose ACL does not allow the queue goes straight to the broadcast, one
 * that does not allow the channels still releases, without waking anyone,
 * and a subscriber it cannot open is retried like a node that is
 * down. A client hears those messages for the resources it
 * watches, over subscriber connections of its own: one per node, separate
 * from the command connections, opened on the first rl_watch (AUTH, with the
 * URL's user, when the URL has a password), then kept open for the client's
 * life, unsubscribed from a resource once nobody watches it (or
 * RL_WATCH_LINGER_MS later: rl_unwatch_won). A subscriber
 * connection that fails or is lost is opened again, while anything is
 * watched, after the reconnect backoff (reconnect_min_ms doubling to
 * reconnect_max_ms, started over by a confirmed SUBSCRIBE); meanwhile that
 * node sends no wake-ups, and nothing ever waits for it. The engine decides
 * all of this (rl_engine_watch, the subscriber links): the libev client
 * and the nginx hub only move the bytes. Messages are read
 * whenever the client's loop runs (any call that drives it). Only a
 * message of the release's form counts: on the resource's channel a
 * positive decimal number (1 to 9 digits, no leading zero), on the wake
 * channel "1"; any other message is ignored. A frame longer than 64 KB plus
 * the longest channel name watched ends its subscriber connection as soon
 * as that much of it is in (it is not buffered whole), like any failure.
 *
 * A waiter without lost wake-ups takes the count BEFORE each attempt:
 *     rl_watch(c, r, len);
 *     for (;;) {
 *         unsigned seen = rl_heard(c, r, len);
 *         ... one attempt (rl_acquire_queued); stop if it acquired ...
 *         rl_sleep_until(c, r, len, seen, delay_ms);
 *     }
 *     rl_unwatch(c, r, len);
 * A release heard during the attempt makes the sleep return at once.
 * Anyone who may PUBLISH on a node can send a message of the release's
 * form: bound the attempts made on wake-ups between two polls (lua/redlock
 * makes at most 4 per delay of its policy). A message can still be missed
 * (a subscriber connection down or not yet subscribed, a holder that uses
 * another library and does not publish, a key that expired): keep delay_ms
 * a poll interval, as without hand-off.
 * Every node publishes, so one release may count up to N times.
 */

/* Listen for releases of resource: one more waiter (watches nest; the first
 * subscribes, connecting the subscriber connections if they are not yet).
 * Return RL_OK, or RL_ERR (an empty or too long resource, out of memory)
 * with the reason in rl_client_errstr. */
int rl_watch(rl_client *c, const char *resource, size_t len);

/* Undo one rl_watch; the last one unsubscribes. An unwatched resource is
 * ignored. */
void rl_unwatch(rl_client *c, const char *resource, size_t len);

/* rl_unwatch by a waiter whose wait ended with what it waited for taken
 * (the acquire that won left the nodes' queues). The last one leaves the
 * resource subscribed for RL_WATCH_LINGER_MS more (until the first call
 * that drives the client after that): a waiter that watches it
 * again within that time (a worker that locks the same resource in a loop)
 * subscribes nothing, and its count of releases heard goes on from where it
 * was. Nothing heard meanwhile counts, and a wake-up from a queue that
 * still holds this client (its leave not yet there) ends the linger at once,
 * so that the node passes the turn to the next waiter. Use rl_unwatch after
 * a wait that failed: this client may still be in a queue, and a listener
 * that does not wait would hold up the waiters behind it. lua/redlock uses
 * it for a semaphore's waits only: a lock's releaser that locks again at
 * once gives a head start to the waiter its release woke, and a lingering
 * subscription would hear that release's own broadcast and end it. */
void rl_unwatch_won(rl_client *c, const char *resource, size_t len);
#define RL_WATCH_LINGER_MS 500

/* The number of release messages heard for resource while it has been
 * watched (it starts at 0 on the first rl_watch, or goes on after a linger,
 * see rl_unwatch_won; 0 for a resource not watched). resource NULL: every message heard by the client, for any
 * resource (lock_many waits on that). Wraps around; compare, never order. */
unsigned rl_heard(const rl_client *c, const char *resource, size_t len);

/* How many clients (this one included) listened for releases of resource
 * when the last one heard was published: the waiters a woken waiter competes
 * with (1 when it was woken from the queue, alone). resource NULL: the most
 * over every resource watched. 0: unknown. */
int rl_heard_listeners(const rl_client *c, const char *resource, size_t len);

/* rl_sleep, returning early once rl_heard(c, resource, len) differs from
 * heard (at once if it already does). Return 1 if it returned for a
 * release, 0 if ms passed (ms <= 0: serve what is ready, then return). */
int rl_sleep_until(rl_client *c, const char *resource, size_t len, unsigned heard, int ms);

/* Subscriber connections up (0 until the first rl_watch). */
int rl_client_listening(const rl_client *c);

/*
 * The engine: the Redlock algorithm without I/O and without a clock.
 *
 * An rl_engine does everything an rl_client does except move bytes and read
 * the time: operations and their phases (the round, then the cleanup after
 * a failed acquire), votes, quorum and validity, and per node a command
 * stream (the commands awaiting replies, the bytes to send, the reply
 * parser, AUTH/SELECT/INFO on a fresh connection, the NOSCRIPT fallback, the
 * check of a stream whose replies fell out of step, the stall watchdog,
 * connect deadlines and reconnect backoff), and hand-off's subscriptions
 * (what is watched, per node a subscriber stream: AUTH, SUBSCRIBE and
 * UNSUBSCRIBE as watches come and go, the messages parsed and counted, its
 * reconnect backoff; see "Hand-off"). A *driver* owns the sockets and
 * the clock; every call that can change anything takes now_ms, a reading of
 * a monotonic clock in milliseconds (rl_now_ms, inside nginx too), and
 * the engine never calls back into the driver. rl_client is the engine with
 * a libev driver; inside nginx, lua/redlock drives one over cosockets.
 *
 * Links: the engine asks for up to two connections per node, each a *link*.
 * With N = rl_engine_nodes(), link i (0 .. N-1) is node i's command
 * connection, link N + i its subscriber connection (asked for once
 * something is watched: rl_engine_watch). A node that is a Redis Cluster
 * (redis-cluster://host:port+host:port, see rl_client_new) has more: each
 * master of it (each *shard*) gets links 2N + 2k (commands) and
 * 2N + 2k + 1 (its subscriber), k counting every cluster node's shards as
 * the engine learns of them, so rl_engine_links() grows (to 2N + 2 *
 * RL_MAX_SHARDS at most); link i then serves only to read the cluster's
 * map. Once RL_MAX_SHARDS shards are made, a master at a new address takes
 * over a shard that no map names any more and that owes nothing (its
 * links keep their numbers): the engine first asks the driver to close
 * both of that shard's links (RL_WANT_CLOSE) and, until the driver takes
 * that, refuses what it reports of them. So a link's address may change:
 * read it again (rl_engine_node_host/port/tls/tls_name) each time the
 * engine asks a shard's link to connect. Every rl_engine_node_* call below
 * that takes "node" takes a link; every kind is driven alike: where it
 * connects is rl_engine_node_host/port/tls of the link. A
 * subscriber link is always a fresh connection (the engine sends AUTH
 * first), is never clean to detach, has no unanswered commands and ignores
 * rl_engine_node_unsent; read it whenever it is open.
 *
 * A driver's loop:
 *   - after every call into the engine, for each link rl_engine_next_wanting()
 *     hands out, take rl_engine_node_wants(): on RL_WANT_CLOSE close
 *     the link's socket (its commands are already answered); on
 *     RL_WANT_CONNECT open a connection and report rl_engine_node_connected or
 *     rl_engine_node_down; on RL_WANT_WRITE write rl_engine_node_output and
 *     report rl_engine_node_wrote (writing everything wanted before waiting
 *     for I/O sends each node one write for all commands begun meanwhile);
 *   - feed what a link sends to rl_engine_node_feed; report a connection that
 *     fails or ends with rl_engine_node_down;
 *   - wait for I/O no later than rl_engine_deadline(), then call
 *     rl_engine_advance (after feeding what has arrived);
 *   - collect finished operations with rl_engine_collect or rl_engine_take
 *     (rl_client first writes a failed acquire's cleanup and lets held
 *     commands go out: rl_engine_cleanup_unwritten, rl_engine_held_until;
 *     any driver can do the same);
 *   - a driver that wakes sleepers on a heard release (rather than looking
 *     at rl_engine_heard after every feed) takes rl_engine_heard_next after
 *     feeding a subscriber link.
 * Node indexes are 0 .. rl_engine_nodes()-1 in server order. An engine is not
 * thread-safe.
 */
typedef struct rl_engine rl_engine;

/* What the engine wants of the driver for one node (rl_engine_node_wants). */
enum {
    RL_WANT_WRITE = 1,    /* bytes wait in rl_engine_node_output */
    RL_WANT_CONNECT = 2,  /* open a connection, then report connected or down */
    RL_WANT_CLOSE = 4     /* the engine dropped the connection: close the socket */
};

/* Create an engine for the nodes named by urls (as rl_client_new takes them;
 * nothing is looked up or connected). opts may be NULL. On error NULL, with
 * the reason in err. */
rl_engine *rl_engine_new(const char *const *urls, int nurls, const rl_options *opts,
                         char *err, size_t errlen);

/* Free the engine; operations in flight are abandoned. NULL is ignored. */
void rl_engine_free(rl_engine *e);

/* Number of nodes; node i's name (its URL without password); where to
 * connect: the host (or, for unix:// nodes, the socket path) and the TCP
 * port (0 for a unix socket). i may be a link: its node's, or for a
 * shard's link (2N and on) that shard's ("redis://host:port (shard of
 * node n)"). */
int rl_engine_nodes(const rl_engine *e);
const char *rl_engine_node_name(const rl_engine *e, int i);
const char *rl_engine_node_host(const rl_engine *e, int i);
int rl_engine_node_port(const rl_engine *e, int i);
/* 1 if node i is a rediss:// node: the driver must speak TLS to it. */
int rl_engine_node_tls(const rl_engine *e, int i);
/* For a rediss:// node (or link), the name its certificate must be for and
 * the SNI, unless tls.server_name says otherwise: its host as given, or for
 * a shard the map made at an address whose master announces a hostname
 * (cluster-preferred-endpoint-type hostname), that hostname (the driver
 * still connects to rl_engine_node_host). NULL for a unix socket. */
const char *rl_engine_node_tls_name(const rl_engine *e, int i);

/* Votes needed for a decision. */
int rl_engine_quorum(const rl_engine *e);

/* This client's id in the queues of waiters (RL_WAITER_ID_LEN random hex
 * characters, drawn again in a forked child, so that workers forked from
 * one engine differ): a driver's subscriber listens on its wake channels. */
const char *rl_engine_waiter_id(const rl_engine *e);

/* The reason the last rl_engine_begin_*, rl_engine_take or rl_engine_watch
 * call failed. */
const char *rl_engine_errstr(const rl_engine *e);

/* Start an operation at now_ms, as rl_begin_* do (same ids, same errors):
 * its command is queued on every node; a node that is down votes against
 * at once. */
int rl_engine_begin_acquire(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms);
int rl_engine_begin_acquire_fenced(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms);
int rl_engine_begin_acquire_queued(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms);
int rl_engine_begin_acquire_shared(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms);
int rl_engine_begin_release(rl_engine *e, const char *resource, size_t len, const char *value,
                            double now_ms);
int rl_engine_begin_release_quiet(rl_engine *e, const char *resource, size_t len, const char *value,
                                  double now_ms);
/* A semaphore's acquire, and a release or extension of a slot (see
 * rl_begin_acquire_slot, rl_begin_on_slot). ticket > 0: a waiter's acquire,
 * placed in the nodes' queues by ticket (rl_begin_acquire_slot); 0: no
 * queue. */
int rl_engine_begin_acquire_slot(rl_engine *e, const char *resource, size_t len, int limit, int ttl_ms,
                                 double ticket, double now_ms);
int rl_engine_begin_on_slot(rl_engine *e, int kind, const char *resource, size_t len, int slot, const char *value,
                            int ttl_ms, double now_ms);
int rl_engine_begin_extend(rl_engine *e, const char *resource, size_t len, const char *value,
                           int ttl_ms, double now_ms);

/* Bit k set: link k wants something of the driver (rl_engine_node_wants);
 * links 0 .. 31 only (rl_engine_next_wanting covers every link). */
unsigned rl_engine_wanting(const rl_engine *e);

/* The number of links now (2N, plus two per shard of the cluster nodes:
 * it never shrinks; a shard reused for another master keeps its links, at
 * that master's address, see "Links"), and the first link after link after (-1: from link 0)
 * that wants something of the driver, or -1 if none does. */
int rl_engine_links(const rl_engine *e);
int rl_engine_next_wanting(const rl_engine *e, int after);

/* What node wants: RL_WANT_* bits. CONNECT and CLOSE are handed out once
 * (this call takes them); WRITE stays set while output waits. Do CLOSE
 * before CONNECT. A CONNECT's timeout counts from this call (at the latest
 * time the engine was given): until the driver takes it, the connect has
 * not begun and cannot time out. */
int rl_engine_node_wants(rl_engine *e, int node);

/* Ask for a connection to node now (RL_WANT_CONNECT), even if it is in its
 * reconnect backoff: to connect ahead of the first operation. */
void rl_engine_node_open(rl_engine *e, int node, double now_ms);

/* The connection the engine asked for is up. fresh: a new connection (the
 * engine sends AUTH/SELECT/INFO and loads its scripts before anything else);
 * 0: a pooled connection that rl_engine_node_detach called clean. Return
 * RL_OK, or RL_ERR if no connection was asked for (close it). */
int rl_engine_node_connected(rl_engine *e, int node, int fresh, double now_ms);

/* The connection asked for is made and its TLS handshake (rediss://) begun:
 * report rl_engine_node_connected once it is done. The connect timeout
 * covers the handshake; when it passes now, the reason says the handshake
 * timed out, and rounds that time out meanwhile say it is under way. */
void rl_engine_node_handshaking(rl_engine *e, int node);

/* The node's connection failed or ended; why says how ("connect failed:
 * ...", "connection lost: ..."). Its commands fail with why, and the
 * engine asks for a new connection after its reconnect backoff. */
void rl_engine_node_down(rl_engine *e, int node, const char *why, double now_ms);

/* A connection made earlier and never driven since (still connecting or in
 * its TLS handshake: a program that runs the driver only during its calls)
 * was found ended by its server at the driver's first look after a gap in
 * its polls (the server's idle timeout outran the handshake). With nothing
 * queued for the node, it is idle again, as if never connected: no backoff,
 * the next command connects at once; otherwise as rl_engine_node_down. */
void rl_engine_node_closed_unused(rl_engine *e, int node, const char *why, double now_ms);

/* The driver is done with the node's connection for now (a cosocket put
 * back in its pool). Return 1 if the connection is clean (set up, every
 * command answered, nothing unwritten) and may be reused; 0 if it must be
 * closed: its commands are then answered with an error. Either way the
 * engine forgets the connection, and the next command asks for one, with no
 * backoff (a release among those answered asks at once: it goes again on
 * the next connection, see rl_begin_release). */
int rl_engine_node_detach(rl_engine *e, int node, double now_ms);

/* The bytes to write to node now (*data valid until the next call on e),
 * and how many of them were written. */
size_t rl_engine_node_output(rl_engine *e, int node, const char **data);
void rl_engine_node_wrote(rl_engine *e, int node, size_t n, double now_ms);

/* Bytes node sent. Return RL_OK, or RL_ERR if the engine dropped the
 * connection on the way (garbage, a reply nobody asked for, a refused AUTH,
 * a stream out of step): feed nothing more from it; the link then wants
 * RL_WANT_CLOSE, and is closed there, once, like any other. */
int rl_engine_node_feed(rl_engine *e, int node, const char *data, size_t len, double now_ms);

/* Optional: on (1), the replies fed from now on waited in their sockets
 * while the driver was not reading (its caller was away, and the first look
 * at the sockets found them ready): when each came is unknown, and until
 * the driver says 0 they are not timed (rl_node_stats.reply), only used. A
 * driver that reads whenever bytes come never calls it. */
void rl_engine_untimed_reads(rl_engine *e, int on);

/* Optional: bytes written to node but not yet taken by its end (the send
 * queue, SIOCOUTQ), so the stall watchdog can tell a slow link from a hung
 * node. A driver that cannot tell never calls it. */
void rl_engine_node_unsent(rl_engine *e, int node, long long bytes);

/* Nodes (bit i: node i) that have stopped answering (suspect: they are
 * sent nothing but a probe, and their votes fail at once as timeouts) and
 * whose sockets are due a look at now_ms: at most once per node_timeout
 * each. A driver that reads its sockets only while it waits for replies
 * (rl_client) reads these without waiting before it begins an operation,
 * so that a node answering again is heard, and votes, even when every
 * round is decided at once. A driver that always reads (nginx) need not
 * call it. */
unsigned rl_engine_suspects_due(rl_engine *e, double now_ms);

/* Commands sent to node whose replies have not come yet (its connection's
 * setup included): a driver that reads only while replies are due stops
 * reading at 0. */
int rl_engine_node_unanswered(const rl_engine *e, int node);

/* Why node is down, or its last connection ended. */
const char *rl_engine_node_errstr(const rl_engine *e, int node);

/* Hand-off through the engine (see "Hand-off"; rl_watch and the like are
 * these on rl_client's engine). rl_engine_watch: one more waiter of
 * resource (watches nest); the first subscribes on every node, asking for
 * the subscriber links that are not up. Return the watch id (>= 0, the same
 * for every waiter of resource while it is watched), or RL_ERR (empty or too
 * long, out of memory; the reason in rl_engine_errstr). rl_engine_unwatch undoes one; the last unsubscribes
 * and forgets what was heard; rl_engine_unwatch_won is rl_unwatch_won (a
 * lingering watch keeps its id, and rl_engine_heard_next never hands it out). rl_engine_heard and rl_engine_heard_listeners
 * are rl_heard and rl_heard_listeners. rl_engine_listening: subscriber
 * links up. */
int rl_engine_watch(rl_engine *e, const char *resource, size_t len, double now_ms);
void rl_engine_unwatch(rl_engine *e, const char *resource, size_t len, double now_ms);
void rl_engine_unwatch_won(rl_engine *e, const char *resource, size_t len, double now_ms);
unsigned rl_engine_heard(const rl_engine *e, const char *resource, size_t len);
int rl_engine_heard_listeners(const rl_engine *e, const char *resource, size_t len);
int rl_engine_listening(const rl_engine *e);

/* The id of a watch that heard a release since it was last handed out here
 * (each watch once, whatever it heard meanwhile), or -1 if none has: for a
 * driver that wakes the sleepers of a resource when its release is heard.
 * *broadcast (may be NULL): 1 if a message came on the resource's channel
 * (every waiter competes: wake them all), 0 if only on this client's wake
 * channel (a queue picked this client: wake one). */
int rl_engine_heard_next(rl_engine *e, int *broadcast);

/* The earliest moment rl_engine_advance has something to do (an operation's
 * node timeout, a connect deadline, a reconnect, a watchdog look), on the
 * driver's clock; -1 if nothing is scheduled. */
double rl_engine_deadline(const rl_engine *e);

/* Do everything due by now_ms. */
void rl_engine_advance(rl_engine *e, double now_ms);

/* Copy the oldest finished operation into *out (out NULL: drop it) and
 * forget it: 1, or 0 if none has finished. */
int rl_engine_collect(rl_engine *e, rl_result *out);

/* Copy operation id into *out (out NULL: drop it) and forget it if it has
 * finished: 1; 0 if it is still in flight; RL_ERR if id is not an operation
 * in flight. */
int rl_engine_take(rl_engine *e, int id, rl_result *out);

/* Finished operations not yet collected, operations still in flight (not
 * decided), and decided operations whose tail is still running (replies
 * owed by nodes slower than the quorum, or a failed acquire's cleanup). A
 * driver that stops (closes its connections) with tails left should first
 * drive them until rl_engine_tails is 0 or a node timeout has passed. */
int rl_engine_done(const rl_engine *e);
int rl_engine_inflight(const rl_engine *e);
int rl_engine_tails(const rl_engine *e);

/* Nodes holding commands not written yet: releases kept for their next
 * connection (a failed acquire's cleanup whose SET may have run there), or
 * commands queued and not yet written (behind a connection still being made
 * or set up: a tail whose node timeout passed before its node could take
 * it; or on a connection that has no room for them yet). A driver about
 * to stop should first let them go out, for a bounded time (the libev
 * client: the reconnect backoff's cap plus the connect timeout). */
int rl_engine_unwritten(const rl_engine *e);

/* Nodes that owe replies to commands written on a connection that is set
 * up and answering (not suspect): a node still working through a batch.
 * Not a node whose bytes have ended no reply for stall_reset_ms since the
 * oldest command it owes was sent (one reply that does not end: it would
 * not answer what follows it in time). A
 * driver about to close should first let them answer, for a bounded time:
 * a node that finds its client's socket closed while it answers drops the
 * commands it had not read yet (the releases at the end of a batch). */
int rl_engine_unanswered(const rl_engine *e);

/* For a driver about to close: every acquire begun and not collected (in
 * flight, or decided and not taken) is abandoned; its result is dropped.
 * Where its command has not gone out yet (not a byte of it written to a
 * plain node) it is taken back and never sent; where it went (or may have:
 * a Redis Cluster node's goes out anyway), it gets a failed acquire's
 * cleanup, a quiet release, which is a tail (rl_engine_tails): the driver
 * then serves the tails, and what is not written, as before closing.
 * Acquires collected, their tails, and other operations (releases,
 * extensions) are left as they are. */
void rl_engine_abandon(rl_engine *e, double now_ms);

/* What a driver asks before it hands a result back, so that it gives the
 * guarantees rl_client gives (rl_wait, rl_collect):
 *   - rl_engine_finished: 1 if operation id is decided (rl_engine_take
 *     would hand it back), 0 if still in flight, RL_ERR if id names no
 *     operation in flight;
 *   - rl_engine_first_done: the id of the operation rl_engine_collect would
 *     hand back next, or -1 if none is finished;
 *   - rl_engine_cleanup_unwritten: 1 while operation id is a failed acquire
 *     whose cleanup (the release on the nodes its SET may have reached) is
 *     not all written: some of it still waits in rl_engine_node_output for a
 *     connection that is up (its socket full: the node works through a
 *     backlog) or being set up. 0 otherwise: written, or its connection
 *     ended (the release is then kept for the node's next connection). A
 *     driver that hands a failed acquire back only at 0, writing and reading
 *     meanwhile, never leaves a release in its own output while the SET it
 *     undoes is on the node, even if its caller stops driving it at once.
 *     This ends: the node takes the bytes, or takes none for stall_reset_ms
 *     and the watchdog resets its connection, or the cleanup's node timeout
 *     takes back what waits behind a connection's setup;
 *   - rl_engine_held_until: for a decided operation id, the latest moment
 *     worth driving the engine so that a command of it held behind the
 *     setup of a connection begun less than a node timeout before still
 *     goes out (the setup's replies are due by then); 0 if there is none.
 *     A driver whose blocking call returns once the result is in (and may
 *     not be called again for long) drives the engine until then first. */
int rl_engine_finished(const rl_engine *e, int id);
int rl_engine_first_done(const rl_engine *e);
int rl_engine_cleanup_unwritten(rl_engine *e, int id);
double rl_engine_held_until(const rl_engine *e, int id);

/*
 * Keep-alive: the rules, decided by the engine and nowhere else (the keeper
 * below and lua/redlock inside nginx only drive an engine that keeps locks).
 * A kept lock has a ttl, a margin (0 to ttl - 1 ms) and the end of its
 * validity (valid_until, on the driver's clock).
 *   - It is extended (to its ttl) every third of ttl - margin, counted from
 *     the last successful extension's answer (from the add, at first), or
 *     halfway to the moment it would be lost when that is sooner than two
 *     such thirds away (a grant or extension that took long); its
 *     validity is then the extension's: its validity_ms from its decision
 *     (when it began + elapsed_ms).
 *     Extensions are begun at most once every 10 ms: those falling due in
 *     between go out together, at most 10 ms late.
 *   - An extension that fails (unavailable, timeout) is tried again after
 *     min(ttl / 10, 100) ms, until the lock is lost.
 *   - The lock is *lost* when an extension finds our value gone from
 *     enough nodes (not held), or once valid_until - margin has passed
 *     without a successful extension (in flight or not).
 *   - The owner extended it itself (update: an extension to ttl begun at
 *     started): from then on keep-alive extends it to that ttl. If one of
 *     keep-alive's own extensions was in flight then, or began after the
 *     owner's did, nodes may hold either ttl: the shorter validity counts,
 *     and the lock is extended again at once (one of keep-alive's that
 *     comes back with the old ttl does the same). An owner's extension
 *     that comes back after the lock turned lost for want of time takes it
 *     back (held, extended again at once) if it leaves validity above the
 *     margin; a lock whose value was found gone stays lost.
 *   - A dropped lock (its owner let go of it without releasing it) is
 *     released by the engine; releases of kept locks are at most 256 in
 *     flight at once, the rest wait their turn.
 * The engine's extensions and releases are ordinary rounds: rl_engine_advance
 * begins them when due (rl_engine_deadline counts them), they go out with
 * everything else, and their results update the schedule inside the engine:
 * rl_engine_collect and rl_engine_take never hand them out.
 */

/* Keep-alive states (rl_engine_keep_state, rl_keeper_state). */
enum {
    RL_KEEP_HELD = 1,      /* extended on schedule; valid_until is in the future */
    RL_KEEP_LOST = 2,      /* not held any more, or validity ran out */
    RL_KEEP_RELEASED = 3   /* released through the keeper (rl_engine_keep_release_all) */
};

/* Keep a held lock from now_ms on. valid_until_ms: when its validity ends
 * (the clock reading before the acquire + elapsed_ms + validity_ms). Return an id (>= 0;
 * the id of a lock removed or dropped names nothing from then on: it comes
 * back only after its place has been used 1,024 times more) or RL_ERR
 * with the reason in rl_engine_errstr (resource empty, value not
 * RL_VALUE_LEN long, ttl <= 0, margin not from 0 to ttl - 1, valid_until
 * not finite, 2,097,152 locks kept already, out of memory). */
int rl_engine_keep_add(rl_engine *e, const char *resource, size_t len, const char *value, int ttl_ms,
                       double valid_until_ms, int margin_ms, double now_ms);
/* The same for a semaphore's slot held (slot 1 to RL_MAX_LIMIT; 0: a lock):
 * its extensions and release are the slot's (rl_begin_on_slot). */
int rl_engine_keep_add_slot(rl_engine *e, const char *resource, size_t len, int slot, const char *value, int ttl_ms,
                            double valid_until_ms, int margin_ms, double now_ms);

/* The state of kept lock id at now_ms (RL_KEEP_*); *valid_until_ms (may be
 * NULL) gets the end of its current validity. RL_ERR for an id removed or
 * dropped. */
int rl_engine_keep_state(rl_engine *e, int id, double *valid_until_ms, double now_ms);

/* The owner extended lock id itself: an extension to ttl_ms begun at
 * started_ms that left validity until valid_until_ms (see the rules; after
 * one that failed, valid_until_ms may only lower what the lock had). A lock
 * lost for want of time is held again if valid_until_ms less the margin
 * (and less what one of keep-alive's extensions in flight with a shorter
 * ttl may leave) is still ahead of now_ms. RL_ERR for an unknown id, a lock
 * released, a lost lock that stays lost (its value was found gone, or too
 * little validity is left), a ttl_ms not above the lock's margin, or a
 * valid_until_ms not finite. */
int rl_engine_keep_update(rl_engine *e, int id, int ttl_ms, double started_ms, double valid_until_ms,
                          double now_ms);

/* Stop extending lock id and forget it (its owner releases it). RL_OK, or
 * RL_ERR for an unknown id. */
int rl_engine_keep_remove(rl_engine *e, int id);

/* The owner let go of lock id without releasing it: stop extending it,
 * forget the id, and release the lock (begun by the next rl_engine_advance,
 * due at now_ms). It touches nothing but the schedule (what
 * rl_engine_node_output handed out stays valid), so a finalizer may call it
 * between any two engine calls. RL_OK, or RL_ERR for an unknown id. */
int rl_engine_keep_drop(rl_engine *e, int id, double now_ms);

/* Stop extending lock id without releasing it: it stays HELD until
 * valid_until - margin, then turns LOST; rl_engine_keeping no longer counts
 * it (an exiting nginx worker lets the locks of requests that are gone
 * lapse). RL_OK, or RL_ERR for an unknown id. */
int rl_engine_keep_lapse(rl_engine *e, int id);

/* Release every kept lock (held, lost, or dropped and not yet released);
 * they are RELEASED from now on, their releases begun by rl_engine_advance
 * in turn. Return the number of releases this counts (see below). */
int rl_engine_keep_release_all(rl_engine *e, double now_ms);

/* Releases counted by the last rl_engine_keep_release_all still undecided;
 * *released (may be NULL): those of them a quorum confirmed. */
int rl_engine_keep_releasing(const rl_engine *e, int *released);

/* Kept locks a driver must keep running for: those still extended, and
 * releases not yet decided. */
int rl_engine_keeping(const rl_engine *e);

/* Forget every kept lock: nothing more is extended or released (rounds in
 * flight end unheard). For a driver about to stop. */
void rl_engine_keep_clear(rl_engine *e);

/*
 * Keep-alive in a thread. A keeper owns a thread with its own connections
 * to the same nodes (an rl_client, whose engine keeps the locks by the rules
 * above); it extends the locks handed to it without any help from the
 * calling thread (which may be busy in a long computation or a blocking
 * call). All rl_keeper_* functions are thread-safe, rl_keeper_close
 * included (a call that meets a close from another thread returns as after
 * it); but rl_keeper_free ends k's memory: no call on k may run beside it
 * or come after it. What a kept lock's state is, they read from the
 * engine, under the keeper's mutex.
 * A keeper does not survive fork(): its thread stays in the parent (and may
 * hold the mutex at the fork), its sockets are the parent's. In a forked
 * child, the calls on a keeper made before fork() return at once without
 * touching it: rl_keeper_add and rl_keeper_add_slot refuse (RL_ERR, "this
 * keeper was made before fork(): make a new one in the child"), so do
 * rl_keeper_state, _update, _remove and _drop (RL_ERR); rl_keeper_release
 * returns 0, rl_keeper_stats gives zeros and rl_keeper_free frees nothing
 * (the memory stays allocated until the child exits). Make a keeper in the
 * child.
 */
typedef struct rl_keeper rl_keeper;

/* Start a keeper for the same nodes and options as a client would use.
 * Return NULL with err filled on failure. */
rl_keeper *rl_keeper_new(const char *const *urls, int nurls, const rl_options *opts,
                         char *err, size_t errlen);

/* Stop the keeper's thread and free it. Locks still kept are neither
 * extended nor released any more (rl_keeper_release first releases them).
 * Its connections close as rl_client_free's do, but after rl_keeper_release
 * no later than that call's deadline (so a keeper released and freed waits
 * about timeout_ms in all). NULL is ignored, and so, in a forked child, is a
 * keeper made before fork() (leaked: see above). */
void rl_keeper_free(rl_keeper *k);

/* Do what rl_keeper_free does (the thread stopped, the connections closed
 * within the same bounds), but keep k's memory: every later call returns
 * RL_ERR (rl_keeper_add and _add_slot with "this keeper was closed"),
 * rl_keeper_release returns 0 and rl_keeper_stats gives zeros. For a caller
 * that cannot know whether a call on k is still running further up its
 * stack (code run by a garbage collector's finalizer, say): rl_keeper_free
 * later frees what is left. Closing twice, NULL, or in a forked child a
 * keeper made before fork(), does nothing. */
void rl_keeper_close(rl_keeper *k);

/* Hand a held lock to the keeper (rl_engine_keep_add, on rl_now_ms()):
 * valid_until_ms is rl_now_ms() before the acquire + elapsed_ms +
 * validity_ms. Return an id (>= 0) or RL_ERR with the reason in err (in a
 * forked child, for a keeper made before fork(), always). */
int rl_keeper_add(rl_keeper *k, const char *resource, size_t len, const char *value,
                  int ttl_ms, double valid_until_ms, int margin_ms, char *err, size_t errlen);
/* The same for a semaphore's slot held (rl_engine_keep_add_slot). */
int rl_keeper_add_slot(rl_keeper *k, const char *resource, size_t len, int slot, const char *value,
                       int ttl_ms, double valid_until_ms, int margin_ms, char *err, size_t errlen);

/* The state of kept lock id (RL_KEEP_*); *valid_until_ms (may be NULL) gets
 * the end of its current validity on the monotonic clock. RL_ERR for an
 * unknown (removed or dropped) id. */
int rl_keeper_state(rl_keeper *k, int id, double *valid_until_ms);

/* The caller extended lock id itself (say, to change its ttl): an extension
 * begun at started_ms (rl_now_ms) to ttl_ms that left validity until
 * valid_until_ms (rl_engine_keep_update: it may take a lock lost for want
 * of time back). Return RL_OK, or RL_ERR for an unknown id, a lock that is
 * not held and stays lost, or a ttl_ms not above the lock's margin. */
int rl_keeper_update(rl_keeper *k, int id, int ttl_ms, double started_ms, double valid_until_ms);

/* Stop extending lock id and forget it (the caller releases it).
 * Return RL_OK or RL_ERR for an unknown id. */
int rl_keeper_remove(rl_keeper *k, int id);

/* The caller let go of lock id without releasing it (a lock object that was
 * garbage-collected): stop extending it and release it from the keeper's
 * thread, without waiting; the id is forgotten at once. Never blocks beyond
 * the keeper's mutex, so a finalizer may call it. Return RL_OK or RL_ERR for
 * an unknown id. */
int rl_keeper_drop(rl_keeper *k, int id);

/* Release every lock k still keeps (held, lost, or dropped and not yet
 * released), waiting while the nodes go on deciding releases and at most
 * about timeout_ms once none has been decided for that long (nodes that do
 * not answer), 10 s at most in all (never without bound; a call while the
 * releases an earlier one began are still undecided goes on within the
 * earlier one's 10 s); they are
 * RELEASED from then on (releases not decided by then go on while the
 * keeper lives). For a keeper about to be freed with locks nobody will
 * release otherwise. Return the number of locks a quorum released by then.
 * NULL is ignored (0), and so, in a forked child, is a keeper made before
 * fork(): its locks are the parent's. */
int rl_keeper_release(rl_keeper *k, int timeout_ms);

/* rl_keeper_release for every keeper in this process, all at once, with
 * one timeout_ms. For exit paths and signal-handling threads (not for signal
 * handlers themselves). Return the number of locks released.
 * The first rl_keeper_new registers an exit handler (atexit) that calls this
 * with a 1000 ms bound, so exit() with locks still kept releases them; a
 * second call finds nothing left to release. _exit() and a fatal signal
 * release nothing. In a forked child it releases what the keepers the child
 * made keep; the keepers it inherited are the parent's (their threads and
 * sockets), and are left alone. */
int rl_keeper_release_all(int timeout_ms);

/*
 * Counting (docs/observability.md). The engine counts what it decides, once,
 * whatever drives it: operations by kind and outcome, each node's votes,
 * timeouts and connection events, decision and reply latency as histograms
 * with fixed buckets, and what keep-alive and hand-off did. Counters only
 * grow (from the engine's creation); the gauges (int fields) say how things
 * stand now. Nothing is allocated to count. Resources are never counted
 * apart: however many there are, the counts take the same room.
 *
 * Round kinds (the first index of ops and decision; rl_stats_kind_word):
 * 1 acquire (plain or queued), 2 release (quiet or not), 3 extend, 4 a
 * fenced acquire's grant, 5 its commit (a fenced acquire that is granted
 * counts a grant and a commit; its result is the commit's), 6 a
 * semaphore's acquire (rl_begin_acquire_slot; its release and extend count
 * as 2 and 3). Outcomes are
 * indexed by RL_STATUS_* (rl_status_word), vote states by RL_NODE_* (a vote
 * still pending when its round was decided counts as pending). The rounds
 * keep-alive begins (extensions and releases of kept locks) count in
 * keep_extends and keep_releases, not in ops, and vote like any round.
 */
#define RL_STATS_KINDS 7     /* ops[] and decision[] entries: round kinds 1..6, 0 unused */
#define RL_STATS_OUTCOMES 6  /* indexed by RL_STATUS_* */
#define RL_STATS_STATES 5    /* indexed by RL_NODE_* */
#define RL_STATS_BUCKETS 14  /* histogram buckets: 13 upper bounds (rl_stats_bucket_ms), then +Inf */

/* A latency histogram: count[i] is the number of times at most
 * rl_stats_bucket_ms(i) and above the bound before (not cumulative); the
 * last bucket has no bound. sum_ms: the sum of every time counted. */
typedef struct rl_histogram {
    unsigned long long count[RL_STATS_BUCKETS];
    double sum_ms;
} rl_histogram;

/* One node's counts. */
typedef struct rl_node_stats {
    unsigned long long votes[RL_STATS_STATES]; /* votes at each round's decision, by RL_NODE_* */
    unsigned long long timeouts;     /* operations the node left unanswered past the node timeout (in
                                        the round, its tail, or a failed acquire's cleanup): once each */
    unsigned long long connects;     /* connections asked for (the first included) */
    unsigned long long reconnects;   /* of those, asked for after a connection failed or was reset */
    unsigned long long resets;       /* connections the engine ended (replies out of step, no reply for
                                        stall_reset_ms, a refused setup, a connect timeout, garbage) */
    unsigned long long lost;         /* connections the driver reported failed or lost */
    unsigned long long step_checks;  /* step checks (ECHO of a nonce) sent, suspect nodes' probes included */
    unsigned long long suspected;    /* times the node was found not answering (it became suspect) */
    rl_histogram reply;              /* from a command being queued to its reply (rounds, tails, cleanups;
                                        not those read after waiting unread: rl_engine_untimed_reads) */
    unsigned long long moved;        /* a cluster node: MOVED replies met (the map was refreshed; followed
                                        unless the command had been redirected 5 times) */
    unsigned long long ask;          /* a cluster node: ASK replies met (followed once per command) */
    unsigned long long tryagain;     /* a cluster node: TRYAGAIN replies met (a slot in migration; the
                                        command goes again after a pause, up to 12 times) */
    int up;                          /* gauge: 1 while connected and set up */
    int suspect;                     /* gauge: 1 while suspect (sent nothing but probes) */
} rl_node_stats;

typedef struct rl_stats {
    int nodes;                       /* entries used in node[] */
    unsigned long long ops[RL_STATS_KINDS][RL_STATS_OUTCOMES]; /* rounds decided, by kind and outcome */
    rl_histogram decision[RL_STATS_KINDS]; /* from a round's start to its decision, by kind */
    unsigned long long tails;        /* rounds decided before every node answered (the rest is a tail) */
    unsigned long long cleanups;     /* failed acquires' cleanups begun */
    unsigned long long wakeups;      /* release messages heard (hand-off) */
    unsigned long long keep_extends[RL_STATS_OUTCOMES];  /* keep-alive's extensions, by outcome */
    unsigned long long keep_releases[RL_STATS_OUTCOMES]; /* releases of kept locks (dropped, or release_all) */
    unsigned long long locks_lost;   /* kept locks that turned RL_KEEP_LOST */
    int inflight;                    /* gauge: operations not decided (rl_engine_inflight) */
    int tails_running;               /* gauge: rl_engine_tails */
    int waiters;                     /* gauge: watches not undone (rl_engine_watch calls), every resource */
    int kept;                        /* gauge: kept locks still extended */
    rl_node_stats node[RL_MAX_NODES];
} rl_stats;

/* Copy e's counts into *out (rl_options.no_stats: zeros, with nodes set). */
void rl_engine_stats(const rl_engine *e, rl_stats *out);

/* rl_engine_stats of c's engine, and of k's (the keeper's own connections
 * and rounds: its extensions and releases; thread-safe, under k's mutex). */
void rl_client_stats(const rl_client *c, rl_stats *out);
void rl_keeper_stats(rl_keeper *k, rl_stats *out);

/* The upper bound of histogram bucket i in ms (0.5, 1, 2.5, 5, 10, 25, 50,
 * 100, 250, 500, 1000, 2500, 5000), or -1 for the last (+Inf) and any i out
 * of range. */
double rl_stats_bucket_ms(int i);

/* The word for a round kind (1..RL_STATS_KINDS-1: "acquire", "release",
 * "extend", "fenced", "commit", "slot"), or NULL. */
const char *rl_stats_kind_word(int kind);

/* Monotonic clock in milliseconds (CLOCK_BOOTTIME: it goes on while the
 * machine is suspended, as the nodes' expiries do). */
double rl_now_ms(void);

/* The wall clock in milliseconds since the epoch (CLOCK_REALTIME): a
 * semaphore's waiter's ticket (rl_begin_acquire_slot). */
double rl_wall_ms(void);

/* A uniform random number in [0, 1), from a per-thread generator seeded by
 * getrandom(2): retry jitter that differs between processes started together. */
double rl_random(void);

/* The short stable word for a status ("ok", "busy", "unavailable", "timeout",
 * "not held", "pending") and for a node state ("ok", "taken", "error",
 * "timeout", "pending"). Unknown codes give "invalid". */
const char *rl_status_word(int status);
const char *rl_node_state_word(int state);

/* The version of the library that is running, "MAJOR.MINOR.PATCH": compare
 * it with RL_VERSION to know the library is the one a program was built for. */
const char *rl_version(void);

#ifdef __cplusplus
}
#endif

#endif /* REDLOCK_H */
