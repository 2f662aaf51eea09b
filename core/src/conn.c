/* conn.c — one node's socket in the libev driver (see conn.h). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "conn.h"
#include "text.h"

/* errstr = prefix .. text, cut to fit. */
static void set_err(rl_conn *c, const char *prefix, const char *text) {
    rl_text_join(c->errstr, sizeof(c->errstr), prefix, text);
}

/* Look the name up again on a thread of its own; c keeps what it has
 * meanwhile. A node with no address says why it has none. */
static void start_lookup(rl_conn *c) {
    char why[RL_NODE_ERR_LEN];
    c->lookup = rl_lookup_start(c->url->host, c->url->port, why, sizeof(why));
    if (c->lookup == NULL && c->addrs.n == 0) set_err(c, "name resolution failed: ", why);
}

void rl_conn_init(rl_conn *c, const rl_url *url, rl_tls *tls) {
    memset(c, 0, sizeof(*c));
    c->url = url;
    c->tls = tls;
    c->fd = -1;
    if (url->kind != RL_URL_TCP || rl_resolve_numeric(url->host, url->port, &c->addrs) == 0) return;
    c->named = 1;
    start_lookup(c);
    c->first_lookup = c->lookup != NULL;
}

void rl_conn_wait_lookup(rl_conn *c, double deadline_ms, int timeout_ms) {
    c->first_lookup = 0;
    if (c->lookup != NULL && !rl_lookup_wait(c->lookup, deadline_ms))
        snprintf(c->errstr, sizeof(c->errstr), "name resolution timed out after %d ms", timeout_ms);
}

/* Take what a finished lookup found. Return 1 if there is an address to
 * connect to. Never waits: a name still being looked up is not one, and a
 * name that has none is looked up again, in the background. */
static int have_address(rl_conn *c) {
    if (c->url->kind == RL_URL_UNIX) return 1;
    if (c->lookup != NULL) {
        rl_addrs found;
        char why[RL_NODE_ERR_LEN];
        int got = rl_lookup_result(c->lookup, &found, why, sizeof(why));
        if (got != 0) {
            rl_lookup_drop(c->lookup);
            c->lookup = NULL;
            c->first_lookup = 0;
        }
        if (got > 0) {
            c->addrs = found;
            c->addr_next = 0;
        } else if (got < 0 && c->addrs.n == 0) {
            set_err(c, "name resolution failed: ", why);
        }
    }
    if (c->addrs.n > 0) return 1;
    if (c->named && c->lookup == NULL) start_lookup(c);
    if (c->errstr[0] == '\0') snprintf(c->errstr, sizeof(c->errstr), "name resolution in progress");
    return 0;
}

int rl_conn_first_lookup_running(rl_conn *c) {
    if (c->first_lookup && c->lookup != NULL) (void)have_address(c);
    return c->first_lookup && c->lookup != NULL;
}

/* A connect to the current address failed: the next attempt tries the next
 * address, and once every address has failed a name is looked up again
 * (its address may have moved). */
static void connect_failed(rl_conn *c) {
    rl_conn_close(c);
    if (!c->named || c->addrs.n == 0) return;
    c->addr_next = (c->addr_next + 1) % c->addrs.n;
    if (c->addr_next == 0 && c->lookup == NULL) start_lookup(c);
}

int rl_conn_open(rl_conn *c) {
    rl_conn_close(c);
    if (!have_address(c)) return -1;
    struct sockaddr_un un;
    const struct sockaddr *sa;
    socklen_t salen;
    if (c->url->kind == RL_URL_UNIX) {
        memset(&un, 0, sizeof(un));
        un.sun_family = AF_UNIX;
        memcpy(un.sun_path, c->url->path, strlen(c->url->path) + 1); /* url.c: shorter than sun_path */
        sa = (const struct sockaddr *)&un;
        salen = sizeof(un);
    } else {
        const rl_addr *a = &c->addrs.addr[c->addr_next];
        sa = &a->sa.any;
        salen = a->len;
    }
    c->fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        set_err(c, "connect failed: ", strerror(errno));
        connect_failed(c);
        return -1;
    }
    if (c->url->kind != RL_URL_UNIX) {
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    /* 0 (a unix socket, or loopback at once) is seen as writable like a
     * connect in progress; an interrupted connect goes on by itself. */
    if (connect(c->fd, sa, salen) != 0 && errno != EINPROGRESS && errno != EINTR) {
        set_err(c, "connect failed: ", strerror(errno));
        connect_failed(c);
        return -1;
    }
    c->connecting = 1;
    c->errstr[0] = '\0';
    return 0;
}

int rl_conn_finish_connect(rl_conn *c) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    c->connecting = 0;
    if (err != 0) {
        set_err(c, "connect failed: ", strerror(err));
        connect_failed(c);
        return -1;
    }
    if (c->tls == NULL) return 0;
    const char *name = c->url->tls_name[0] ? c->url->tls_name : c->url->host;
    if (rl_tls_start(c->tls, &c->session, c->fd, name, c->errstr, sizeof(c->errstr)) != 0) {
        rl_conn_close(c);
        return -1;
    }
    c->handshaking = 1;
    return 0;
}

int rl_conn_handshake(rl_conn *c) {
    if (!c->handshaking) return 1;
    int rc = rl_tls_handshake(&c->session, c->errstr, sizeof(c->errstr));
    if (rc == RL_TLS_AGAIN) {
        c->want = c->session.want;
        return RL_CONN_AGAIN;
    }
    if (rc == RL_TLS_FAIL) {
        rl_conn_close(c);
        return RL_CONN_FAIL;
    }
    c->handshaking = 0;
    return 1;
}

/* Read up to len bytes: the count, RL_CONN_AGAIN (want says for what), or
 * RL_CONN_FAIL with the reason in errstr ("closed by the server", ...); the
 * socket stays open for the caller to close. */
static ssize_t rl_conn_read(rl_conn *c, char *buf, size_t len) {
    if (c->tls != NULL) {
        ssize_t got = rl_tls_read(&c->session, buf, len, c->errstr, sizeof(c->errstr));
        if (got == RL_TLS_AGAIN) c->want = c->session.want;
        return got;
    }
    for (;;) {
        ssize_t got = read(c->fd, buf, len);
        if (got > 0) return got;
        if (got == 0) {
            snprintf(c->errstr, sizeof(c->errstr), "closed by the server");
            return RL_CONN_FAIL;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->want = RL_TLS_WANT_READ;
            return RL_CONN_AGAIN;
        }
        snprintf(c->errstr, sizeof(c->errstr), "%s", strerror(errno));
        return RL_CONN_FAIL;
    }
}

/* Nonzero when a read may return bytes without the socket becoming readable
 * (TLS: bytes OpenSSL has read ahead). */
static size_t rl_conn_pending(const rl_conn *c) {
    return c->tls != NULL ? rl_tls_pending(&c->session) : 0;
}

int rl_conn_drain(rl_conn *c, int (*take)(void *arg, const char *data, size_t len), void *arg) {
    char buf[16384];
    size_t taken = 0;
    for (;;) {
        ssize_t got = rl_conn_read(c, buf, sizeof(buf));
        if (got <= 0) return (int)got; /* RL_CONN_AGAIN or RL_CONN_FAIL */
        if (take(arg, buf, (size_t)got) != 0) return 1;
        taken += (size_t)got;
        /* the socket is empty, or this call has read its share: what is
         * left keeps the socket readable (TLS: once nothing decrypted waits) */
        if ((got < (ssize_t)sizeof(buf) || taken >= RL_CONN_DRAIN_MAX) && rl_conn_pending(c) == 0) {
            c->want = RL_TLS_WANT_READ;
            return RL_CONN_AGAIN;
        }
    }
}

ssize_t rl_conn_write(rl_conn *c, const char *data, size_t len) {
    if (c->tls != NULL) {
        ssize_t w = rl_tls_write(&c->session, data, len, c->errstr, sizeof(c->errstr));
        if (w == RL_TLS_AGAIN) c->want = c->session.want;
        return w;
    }
    for (;;) {
        ssize_t w = send(c->fd, data, len, MSG_NOSIGNAL);
        if (w > 0) return w;
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->want = RL_TLS_WANT_WRITE;
            return RL_CONN_AGAIN;
        }
        snprintf(c->errstr, sizeof(c->errstr), "%s", w == 0 ? "wrote nothing" : strerror(errno));
        return RL_CONN_FAIL;
    }
}

long long rl_conn_unsent(const rl_conn *c) {
    int outq = 0;
    if (c->fd < 0 || ioctl(c->fd, SIOCOUTQ, &outq) != 0 || outq < 0) return 0;
    return outq;
}

void rl_conn_close(rl_conn *c) {
    rl_tls_end(&c->session);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->connecting = 0;
    c->handshaking = 0;
    c->want = 0;
}

void rl_conn_free(rl_conn *c) {
    rl_conn_close(c);
    rl_lookup_drop(c->lookup);
    c->lookup = NULL;
    c->first_lookup = 0;
}
