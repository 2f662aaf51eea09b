/*
 * probe.c — what one node holds under one key, for `redlock status`.
 *
 * One blocking hiredis connection per call: connect with a timeout, AUTH and
 * SELECT as the URL says (parsed by the core's own rl_url_parse), then GET,
 * GET of the fence counter (key:fence) and PTTL pipelined in one round trip,
 * or only a PING (no key: `redlock status` without RESOURCE), timed, and
 * INFO server behind them (its run_id: two URLs may name one server). Written against hiredis' public API
 * only, so the compiler checks every field read here; the Lua side sees
 * nothing of hiredis, only rl_host_probe_result. A reply of the wrong type (a
 * server that answers +OK to everything, something that is not Redis) is an
 * error text for that node, like a refused connection or a timeout; but not
 * WRONGTYPE from GET of the fence counter: a key of another type there is a
 * counter that is no token, on a node that answers.
 *
 * A rediss:// node: hiredis (0.14) connects, then the TLS session (the core's
 * tls.c) takes over the socket; commands are encoded by the core's command.c
 * and replies parsed by hiredis' reader, every wait bounded by poll(2).
 *
 * A Redis Cluster node (redis-cluster://h:p+h:p): its keys are read at the
 * master serving the key's slot, named as the engine names them there (the
 * companions after the key's base, rl_cluster_base; a semaphore's slots by
 * rl_slot_key). No map is read: the seeds (rl_cluster_seed) are asked in
 * order until one answers, and a MOVED reply sends the whole read again to
 * the master it names (ASK: with ASKING before each command), up to
 * RL_CLUSTER_REDIRECTS times; INFO's run_id is then the master's.
 *
 * The timeout is one deadline for the whole probe (connect, AUTH, SELECT,
 * GET, PTTL, every seed and redirection): every wait is for what is left of
 * it, so a node that trickles its replies a byte at a time cannot stretch it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "cluster.h"
#include "command.h"
#include "hashslot.h"
#include "host.h"
#include "reply.h"
#include "shared.h"
#include "tls.h"
#include "url.h"

/* One probe under way. */
typedef struct probe {
    redisContext *c;
    rl_host_probe_result *out;
    int timeout_ms;
    double deadline;         /* CLOCK_MONOTONIC ms: the probe ends by then */
    int timed_out;           /* the last wait ran into the deadline */
    /* TLS only: */
    rl_tls_session *tls;     /* NULL for a plain connection */
    rl_buf cmds;             /* commands not written yet */
    redisReader *reader;
    char err[RL_NODE_ERR_LEN]; /* TLS: what failed; plain: a poll(2) that failed */
    /* A cluster node only: */
    int cluster;             /* the node is a Redis Cluster */
    int asking;              /* send ASKING before each keyed command (an ASK is followed) */
    int replied;             /* the connection gave a reply: the server answers */
    const char *at_host;     /* the host of the server being read */
    char to_host[256];       /* the master a MOVED or ASK reply named ("": none) */
    int to_port;
    int to_ask;              /* 1 for ASK, 0 for MOVED */
} probe;

/* The keys a probe reads: the key itself, and for a lock its fence counter
 * and its shared holders' set (len 0: not read). */
typedef struct probe_keys {
    rl_buf key, fence, readers;
} probe_keys;

#define WANT(type) (1u << (type))

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* Whole ms left before the deadline (0 once it has passed). */
static int left_ms(const probe *p) {
    double left = p->deadline - mono_ms();
    if (left <= 0) return 0;
    return left >= 2147483647.0 ? 2147483647 : (int)left + 1;
}

/* Wait for events on fd until the deadline. Return 0 when ready; 1 when the
 * deadline passed (p->timed_out set); -1 when poll failed. */
static int wait_fd(probe *p, int fd, short events) {
    for (;;) {
        int left = left_ms(p);
        if (left <= 0) return p->timed_out = 1;
        struct pollfd pfd = {.fd = fd, .events = events};
        int n = poll(&pfd, 1, left);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return -1;
    }
}

static int fail(rl_host_probe_result *out, int err, const char *fmt, ...) {
    va_list ap;
    out->err = err;
    va_start(ap, fmt);
    vsnprintf(out->errstr, sizeof(out->errstr), fmt, ap);
    va_end(ap);
    return -1;
}

/* The connection's error, a read timeout said as such. */
static int fail_io(probe *p, const char *what) {
    redisContext *c = p->c;
    if (p->timed_out) return fail(p->out, RL_HOST_PROBE_ENODE, "%s: no answer within %d ms", what, p->timeout_ms);
    if (p->tls || p->err[0]) return fail(p->out, RL_HOST_PROBE_ENODE, "%s: %s", what, p->err);
#ifdef REDIS_ERR_TIMEOUT /* hiredis >= 1.0 */
    if (c->err == REDIS_ERR_TIMEOUT)
        return fail(p->out, RL_HOST_PROBE_ENODE, "%s: no answer within %d ms", what, p->timeout_ms);
#endif
    if (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK))
        return fail(p->out, RL_HOST_PROBE_ENODE, "%s: no answer within %d ms", what, p->timeout_ms);
    return fail(p->out, RL_HOST_PROBE_ENODE, "%s: %s", what, c->err ? c->errstr : "connection lost");
}

/* "status reply 'OK'", "integer reply 5", ...: an answer we did not ask for. */
static void describe(const redisReply *r, char *buf, size_t len) {
    int shown = (int)(r->len < 40 ? r->len : 40);
    switch (r->type) {
    case REDIS_REPLY_STRING: snprintf(buf, len, "string reply '%.*s'", shown, r->str); break;
    case REDIS_REPLY_STATUS: snprintf(buf, len, "status reply '%.*s'", shown, r->str); break;
    case REDIS_REPLY_INTEGER: snprintf(buf, len, "integer reply %lld", r->integer); break;
    case REDIS_REPLY_NIL: snprintf(buf, len, "nil reply"); break;
    case REDIS_REPLY_ARRAY: snprintf(buf, len, "array reply (%zu elements)", r->elements); break;
    default: snprintf(buf, len, "reply of type %d", r->type); break;
    }
}

/* ---- TLS: the session on hiredis' socket ---- */

/* Wait until the socket is ready for what the session wants, within the
 * probe's timeout. Return 0; 1 when the timeout passed (timed_out), -1 when
 * poll failed (err says why). */
static int tls_wait(probe *p) {
    int rc = wait_fd(p, p->c->fd, p->tls->want == RL_TLS_WANT_WRITE ? POLLOUT : POLLIN);
    if (rc < 0) snprintf(p->err, sizeof(p->err), "poll: %s", strerror(errno));
    return rc;
}

static int tls_handshake(probe *p) {
    int rc;
    while ((rc = rl_tls_handshake(p->tls, p->err, sizeof(p->err))) == RL_TLS_AGAIN)
        if ((rc = tls_wait(p)) != 0) {
            if (rc > 0) snprintf(p->err, sizeof(p->err), "TLS handshake timed out after %d ms", p->timeout_ms);
            return -1;
        }
    return rc == 1 ? 0 : -1;
}

/* Write every queued command. */
static int tls_flush(probe *p) {
    size_t off = 0;
    while (off < p->cmds.len) {
        ssize_t w = rl_tls_write(p->tls, p->cmds.data + off, p->cmds.len - off, p->err, sizeof(p->err));
        if (w > 0) off += (size_t)w;
        else if (w == RL_TLS_FAIL || tls_wait(p) != 0) return -1;
    }
    p->cmds.len = 0;
    return 0;
}

/* The next reply (sending what is queued first), as redisGetReply. */
static int tls_reply(probe *p, void **obj) {
    if (tls_flush(p) != 0) return REDIS_ERR;
    char buf[4096];
    for (;;) {
        if (redisReaderGetReply(p->reader, obj) != REDIS_OK) {
            snprintf(p->err, sizeof(p->err), "protocol error: %.70s", p->reader->errstr);
            return REDIS_ERR;
        }
        if (*obj != NULL) return REDIS_OK;
        ssize_t got = rl_tls_read(p->tls, buf, sizeof(buf), p->err, sizeof(p->err));
        if (got > 0) {
            if (redisReaderFeed(p->reader, buf, (size_t)got) != REDIS_OK) {
                snprintf(p->err, sizeof(p->err), "out of memory");
                return REDIS_ERR;
            }
        } else if (got == RL_TLS_FAIL || tls_wait(p) != 0) {
            return REDIS_ERR;
        }
    }
}

/* The next reply on a plain connection, as redisGetReply, but every read
 * waits (poll) for what is left of the deadline only. */
static int plain_reply(probe *p, void **obj) {
    int done = 0;
    do {
        if (redisBufferWrite(p->c, &done) == REDIS_ERR) return REDIS_ERR;
    } while (!done);
    for (;;) {
        if (redisGetReplyFromReader(p->c, obj) == REDIS_ERR) return REDIS_ERR;
        if (*obj != NULL) return REDIS_OK;
        int rc = wait_fd(p, p->c->fd, POLLIN);
        if (rc < 0) snprintf(p->err, sizeof(p->err), "poll: %s", strerror(errno));
        if (rc != 0) return REDIS_ERR;
        if (redisBufferRead(p->c) == REDIS_ERR) return REDIS_ERR;
    }
}

static int append(probe *p, int argc, const char **argv, const size_t *lens) {
    if (p->tls == NULL) return redisAppendCommandArgv(p->c, argc, argv, lens);
    if (rl_cmd_append_argv(&p->cmds, argc, argv, lens) == 0) return REDIS_OK;
    snprintf(p->err, sizeof(p->err), "out of memory");
    return REDIS_ERR;
}

/* On a cluster node, an error reply "MOVED <slot> <host>:<port>" or "ASK
 * <slot> <host>:<port>": note where it sends the probe. No host (a cluster
 * with cluster-preferred-endpoint-type unknown-endpoint) means the server
 * that replied, at that port; "?" (a hostname never announced) is followed
 * nowhere, as the engine does (cluster_redirect.c). */
static void note_redirection(probe *p, const redisReply *r) {
    if (!p->cluster) return;
    int ask = strncmp(r->str, "ASK ", 4) == 0;
    if (!ask && strncmp(r->str, "MOVED ", 6) != 0) return;
    size_t word = ask ? 4 : 6; /* "ASK " or "MOVED ": the slot, a space, the address */
    const char *sp = r->len > word ? memchr(r->str + word, ' ', r->len - word) : NULL;
    const char *colon = sp ? memrchr(sp, ':', r->len - (size_t)(sp - r->str)) : NULL;
    size_t hostlen = colon ? (size_t)(colon - sp - 1) : 0;
    const char *host = sp ? sp + 1 : NULL;
    if (colon != NULL && hostlen == 0 && p->at_host != NULL) {
        host = p->at_host;
        hostlen = strlen(host);
    }
    if (colon == NULL || hostlen == 0 || hostlen >= sizeof(p->to_host)) return;
    if (hostlen == 1 && host[0] == '?') return;
    int port = atoi(colon + 1);
    if (port <= 0 || port > 65535) return;
    memcpy(p->to_host, host, hostlen);
    p->to_host[hostlen] = '\0';
    p->to_port = port;
    p->to_ask = ask;
}

/* Fail the probe with the error reply r to what (noting where a MOVED or
 * ASK sends it). Return -1. */
static int fail_error_reply(probe *p, const char *what, const redisReply *r) {
    note_redirection(p, r);
    return fail(p->out, RL_HOST_PROBE_ENODE, "%s: %.*s", what, (int)r->len, r->str);
}

/* Take the next reply of a command already sent. Return it when its type is
 * in want (WANT(REDIS_REPLY_*) bits); otherwise, error replies included
 * unless want has them, fail the probe with what the reply was to and
 * return NULL. */
static redisReply *take(probe *p, const char *what, unsigned want) {
    void *obj = NULL;
    int rc = p->tls ? tls_reply(p, &obj) : plain_reply(p, &obj);
    if (rc != REDIS_OK || obj == NULL) {
        fail_io(p, what);
        return NULL;
    }
    redisReply *r = obj;
    p->replied = 1;
    if (r->type == REDIS_REPLY_ERROR && !(want & WANT(REDIS_REPLY_ERROR))) {
        fail_error_reply(p, what, r);
    } else if (r->type < 0 || r->type >= 32 || !(want & WANT(r->type))) {
        char got[80];
        describe(r, got, sizeof(got));
        fail(p->out, RL_HOST_PROBE_ENODE, "%s: unexpected %s", what, got);
    } else {
        return r;
    }
    freeReplyObject(r);
    return NULL;
}

/* Send a command and check that it was answered with a status reply. */
static int expect_status(probe *p, const char *what, int argc, const char **argv, const size_t *lens) {
    if (append(p, argc, argv, lens) != REDIS_OK) return fail_io(p, what);
    redisReply *r = take(p, what, WANT(REDIS_REPLY_STATUS));
    if (r == NULL) return -1;
    freeReplyObject(r);
    return 0;
}

/* AUTH and SELECT as u says. Return 0, or -1 with the probe failed. */
static int prepare(probe *p, const rl_url *u) {
    if (u->password[0]) {
        /* AUTH [user] password: the user only when the URL names one */
        const char *argv[3] = {"AUTH", u->user, u->password};
        size_t lens[3] = {4, strlen(u->user), strlen(u->password)};
        int argc = 3;
        if (u->user[0] == '\0') {
            argv[1] = argv[2];
            lens[1] = lens[2];
            argc = 2;
        }
        if (expect_status(p, "AUTH", argc, argv, lens) != 0) {
            char said[sizeof(p->out->errstr)];
            rl_url_scrub(u, p->out->errstr, said, sizeof(said));
            memcpy(p->out->errstr, said, sizeof(said));
            return -1;
        }
    }
    if (u->db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", u->db);
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, strlen(db)};
        if (expect_status(p, "SELECT", 2, argv, lens) != 0) return -1;
    }
    return 0;
}

/* Send a command that names a key: behind ASKING once an ASK is followed
 * (ASKING lets only the next command in). */
static int append_keyed(probe *p, int argc, const char **argv, const size_t *lens) {
    static const char *asking[1] = {"ASKING"};
    static const size_t asking_len[1] = {6};
    if (p->asking && append(p, 1, asking, asking_len) != REDIS_OK) return REDIS_ERR;
    return append(p, argc, argv, lens);
}

/* take for a command sent with append_keyed: its ASKING's +OK first. */
static redisReply *take_keyed(probe *p, const char *what, unsigned want) {
    if (p->asking) {
        redisReply *ok = take(p, "ASKING", WANT(REDIS_REPLY_STATUS));
        if (ok == NULL) return NULL;
        freeReplyObject(ok);
    }
    return take(p, what, want);
}

/* The live shared holders in the readers' set KEYS[1] (pruned of none:
 * only read): their number, then value and ms left of the first of them. */
static const char readers_script[] =
    "local t = redis.call(\"time\") local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "local rd, from = KEYS[1], string.format(\"(%.0f\", now) "
    "local out = { redis.call(\"zcount\",rd,from,\"+inf\") } "
    "local z = redis.call(\"zrangebyscore\",rd,from,\"+inf\",\"withscores\",\"limit\",0,ARGV[1]) "
    "for i = 1, #z, 2 do out[#out + 1] = z[i] out[#out + 1] = math.floor(tonumber(z[i + 1]) - now) end "
    "return out";

/* Read the shared holders of the lock (their set: k->readers) into p->out.
 * Return 0, or -1 with the probe failed. */
static int look_readers(probe *p, const probe_keys *k) {
    rl_host_probe_result *out = p->out;
    char most[16];
    snprintf(most, sizeof(most), "%d", RL_HOST_PROBE_READERS);
    const char *argv[5] = {"EVAL", readers_script, "1", k->readers.data, most};
    size_t lens[5] = {4, sizeof(readers_script) - 1, 1, k->readers.len, strlen(most)};
    if (append_keyed(p, 5, argv, lens) != REDIS_OK) return fail_io(p, "readers");
    redisReply *r = take_keyed(p, "readers", WANT(REDIS_REPLY_ARRAY));
    if (r == NULL) return -1;
    if (r->elements >= 1 && r->element[0]->type == REDIS_REPLY_INTEGER) out->readers = (int)r->element[0]->integer;
    for (size_t i = 1, n = 0; i + 1 < r->elements && n < RL_HOST_PROBE_READERS; i += 2, n++) {
        const redisReply *v = r->element[i], *ms = r->element[i + 1];
        if (v->type != REDIS_REPLY_STRING || ms->type != REDIS_REPLY_INTEGER) break;
        snprintf(out->reader[n], sizeof(out->reader[n]), "%.*s", (int)v->len, v->str);
        out->reader_pttl[n] = ms->integer;
    }
    freeReplyObject(r);
    return 0;
}

/* 64-bit FNV-1a of s[0..len). */
static unsigned long long fnv1a64(const char *s, size_t len) {
    unsigned long long h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* The next reply (of a keyed command), a string or nil, into buf (at most
 * size - 1 bytes, NUL added); *len: its whole length, *digest: fnv1a64 of
 * all of it (len and digest may be NULL), *found: 1 for a string. Return
 * 0, or -1 with the probe failed. */
static int take_string(probe *p, const char *what, char *buf, size_t size, size_t *len,
                       unsigned long long *digest, int *found) {
    redisReply *v = take_keyed(p, what, WANT(REDIS_REPLY_STRING) | WANT(REDIS_REPLY_NIL));
    if (v == NULL) return -1;
    if (v->type == REDIS_REPLY_STRING) {
        size_t keep = v->len < size - 1 ? v->len : size - 1;
        *found = 1;
        if (len) *len = v->len;
        if (digest) *digest = fnv1a64(v->str, v->len);
        memcpy(buf, v->str, keep);
        buf[keep] = '\0';
    }
    freeReplyObject(v);
    return 0;
}

/* The next reply (of a keyed command): GET of the lock's fence counter,
 * into out's fence fields. A string is taken whole for its token, by the
 * engine's rule (rl_fence_token), and kept in its first bytes with its
 * length; WRONGTYPE says a key of another type holds the counter's name,
 * no token either, and the node still answers (a plain lock's key beside
 * it is read as usual). Return 0, or -1 with the probe failed (any other
 * error reply: a MOVED or ASK is followed as for the lock's key). */
static int take_counter(probe *p) {
    rl_host_probe_result *out = p->out;
    redisReply *v =
        take_keyed(p, "GET fence", WANT(REDIS_REPLY_STRING) | WANT(REDIS_REPLY_NIL) | WANT(REDIS_REPLY_ERROR));
    if (v == NULL) return -1;
    int rc = 0;
    if (v->type == REDIS_REPLY_ERROR) {
        if (strncmp(v->str, "WRONGTYPE", 9) == 0) out->has_fence = RL_HOST_FENCE_OTHER_TYPE;
        else rc = fail_error_reply(p, "GET fence", v);
    } else if (v->type == REDIS_REPLY_STRING) {
        size_t keep = v->len < sizeof(out->fence) - 1 ? v->len : sizeof(out->fence) - 1;
        out->has_fence = RL_HOST_FENCE_STRING;
        out->fence_len = v->len;
        if (!rl_fence_token(v->str, v->len, &out->fence_token)) out->fence_token = 0;
        memcpy(out->fence, v->str, keep);
        out->fence[keep] = '\0';
    }
    freeReplyObject(v);
    return rc;
}

/* INFO server (its run_id); on a cluster node, and its cluster section. */
static const char *info_server[3] = {"INFO", "server", "cluster"};
static size_t info_server_lens[3] = {4, 6, 7};
#define INFO_ARGS(p) ((p)->cluster ? 3 : 2)

/* Take the reply to INFO server: the server's run_id into p->out (two URLs
 * may name one server). On a cluster node, a server without cluster
 * support fails the probe: the engine refuses its vote, and its keys are
 * named otherwise (a lock's counter <key>:fence, not <base>:fence). Return
 * 0, or -1 with the probe failed. */
static int take_run_id(probe *p) {
    redisReply *v = take(p, "INFO", WANT(REDIS_REPLY_STRING));
    if (v == NULL) return -1;
    rl_reply_run_id(v->str, v->len, p->out->run_id);
    int plain = p->cluster && strstr(v->str, "cluster_enabled:1") == NULL;
    freeReplyObject(v);
    if (plain) return fail(p->out, RL_HOST_PROBE_ENODE, "not a cluster node (cluster support disabled): use redis://");
    return 0;
}

/* PING alone (k NULL), or GET key, GET of the fence counter (a lock's)
 * and PTTL key, then INFO server, in one round trip, timed; then a lock's
 * shared holders when its key holds their mark. Return 0 with the result
 * filled, or -1 with the probe failed. */
static int look(probe *p, const probe_keys *k) {
    rl_host_probe_result *out = p->out;
    double start = mono_ms();
    if (k == NULL) {
        const char *ping[1] = {"PING"};
        size_t pinglen[1] = {4};
        if (append(p, 1, ping, pinglen) != REDIS_OK ||
            append(p, INFO_ARGS(p), info_server, info_server_lens) != REDIS_OK)
            return fail_io(p, "PING");
        redisReply *r = take(p, "PING", WANT(REDIS_REPLY_STATUS));
        if (r == NULL) return -1;
        freeReplyObject(r);
        out->latency_ms = mono_ms() - start;
        return take_run_id(p);
    }
    const char *get[2] = {"GET", k->key.data}, *fence[2] = {"GET", k->fence.data}, *pttl[2] = {"PTTL", k->key.data};
    size_t getlens[2] = {3, k->key.len}, fencelens[2] = {3, k->fence.len}, pttllens[2] = {4, k->key.len};
    if (append_keyed(p, 2, get, getlens) != REDIS_OK ||
        (k->fence.len && append_keyed(p, 2, fence, fencelens) != REDIS_OK) ||
        append_keyed(p, 2, pttl, pttllens) != REDIS_OK ||
        append(p, INFO_ARGS(p), info_server, info_server_lens) != REDIS_OK)
        return fail_io(p, "GET");
    if (take_string(p, "GET", out->value, sizeof(out->value), &out->value_len, &out->value_digest, &out->exists) != 0 ||
        (k->fence.len && take_counter(p) != 0))
        return -1;
    redisReply *t = take_keyed(p, "PTTL", WANT(REDIS_REPLY_INTEGER));
    if (t == NULL) return -1;
    out->pttl = t->integer;
    freeReplyObject(t);
    out->latency_ms = mono_ms() - start;
    if (take_run_id(p) != 0) return -1;
    if (k->readers.len && out->exists && strcmp(out->value, RL_SHARED_MARK) == 0) return look_readers(p, k);
    return 0;
}

/* The TLS context for a probe, from the options (NULL: the defaults). */
static rl_tls *tls_context(const rl_host_tls *o, rl_host_probe_result *out) {
    rl_tls_options t = {0};
    t.verify = 1;
    if (o) {
        t.cafile = o->cafile;
        t.capath = o->capath;
        t.certfile = o->certfile;
        t.keyfile = o->keyfile;
        t.server_name = o->server_name;
        t.verify = o->verify;
    }
    char err[RL_ERR_LEN];
    rl_tls *ctx = rl_tls_new(&t, err, sizeof(err));
    if (ctx == NULL) fail(out, RL_HOST_PROBE_EINVAL, "%s", err);
    return ctx;
}

int rl_host_check_tls(const rl_host_tls *tls, rl_host_probe_result *out) {
    rl_tls *ctx = tls_context(tls, out);
    if (ctx == NULL) return -1;
    rl_tls_free(ctx);
    return 0;
}

/* AUTH, SELECT and look over TLS on p->c's socket. */
static int probe_tls(probe *p, const rl_url *u, const probe_keys *k, const rl_host_tls *o) {
    rl_tls *ctx = tls_context(o, p->out);
    if (ctx == NULL) return -1;
    rl_tls_session session = {0};
    int rc = -1;
    p->tls = &session;
    p->reader = redisReaderCreate();
    int flags = fcntl(p->c->fd, F_GETFL);
    if (p->reader == NULL) {
        fail(p->out, RL_HOST_PROBE_ENODE, "out of memory");
    } else if (flags < 0 || fcntl(p->c->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        fail(p->out, RL_HOST_PROBE_ENODE, "connect: %s", strerror(errno));
    } else if (rl_tls_start(ctx, &session, p->c->fd, u->host, p->err, sizeof(p->err)) != 0 ||
               tls_handshake(p) != 0) {
        fail(p->out, RL_HOST_PROBE_ENODE, "connect: %s", p->err);
    } else if ((rc = prepare(p, u)) == 0) {
        rc = look(p, k);
    }
    rl_tls_end(&session);
    if (p->reader) redisReaderFree(p->reader);
    p->reader = NULL;
    rl_buf_free(&p->cmds);
    rl_tls_free(ctx);
    p->tls = NULL;
    return rc;
}

/* Connect to the server u names (within what is left of the deadline),
 * AUTH, SELECT and look; close. Return 0 with the result filled, or -1
 * with the probe failed. */
static int read_server(probe *p, const rl_url *u, const probe_keys *k, const rl_host_tls *tls) {
    rl_host_probe_result *out = p->out;
    /* a result of its own: an earlier server's (a MOVED one) is dropped */
    char name[sizeof(out->name)];
    memcpy(name, out->name, sizeof(name));
    memset(out, 0, sizeof(*out));
    memcpy(out->name, name, sizeof(name));
    out->pttl = -2;
    p->timed_out = p->replied = 0;
    p->err[0] = '\0';
    p->to_host[0] = '\0';
    p->at_host = u->kind == RL_URL_UNIX ? NULL : u->host;
    int left = left_ms(p);
    if (left <= 0) return p->timed_out = 1, fail(out, RL_HOST_PROBE_ENODE, "connect: no answer within %d ms", p->timeout_ms);
    struct timeval tv = {left / 1000, (left % 1000) * 1000};
    p->c = u->kind == RL_URL_UNIX ? redisConnectUnixWithTimeout(u->path, tv) : redisConnectWithTimeout(u->host, u->port, tv);
    if (p->c == NULL) return fail(out, RL_HOST_PROBE_ENODE, "out of memory");
    if (p->c->fd >= 0) fcntl(p->c->fd, F_SETFD, FD_CLOEXEC); /* hiredis opens it inheritable */
    int rc;
    if (p->c->err) rc = fail(out, RL_HOST_PROBE_ENODE, "connect: %s", p->c->errstr);
    else if (redisSetTimeout(p->c, tv) != REDIS_OK) rc = fail_io(p, "connect");
    else if (u->tls) rc = probe_tls(p, u, k, tls);
    else if ((rc = prepare(p, u)) == 0) rc = look(p, k);
    redisFree(p->c);
    p->c = NULL;
    return rc;
}

/* Put head before the probe's error text (its end cut when it would no
 * longer fit). */
static void prefix_error(rl_host_probe_result *out, const char *head) {
    size_t h = strlen(head), size = sizeof(out->errstr), len = strlen(out->errstr);
    if (h > size - 1) h = size - 1;
    if (len > size - 1 - h) len = size - 1 - h;
    memmove(out->errstr + h, out->errstr, len);
    memcpy(out->errstr, head, h);
    out->errstr[h + len] = '\0';
}

/* Put "<what><host>:<port>: " before the probe's error text. */
static void say_where(probe *p, const char *what, const rl_url *u) {
    char address[sizeof(u->host) + 8], head[96];
    rl_url_address(u, address, sizeof(address));
    snprintf(head, sizeof(head), "%s%.72s: ", what, address);
    prefix_error(p->out, head);
}

/* A cluster node: its seeds in order until one answers (connects and
 * replies), then where MOVED and ASK send the probe, RL_CLUSTER_REDIRECTS
 * times at most, all within the probe's deadline. Each seed gets an equal
 * share of what is left for it and the seeds after it: a stopped seed
 * (connected, silent) took the whole deadline before, and the seeds after
 * it were never asked. */
static int probe_cluster(probe *p, const char *url, const probe_keys *k, const rl_host_tls *tls) {
    rl_url u;
    int rc = -1, got, seeds = 0;
    while (rl_cluster_seed(url, seeds, &u, p->out->errstr, sizeof(p->out->errstr)) == 1) seeds++;
    double deadline = p->deadline;
    for (int s = 0; (got = rl_cluster_seed(url, s, &u, p->out->errstr, sizeof(p->out->errstr))) == 1; s++) {
        double share = (deadline - mono_ms()) / (seeds - s > 0 ? seeds - s : 1);
        p->deadline = mono_ms() + share < deadline ? mono_ms() + share : deadline;
        rc = read_server(p, &u, k, tls);
        p->deadline = deadline;
        if (rc != 0) say_where(p, "seed ", &u);
        if (rc == 0 || p->replied || left_ms(p) <= 0) break;
    }
    if (got < 0) return p->out->err = RL_HOST_PROBE_EINVAL, -1;
    if (got == 0 && rc != 0) prefix_error(p->out, "no seed answers; "); /* every seed tried */
    for (int hops = 0; rc != 0 && p->to_host[0] && hops < RL_CLUSTER_REDIRECTS; hops++) {
        const char *what = p->to_ask ? "ASK to " : "MOVED to ";
        snprintf(u.host, sizeof(u.host), "%s", p->to_host);
        u.port = p->to_port;
        p->asking = p->to_ask;
        rc = read_server(p, &u, k, tls);
        p->asking = 0;
        if (rc != 0) say_where(p, what, &u);
    }
    return rc;
}

/* The names k reads for key (key NULL: none, a PING): see rl_host_probe. */
static int name_keys(probe_keys *k, int cluster, const char *key, size_t keylen, int what) {
    rl_buf base = {0};
    const char *name = key; /* a companion's name is made from the key's, on a cluster node its base */
    size_t namelen = keylen;
    int rc = -1;
    if (cluster) {
        if (rl_cluster_base(&base, key, keylen) != 0) goto done;
        name = base.data;
        namelen = base.len;
    }
    if (what > 0) {
        if (rl_slot_key(&k->key, name, namelen, what) != 0) goto done;
    } else if (what == RL_HOST_PROBE_LIMIT) {
        if (rl_buf_reserve(&k->key, sizeof(RL_LIMIT_PREFIX) - 1 + namelen) != 0) goto done;
        memcpy(k->key.data, RL_LIMIT_PREFIX, sizeof(RL_LIMIT_PREFIX) - 1);
        memcpy(k->key.data + sizeof(RL_LIMIT_PREFIX) - 1, name, namelen);
        k->key.len = sizeof(RL_LIMIT_PREFIX) - 1 + namelen;
    } else {
        /* the lock: its key is the key itself on every node */
        if (rl_buf_reserve(&k->key, keylen) != 0 ||
            rl_buf_reserve(&k->fence, namelen + sizeof(RL_FENCE_SUFFIX) - 1) != 0 ||
            rl_buf_reserve(&k->readers, sizeof(RL_READERS_PREFIX) - 1 + namelen) != 0)
            goto done;
        memcpy(k->key.data, key, keylen);
        k->key.len = keylen;
        memcpy(k->fence.data, name, namelen);
        memcpy(k->fence.data + namelen, RL_FENCE_SUFFIX, sizeof(RL_FENCE_SUFFIX) - 1);
        k->fence.len = namelen + sizeof(RL_FENCE_SUFFIX) - 1;
        memcpy(k->readers.data, RL_READERS_PREFIX, sizeof(RL_READERS_PREFIX) - 1);
        memcpy(k->readers.data + sizeof(RL_READERS_PREFIX) - 1, name, namelen);
        k->readers.len = sizeof(RL_READERS_PREFIX) - 1 + namelen;
    }
    rc = 0;
done:
    rl_buf_free(&base);
    return rc;
}

int rl_host_probe(const char *url, const char *key, size_t keylen, int what, int timeout_ms,
                  const rl_host_tls *tls, rl_host_probe_result *out) {
    memset(out, 0, sizeof(*out));
    out->pttl = -2;
    if (url == NULL || timeout_ms <= 0 || (key == NULL && what != RL_HOST_PROBE_LOCK) || what < RL_HOST_PROBE_LIMIT)
        return fail(out, RL_HOST_PROBE_EINVAL, "rl_host_probe: NULL url, timeout_ms <= 0, or a bad what");
    probe p = {.out = out, .timeout_ms = timeout_ms, .deadline = mono_ms() + timeout_ms, .cluster = rl_cluster_url(url)};
    rl_url u;
    if (p.cluster) {
        if (rl_cluster_name(url, out->name, sizeof(out->name)) != 0)
            return fail(out, RL_HOST_PROBE_EINVAL, "cluster URL too long");
        for (int s = 0, got; (got = rl_cluster_seed(url, s, &u, out->errstr, sizeof(out->errstr))) != 0; s++)
            if (got < 0) return out->err = RL_HOST_PROBE_EINVAL, -1; /* every seed checked before any is asked */
    } else {
        if (rl_url_parse(url, &u, out->errstr, sizeof(out->errstr)) != 0) return out->err = RL_HOST_PROBE_EINVAL, -1;
        snprintf(out->name, sizeof(out->name), "%s", u.name);
    }
    probe_keys k = {{0}, {0}, {0}};
    int rc;
    if (key && name_keys(&k, p.cluster, key, keylen, what) != 0)
        rc = fail(out, RL_HOST_PROBE_ENODE, "out of memory");
    else if (p.cluster)
        rc = probe_cluster(&p, url, key ? &k : NULL, tls);
    else
        rc = read_server(&p, &u, key ? &k : NULL, tls);
    rl_buf_free(&k.key);
    rl_buf_free(&k.fence);
    rl_buf_free(&k.readers);
    return rc;
}
