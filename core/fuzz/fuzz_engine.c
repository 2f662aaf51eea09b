/* fuzz_engine.c — the engine driven by a script of events read from the input.
 *
 * The input is a header (nodes, URLs with or without AUTH/SELECT, node
 * timeout, quorum, drift, connect timeout, votes waiting for replicas), then events of three bytes:
 * what, an argument, and a clock step (the clock only goes forward). The
 * events begin operations (acquire, fenced acquire, release, extend),
 * connect nodes or let them go down, write what the engine wants written,
 * answer the oldest command written to a node with a fitting reply (or an
 * error, a NOSCRIPT, a reply of the wrong kind), feed arbitrary bytes or
 * canned replies, take results, detach, and advance the clock. (Some
 * events read more bytes: the reply chosen, the arbitrary bytes.)
 *
 * After every event the engine is advanced to the clock and its results are
 * checked (__builtin_trap on a violation):
 *   - a result has a final status; its counts agree with its per-node states;
 *   - OK never without ok >= quorum votes; acquire/extend: validity_ms <= ttl,
 *     and validity_ms > 0 exactly when OK; a token exactly for an OK fenced
 *     acquire;
 *   - every operation's result can be taken once the clock has passed its
 *     bound: begin + node timeout (a NOSCRIPT's EVAL re-send does not move
 *     a round's deadline); a fenced acquire has a second round, the commit,
 *     which starts when the grant is decided (at the latest at the first
 *     advance past begin + node timeout) and ends a node timeout later.
 *   - with a round in flight, rl_engine_deadline is set and no later than a
 *     node timeout from now.
 * At the end the clock runs on until everything is decided and every tail
 * is over (its bytes written), and the engine is freed (LeakSanitizer
 * checks nothing is left). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "redlock.h"

#define CHECK(c)                         \
    do {                                 \
        if (!(c)) __builtin_trap();      \
    } while (0)

#define MAX_OPS 64
#define SENT_CAP 16384
#define QUEUE_CAP 256

/* ---- the input ---- */

static const uint8_t *in;
static size_t in_len, in_at;

static unsigned byte(void) {
    return in_at < in_len ? in[in_at++] : 0;
}

/* ---- commands written to a node, parsed back so that replies can fit ---- */

enum { C_OTHER, C_AUTH, C_SELECT, C_INFO, C_LOAD_RELEASE, C_LOAD_EXTEND, C_LOAD_OTHER, C_ECHO, C_SET,
       C_EVALSHA_RELEASE, C_EVALSHA_EXTEND, C_EVALSHA_OTHER, C_EVAL_RELEASE, C_EVAL_EXTEND, C_EVAL_GRANT,
       C_EVAL_COMMIT, C_EVAL_OTHER, C_WAIT };

typedef struct cmd {
    int kind;
    char nonce[40];  /* ECHO's argument */
} cmd;

typedef struct node {
    int connecting;  /* the engine asked for a connection not yet reported */
    int up;          /* a connection is open */
    int pooled;      /* the last connection was detached clean */
    char sent[SENT_CAP];  /* written, not yet parsed into commands */
    size_t sent_len;
    int lost_sync;   /* sent overflowed: no fitting replies until the connection ends */
    cmd q[QUEUE_CAP];
    int qhead, qlen;
} node;

static node nodes[RL_MAX_NODES];
static int nnodes;

static void forget_connection(node *n) {
    n->up = 0;
    n->sent_len = 0;
    n->lost_sync = 0;
    n->qhead = n->qlen = 0;
}

/* One RESP bulk at *p: its bytes and length; 0 if incomplete. */
static int bulk(const char **p, const char *end, const char **s, size_t *len) {
    const char *q = *p;
    if (q >= end || *q != '$') return 0;
    size_t n = 0;
    for (q++; q < end && *q >= '0' && *q <= '9'; q++) n = n * 10 + (size_t)(*q - '0');
    if (end - q < 2 || (size_t)(end - q - 2) < n + 2) return 0;
    *s = q + 2;
    *len = n;
    *p = q + 2 + n + 2;
    return 1;
}

static int is(const char *s, size_t len, const char *word) {
    return strlen(word) == len && memcmp(s, word, len) == 0;
}

static int kind_of(int argc, const char *const *argv, const size_t *lens, char *nonce) {
    if (argc < 1) return C_OTHER;
    const char *a = argv[0];
    size_t l = lens[0];
    if (is(a, l, "AUTH")) return C_AUTH;
    if (is(a, l, "SELECT")) return C_SELECT;
    if (is(a, l, "INFO")) return C_INFO;
    if (is(a, l, "ECHO") && argc >= 2) {
        size_t n = lens[1] < 39 ? lens[1] : 39;
        memcpy(nonce, argv[1], n);
        nonce[n] = '\0';
        return C_ECHO;
    }
    if (is(a, l, "SET")) return C_SET;
    if (is(a, l, "WAIT")) return C_WAIT;
    if (argc >= 3 && is(a, l, "SCRIPT")) {
        if (is(argv[2], lens[2], rl_release_script)) return C_LOAD_RELEASE;
        if (is(argv[2], lens[2], rl_extend_script)) return C_LOAD_EXTEND;
        return C_LOAD_OTHER;
    }
    if (argc >= 2 && is(a, l, "EVALSHA")) {
        if (is(argv[1], lens[1], rl_release_sha)) return C_EVALSHA_RELEASE;
        if (is(argv[1], lens[1], rl_extend_sha)) return C_EVALSHA_EXTEND;
        return C_EVALSHA_OTHER;
    }
    if (argc >= 2 && is(a, l, "EVAL")) {
        if (is(argv[1], lens[1], rl_release_script)) return C_EVAL_RELEASE;
        if (is(argv[1], lens[1], rl_extend_script)) return C_EVAL_EXTEND;
        if (is(argv[1], lens[1], rl_acquire_fenced_script)) return C_EVAL_GRANT;
        if (is(argv[1], lens[1], rl_acquire_queued_script)) return C_SET; /* answered like SET */
        if (is(argv[1], lens[1], rl_commit_script)) return C_EVAL_COMMIT;
        return C_EVAL_OTHER;
    }
    return C_OTHER;
}

/* Move the complete commands at the front of n->sent to its queue. */
static void parse_sent(node *n) {
    const char *p = n->sent, *end = n->sent + n->sent_len;
    while (p < end && *p == '*') {
        const char *q = p + 1;
        int argc = 0;
        while (q < end && *q >= '0' && *q <= '9') argc = argc * 10 + (*q++ - '0');
        if (end - q < 2) break;
        q += 2;
        const char *argv[8];
        size_t lens[8];
        int i, complete = 1;
        for (i = 0; i < argc; i++) {
            const char *s;
            size_t len;
            if (!bulk(&q, end, &s, &len)) {
                complete = 0;
                break;
            }
            if (i < 8) argv[i] = s, lens[i] = len;
        }
        if (!complete) break;
        cmd c = {0};
        c.kind = kind_of(argc < 8 ? argc : 8, argv, lens, c.nonce);
        if (n->qlen < QUEUE_CAP) n->q[(n->qhead + n->qlen++) % QUEUE_CAP] = c;
        else n->lost_sync = 1;
        p = q;
    }
    size_t used = (size_t)(p - n->sent);
    memmove(n->sent, p, n->sent_len - used);
    n->sent_len -= used;
}

/* ---- the engine and its operations ---- */

typedef struct op {
    int id;
    int op;          /* RL_OP_* */
    int fenced;
    int ttl;
    double begun;
    double grant_decided_by;  /* fenced: the first clock reading >= begun + timeout, or 0 */
} op;

static rl_engine *E;
static double now;
static int timeout_ms, quorum;
static op ops[MAX_OPS];
static int nops;
static char values[4][RL_VALUE_LEN + 1];  /* values of acquires that came back, for releases and extends */
static const char *const resources[4] = {"a", "b", "lock:c", "d\0e"};
static const size_t resource_lens[4] = {1, 1, 6, 3};

/* FUZZ_ENGINE_TRACE=1: print every result taken (to see what a seed does). */
static int trace = -1;

static void check_result(const op *o, const rl_result *r) {
    if (trace < 0) trace = getenv("FUZZ_ENGINE_TRACE") != NULL;
    if (trace)
        fprintf(stderr, "t=%.0f op %d (%s%d) %s: ok %d taken %d failed %d validity %.1f token %lld\n", now, r->id,
                o->fenced ? "fenced " : "", r->op, rl_status_word(r->status), r->ok, r->taken, r->failed,
                r->validity_ms, r->token);
    for (int i = 0; trace && i < r->nodes; i++)
        if (r->node[i].state != RL_NODE_OK) fprintf(stderr, "  node %d: %s %s\n", i, rl_node_state_word(r->node[i].state), r->node[i].errstr);
    CHECK(r->id == o->id);
    CHECK(r->op == o->op);
    CHECK(r->status >= RL_STATUS_OK && r->status <= RL_STATUS_NOT_HELD);
    CHECK(r->nodes == nnodes);
    CHECK(r->quorum == quorum);
    int states[5] = {0};
    for (int i = 0; i < r->nodes; i++) {
        CHECK(r->node[i].state >= RL_NODE_PENDING && r->node[i].state <= RL_NODE_TIMEOUT);
        CHECK(memchr(r->node[i].errstr, '\0', sizeof(r->node[i].errstr)) != NULL);
        states[r->node[i].state]++;
    }
    CHECK(r->ok == states[RL_NODE_OK]);
    CHECK(r->taken == states[RL_NODE_TAKEN]);
    CHECK(r->failed == states[RL_NODE_ERROR] + states[RL_NODE_TIMEOUT]);
    if (r->status == RL_STATUS_OK) CHECK(r->ok >= r->quorum);
    if (r->status == RL_STATUS_BUSY) CHECK(r->op == RL_OP_ACQUIRE);
    if (r->op == RL_OP_ACQUIRE || r->op == RL_OP_EXTEND) {
        CHECK(r->validity_ms <= o->ttl);
        CHECK((r->validity_ms > 0) == (r->status == RL_STATUS_OK));
    }
    CHECK(r->elapsed_ms >= 0 && r->elapsed_ms <= now - o->begun + 1e-6);
    if (o->fenced && r->status == RL_STATUS_OK) CHECK(r->token >= 1);
    else CHECK(r->token == 0);
    CHECK(strlen(r->value) == RL_VALUE_LEN);
    if (r->op == RL_OP_ACQUIRE) memcpy(values[o->id & 3], r->value, sizeof(values[0]));
}

/* Take operation i's result if it is there; must: it has to be. */
static void take(int i, int must) {
    rl_result r;
    memset(&r, 0xa5, sizeof(r));
    int rc = rl_engine_take(E, ops[i].id, &r);
    CHECK(rc == 0 || rc == 1); /* an operation begun and not taken is in flight */
    if (must) CHECK(rc == 1);
    if (rc != 1) return;
    check_result(&ops[i], &r);
    CHECK(rl_engine_take(E, ops[i].id, &r) == RL_ERR); /* forgotten */
    ops[i] = ops[--nops];
}

/* Every operation past its bound must be decided. */
static void check_deadlines(void) {
    for (int i = 0; i < nops; i++) {
        op *o = &ops[i];
        if (o->fenced && o->grant_decided_by == 0 && now >= o->begun + timeout_ms) o->grant_decided_by = now;
        double bound = o->fenced ? (o->grant_decided_by ? o->grant_decided_by + timeout_ms : -1) : o->begun + timeout_ms;
        if (bound >= 0 && now >= bound) take(i--, 1);
    }
}

/* Do what the engine wants: close, note a connection asked for. Writing is
 * left to the events. */
static void serve_wants(void) {
    unsigned bits = rl_engine_wanting(E);
    CHECK((bits >> nnodes) == 0);
    for (int i = 0; i < nnodes; i++) {
        if (!(bits & (1u << i))) continue;
        int w = rl_engine_node_wants(E, i);
        if (w & RL_WANT_CLOSE) forget_connection(&nodes[i]);
        if (w & RL_WANT_CONNECT) {
            CHECK(!nodes[i].up);
            nodes[i].connecting = 1;
        }
    }
}

static void write_node(int i, size_t most) {
    node *n = &nodes[i];
    const char *data = NULL;
    size_t len = rl_engine_node_output(E, i, &data);
    if (!n->up || len == 0) return;
    CHECK(data != NULL);
    size_t w = len < most ? len : most;
    if (!n->lost_sync) {
        if (n->sent_len + w > SENT_CAP) {
            n->lost_sync = 1;
        } else {
            memcpy(n->sent + n->sent_len, data, w);
            n->sent_len += w;
            parse_sent(n);
        }
    }
    rl_engine_node_wrote(E, i, w, now);
}

static void feed(int i, const char *data, size_t len) {
    node *n = &nodes[i];
    if (!n->up) return;
    if (rl_engine_node_feed(E, i, data, len, now) != RL_OK) forget_connection(n); /* the engine dropped it */
}

/* Feed s in two pieces, cut at c (mod its length + 1). */
static void feed_cut(int i, const char *s, size_t len, unsigned c) {
    size_t at = len ? c % (len + 1) : 0;
    feed(i, s, at);
    feed(i, s + at, len - at);
}

/* INFO server naming run_id which (each node its own, unless told otherwise). */
static const char *info_reply(unsigned which) {
    static char buf[256];
    char body[160];
    int n = snprintf(body, sizeof(body), "# Server\r\nredis_version:7.2.4\r\nrun_id:%040x\r\ntcp_port:6379\r\n",
                     0xa0 + which);
    snprintf(buf, sizeof(buf), "$%d\r\n%s\r\n", n, body);
    return buf;
}

/* The reply to c that choice picks: mostly the one a healthy node gives. */
static const char *fitting_reply(int node, const cmd *c, unsigned choice, char *buf, size_t cap) {
    static const char *const errors[] = {"-ERR fuzz\r\n", "-NOSCRIPT No matching script. Please use EVAL.\r\n",
                                         "-WRONGPASS invalid\r\n", "-LOADING Redis is loading\r\n"};
    unsigned pick = choice % 16;
    if (pick >= 12) return errors[pick & 3];
    if (pick == 11) return "+OK\r\n";  /* out of step for most */
    if (pick == 10) return ":1\r\n";   /* out of step for others */
    switch (c->kind) {
    case C_AUTH:
    case C_SELECT: return "+OK\r\n";
    case C_INFO: return info_reply((choice >> 4) == 15 ? 0 : (unsigned)node + 16 * (choice >> 4)); /* 15: node 0's */
    case C_LOAD_RELEASE: snprintf(buf, cap, "$40\r\n%s\r\n", rl_release_sha); return buf;
    case C_LOAD_EXTEND: snprintf(buf, cap, "$40\r\n%s\r\n", rl_extend_sha); return buf;
    case C_ECHO:
        if (pick == 9) return "$10\r\nrl-step-99\r\n";
        snprintf(buf, cap, "$%zu\r\n%s\r\n", strlen(c->nonce), c->nonce);
        return buf;
    case C_SET: return pick < 7 ? "+OK\r\n" : "$-1\r\n";
    case C_EVAL_GRANT:
        if (pick >= 7) return "$-1\r\n";
        if (pick == 6) return "$19\r\n9223372036854775807\r\n"; /* the counter's end */
        { /* the counter, a bulk string */
            char n[16];
            int len = snprintf(n, sizeof(n), "%u", 1 + (choice >> 4));
            snprintf(buf, cap, "$%d\r\n%s\r\n", len, n);
        }
        return buf;
    case C_EVALSHA_RELEASE:
    case C_EVALSHA_EXTEND:
    case C_EVAL_RELEASE:
    case C_EVAL_EXTEND:
    case C_EVAL_COMMIT: return pick < 7 ? ":1\r\n" : ":0\r\n";
    case C_WAIT: return pick < 6 ? ":1\r\n" : pick < 8 ? ":2\r\n" : ":0\r\n"; /* the replicas that have it */
    default: return "+OK\r\n";
    }
}

/* Replies that may come at any time: healthy, odd, or hostile. */
static const char *const canned[] = {
    "+OK\r\n", ":1\r\n", ":0\r\n", "$-1\r\n", "*-1\r\n", "-ERR x\r\n",
    "-NOSCRIPT No matching script. Please use EVAL.\r\n", "*2\r\n:1\r\n$-1\r\n", ":-1\r\n",
    ":9223372036854775807\r\n", "$3\r\nabc\r\n", "$2\r\n17\r\n", "$19\r\n9223372036854775808\r\n", "+ok\r\n", "*0\r\n", "$0\r\n\r\n",
    "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", "$70000\r\n", "*5000\r\n", "%1\r\n",
};

/* what: 0 acquire (queued if what & 16), 1 fenced acquire, 2 release, 3 extend. */
static void begin_one(unsigned what, unsigned arg) {
    if (nops >= MAX_OPS) return;
    const char *res = resources[arg & 3];
    size_t len = resource_lens[arg & 3];
    int ttl = 1 + (int)(arg >> 2) * 40; /* 1 .. 2521 ms */
    char junk[RL_VALUE_LEN + 1];
    memset(junk, 'f', RL_VALUE_LEN);
    junk[RL_VALUE_LEN] = '\0';
    const char *value = values[(arg >> 2) & 3][0] ? values[(arg >> 2) & 3] : junk;
    op o = {0};
    o.begun = now;
    o.ttl = ttl;
    switch (what & 3) {
    case 0:
        o.op = RL_OP_ACQUIRE;
        o.id = what & 16 ? rl_engine_begin_acquire_queued(E, res, len, ttl, now)
                         : rl_engine_begin_acquire(E, res, len, ttl, now);
        break;
    case 1: o.op = RL_OP_ACQUIRE; o.fenced = 1; o.id = rl_engine_begin_acquire_fenced(E, res, len, ttl, now); break;
    case 2: o.op = RL_OP_RELEASE; o.ttl = 0; o.id = rl_engine_begin_release(E, res, len, value, now); break;
    default: o.op = RL_OP_EXTEND; o.id = rl_engine_begin_extend(E, res, len, value, ttl, now); break;
    }
    CHECK(o.id >= 0); /* valid arguments: only out of memory could refuse */
    for (int i = 0; i < nops; i++) CHECK(ops[i].id != o.id);
    ops[nops++] = o;
}

static void event(void) {
    unsigned what = byte(), arg = byte(), step = byte();
    int i = (int)(arg % (unsigned)nnodes);
    node *n = &nodes[i];
    switch (what % 16) {
    case 0: case 1: case 2: case 3:
        begin_one(what, arg);
        break;
    case 4: /* the connection asked for comes up (or one nobody asked for is refused) */
        if (n->connecting) {
            /* RL_ERR: the engine gave up on it meanwhile (connect timeout) */
            int fresh = !(n->pooled && (arg & 0x80));
            int rc = rl_engine_node_connected(E, i, fresh, now);
            n->connecting = 0;
            n->pooled = 0;
            forget_connection(n);
            n->up = rc == RL_OK;
        } else if (!n->up) {
            CHECK(rl_engine_node_connected(E, i, 1, now) == RL_ERR);
        }
        break;
    case 5: /* the connection fails, or the connect does */
        if (n->up || n->connecting) {
            rl_engine_node_down(E, i, (arg & 0x80) ? "connect failed: fuzz" : "connection lost: fuzz", now);
            forget_connection(n);
            n->connecting = 0;
        }
        break;
    case 6: /* a write, whole or in part */
        write_node(i, (arg & 0x80) ? (size_t)-1 : (size_t)(arg >> 3) * 16 + 1);
        break;
    case 7: case 8: { /* the oldest command written gets a reply that fits (or not) */
        unsigned choice = what % 16 == 7 ? byte() : 0; /* one more byte: which reply */
        if (!n->up || n->lost_sync || n->qlen == 0) break;
        cmd c = n->q[n->qhead];
        n->qhead = (n->qhead + 1) % QUEUE_CAP;
        n->qlen--;
        char buf[128];
        const char *r = fitting_reply(i, &c, choice, buf, sizeof(buf));
        feed_cut(i, r, strlen(r), arg);
        break;
    }
    case 9: { /* arbitrary bytes */
        char raw[32];
        size_t len = (arg >> 3) % sizeof(raw);
        for (size_t k = 0; k < len; k++) raw[k] = (char)byte();
        feed(i, raw, len);
        n->lost_sync = 1;
        break;
    }
    case 10: { /* a canned reply, whatever was asked */
        const char *r = canned[(arg >> 3) % (sizeof(canned) / sizeof(canned[0]))];
        feed(i, r, strlen(r));
        n->lost_sync = 1;
        break;
    }
    case 11: /* take a result, if it is there */
        if (arg & 0x80) {
            rl_result r;
            if (rl_engine_collect(E, &r) == 1) {
                int k = 0;
                while (k < nops && ops[k].id != r.id) k++;
                CHECK(k < nops); /* a result of an operation we began and did not take */
                check_result(&ops[k], &r);
                ops[k] = ops[--nops];
            }
        } else if (nops) {
            take((int)(arg % (unsigned)nops), 0);
        }
        break;
    case 12:
        rl_engine_node_open(E, i, now);
        break;
    case 13: /* the driver puts the connection back in its pool */
        if (n->up) {
            n->pooled = rl_engine_node_detach(E, i, now) == 1;
            forget_connection(n);
        }
        break;
    case 14:
        rl_engine_node_unsent(E, i, (long long)(arg & 0x7f) * 100);
        break;
    case 15: /* everything written, every command answered as a healthy node would */
        for (int k = 0; k < nnodes; k++) {
            write_node(k, (size_t)-1);
            while (nodes[k].up && !nodes[k].lost_sync && nodes[k].qlen) {
                cmd c = nodes[k].q[nodes[k].qhead];
                nodes[k].qhead = (nodes[k].qhead + 1) % QUEUE_CAP;
                nodes[k].qlen--;
                char buf[128];
                const char *r = fitting_reply(k, &c, 0, buf, sizeof(buf));
                feed(k, r, strlen(r));
                serve_wants();
                write_node(k, (size_t)-1);
            }
        }
        break;
    }
    CHECK(rl_engine_node_unanswered(E, i) >= 0);
    serve_wants();
    now += step < 250 ? step : (step - 249) * 1000.0; /* mostly small steps, now and then seconds */
    rl_engine_advance(E, now);
    serve_wants();
    check_deadlines();
    /* A driver sleeps until the deadline: with a round in flight there must
     * be one, no later than a node timeout from now (every round started by now). */
    double d = rl_engine_deadline(E);
    CHECK(d == -1 || d >= 0);
    if (rl_engine_inflight(E) > 0) CHECK(d >= 0 && d <= now + timeout_ms);
    CHECK(rl_engine_inflight(E) >= 0 && rl_engine_tails(E) >= 0 && rl_engine_done(E) >= 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    in = data;
    in_len = size;
    in_at = 0;
    memset(values, 0, sizeof(values));
    nops = 0;

    unsigned h0 = byte(), h1 = byte(), h2 = byte(), h3 = byte(), h4 = byte();
    nnodes = 1 + (int)(h0 % 7);
    for (int i = 0; i < nnodes; i++) {
        nodes[i].connecting = nodes[i].pooled = 0;
        forget_connection(&nodes[i]);
    }
    rl_options o;
    rl_options_init(&o);
    o.node_timeout_ms = 1 + (int)h2;
    o.quorum = (h3 & 0x80) ? (int)(h3 & 0x7f) % (nnodes + 1) : 0;
    o.drift_factor = (h3 & 0x0f) / 100.0;
    o.connect_timeout_ms = 1 + (int)h4 * 4;
    o.stall_reset_ms = 1 + (int)(h4 >> 4) * 100;
    o.reconnect_min_ms = 1 + (int)(h1 >> 4);
    o.replicas = (int)(h2 & 3) == 2 ? 1 + (int)((h2 >> 2) & 1) : 0; /* a WAIT behind every write, 1 in 4 */
    char urlbuf[RL_MAX_NODES][64];
    const char *urls[RL_MAX_NODES];
    for (int i = 0; i < nnodes; i++) {
        int style = (h1 >> (i % 4)) & 1 ? (int)(h0 >> 4) % 4 : 0;
        static const char *const fmt[4] = {"redis://127.0.0.1:%d", "redis://:pw@127.0.0.1:%d",
                                           "redis://u:pw@127.0.0.1:%d/3", "redis://127.0.0.1:%d/1"};
        snprintf(urlbuf[i], sizeof(urlbuf[i]), fmt[style], 7001 + i);
        urls[i] = urlbuf[i];
    }
    char err[RL_ERR_LEN];
    E = rl_engine_new(urls, nnodes, &o, err, sizeof(err));
    if (E == NULL) return 0; /* options it refuses (a quorum below a majority) */
    timeout_ms = o.node_timeout_ms;
    quorum = rl_engine_quorum(E);
    CHECK(quorum >= nnodes / 2 + 1 && quorum <= nnodes);
    now = 1000;

    while (in_at < in_len) event();

    /* The end: everything written, then the clock runs on; every operation
     * must be decided within its bounds. */
    for (int round = 0; round < 4 && nops; round++) {
        for (int k = 0; k < nnodes; k++) write_node(k, (size_t)-1);
        now += timeout_ms + 1;
        rl_engine_advance(E, now);
        serve_wants();
        check_deadlines();
    }
    CHECK(nops == 0);
    CHECK(rl_engine_inflight(E) == 0);
    /* Tails (late replies, a failed acquire's cleanup) end by a node timeout
     * once their bytes are written. */
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < nnodes; k++) write_node(k, (size_t)-1);
        now += timeout_ms + 1;
        rl_engine_advance(E, now);
        serve_wants();
    }
    CHECK(rl_engine_tails(E) == 0);
    rl_engine_free(E);
    E = NULL;
    return 0;
}
