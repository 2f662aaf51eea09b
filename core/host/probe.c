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
 * error text for that node, like a refused connection or a timeout.
 *
 * A rediss:// node: hiredis (0.14) connects, then the TLS session (the core's
 * tls.c) takes over the socket; commands are encoded by the core's command.c
 * and replies parsed by hiredis' reader, every wait bounded by poll(2).
 *
 * The timeout is one deadline for the whole probe (connect, AUTH, SELECT,
 * GET, PTTL): every wait is for what is left of it, so a node that trickles
 * its replies a byte at a time cannot stretch it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "command.h"
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
} probe;

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

/* Take the next reply of a command already sent. Return it when its type is
 * in want (WANT(REDIS_REPLY_*) bits); otherwise, error replies included,
 * fail the probe with what the reply was to and return NULL. */
static redisReply *take(probe *p, const char *what, unsigned want) {
    void *obj = NULL;
    int rc = p->tls ? tls_reply(p, &obj) : plain_reply(p, &obj);
    if (rc != REDIS_OK || obj == NULL) {
        fail_io(p, what);
        return NULL;
    }
    redisReply *r = obj;
    if (r->type == REDIS_REPLY_ERROR) {
        fail(p->out, RL_HOST_PROBE_ENODE, "%s: %.*s", what, (int)r->len, r->str);
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
        if (expect_status(p, "AUTH", argc, argv, lens) != 0) return -1;
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

/* The live shared holders of key (its readers' set, pruned of none: only
 * read): their number, then value and ms left of the first of them. */
static const char readers_script[] =
    "local t = redis.call(\"time\") local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "local rd, from = \"" RL_READERS_PREFIX "\"..KEYS[1], string.format(\"(%.0f\", now) "
    "local out = { redis.call(\"zcount\",rd,from,\"+inf\") } "
    "local z = redis.call(\"zrangebyscore\",rd,from,\"+inf\",\"withscores\",\"limit\",0,ARGV[1]) "
    "for i = 1, #z, 2 do out[#out + 1] = z[i] out[#out + 1] = math.floor(tonumber(z[i + 1]) - now) end "
    "return out";

/* Read the shared holders of key into p->out. Return 0, or -1 with the
 * probe failed. */
static int look_readers(probe *p, const char *key, size_t keylen) {
    rl_host_probe_result *out = p->out;
    char most[16];
    snprintf(most, sizeof(most), "%d", RL_HOST_PROBE_READERS);
    const char *argv[5] = {"EVAL", readers_script, "1", key, most};
    size_t lens[5] = {4, sizeof(readers_script) - 1, 1, keylen, strlen(most)};
    if (append(p, 5, argv, lens) != REDIS_OK) return fail_io(p, "readers");
    redisReply *r = take(p, "readers", WANT(REDIS_REPLY_ARRAY));
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

/* The next reply, a string or nil, into buf (at most size - 1 bytes, NUL
 * added); *len: its whole length, *digest: fnv1a64 of all of it (len and
 * digest may be NULL), *found: 1 for a string. Return 0, or -1 with the
 * probe failed. */
static int take_string(probe *p, const char *what, char *buf, size_t size, size_t *len,
                       unsigned long long *digest, int *found) {
    redisReply *v = take(p, what, WANT(REDIS_REPLY_STRING) | WANT(REDIS_REPLY_NIL));
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

static const char *info_server[2] = {"INFO", "server"};
static size_t info_server_lens[2] = {4, 6};

/* Take the reply to INFO server: the server's run_id into p->out (two URLs
 * may name one server). Return 0, or -1 with the probe failed. */
static int take_run_id(probe *p) {
    redisReply *v = take(p, "INFO", WANT(REDIS_REPLY_STRING));
    if (v == NULL) return -1;
    rl_reply_run_id(v->str, v->len, p->out->run_id);
    freeReplyObject(v);
    return 0;
}

/* PING alone (key NULL), or GET key, GET key:fence and PTTL key, then INFO
 * server, in one round trip, timed. Return 0 with the result filled, or -1
 * with the probe failed. */
static int look(probe *p, const char *key, size_t keylen) {
    rl_host_probe_result *out = p->out;
    double start = mono_ms();
    if (key == NULL) {
        const char *ping[1] = {"PING"};
        size_t pinglen[1] = {4};
        if (append(p, 1, ping, pinglen) != REDIS_OK || append(p, 2, info_server, info_server_lens) != REDIS_OK)
            return fail_io(p, "PING");
        redisReply *r = take(p, "PING", WANT(REDIS_REPLY_STATUS));
        if (r == NULL) return -1;
        freeReplyObject(r);
        out->latency_ms = mono_ms() - start;
        return take_run_id(p);
    }
    rl_buf fk = {0}; /* key:fence */
    if (rl_buf_reserve(&fk, keylen + 6) != 0) return fail(out, RL_HOST_PROBE_ENODE, "out of memory");
    memcpy(fk.data, key, keylen);
    memcpy(fk.data + keylen, ":fence", 6);
    const char *get[2] = {"GET", key}, *fence[2] = {"GET", fk.data}, *pttl[2] = {"PTTL", key};
    size_t getlens[2] = {3, keylen}, fencelens[2] = {3, keylen + 6}, pttllens[2] = {4, keylen};
    int sent = append(p, 2, get, getlens) == REDIS_OK && append(p, 2, fence, fencelens) == REDIS_OK &&
               append(p, 2, pttl, pttllens) == REDIS_OK && append(p, 2, info_server, info_server_lens) == REDIS_OK;
    rl_buf_free(&fk);
    if (!sent) return fail_io(p, "GET");
    if (take_string(p, "GET", out->value, sizeof(out->value), &out->value_len, &out->value_digest, &out->exists) != 0 ||
        take_string(p, "GET fence", out->fence, sizeof(out->fence), NULL, NULL, &out->has_fence) != 0)
        return -1;
    redisReply *t = take(p, "PTTL", WANT(REDIS_REPLY_INTEGER));
    if (t == NULL) return -1;
    out->pttl = t->integer;
    freeReplyObject(t);
    out->latency_ms = mono_ms() - start;
    if (take_run_id(p) != 0) return -1;
    if (out->exists && strcmp(out->value, RL_SHARED_MARK) == 0) return look_readers(p, key, keylen);
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

/* GET and PTTL over TLS on p->c's socket. */
static int probe_tls(probe *p, const rl_url *u, const char *key, size_t keylen, const rl_host_tls *o) {
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
        rc = look(p, key, keylen);
    }
    rl_tls_end(&session);
    if (p->reader) redisReaderFree(p->reader);
    rl_buf_free(&p->cmds);
    rl_tls_free(ctx);
    p->tls = NULL;
    return rc;
}

int rl_host_probe(const char *url, const char *key, size_t keylen, int timeout_ms, const rl_host_tls *tls,
                       rl_host_probe_result *out) {
    rl_url u;
    memset(out, 0, sizeof(*out));
    out->pttl = -2;
    if (url == NULL || timeout_ms <= 0)
        return fail(out, RL_HOST_PROBE_EINVAL, "rl_host_probe: NULL url, or timeout_ms <= 0");
    if (rl_url_parse(url, &u, out->errstr, sizeof(out->errstr)) != 0) {
        out->err = RL_HOST_PROBE_EINVAL;
        return -1;
    }
    snprintf(out->name, sizeof(out->name), "%s", u.name);

    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    probe p = {.out = out, .timeout_ms = timeout_ms, .deadline = mono_ms() + timeout_ms};
    p.c = u.kind == RL_URL_UNIX ? redisConnectUnixWithTimeout(u.path, tv)
                                : redisConnectWithTimeout(u.host, u.port, tv);
    if (p.c == NULL) return fail(out, RL_HOST_PROBE_ENODE, "out of memory");
    if (p.c->fd >= 0) fcntl(p.c->fd, F_SETFD, FD_CLOEXEC); /* hiredis opens it inheritable */
    int rc;
    if (p.c->err) rc = fail(out, RL_HOST_PROBE_ENODE, "connect: %s", p.c->errstr);
    else if (redisSetTimeout(p.c, tv) != REDIS_OK) rc = fail_io(&p, "connect");
    else if (u.tls) rc = probe_tls(&p, &u, key, keylen, tls);
    else if ((rc = prepare(&p, &u)) == 0) rc = look(&p, key, keylen);
    redisFree(p.c);
    return rc;
}
