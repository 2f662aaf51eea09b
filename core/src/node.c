/* node.c — one node's connection lifecycle (see node.h).
 *
 * The socket is ours: opened non-blocking to an address found before
 * (resolve.c: a name is looked up on a thread, never on the loop), written
 * with send(2) from our own buffer, so a command costs one write and no
 * allocation, and the reply FIFO is our ticket ring rather than a second
 * callback queue. hiredis' reader parses the replies (reply.c). Commands
 * queue up until the owner flushes (once per loop iteration), so everything
 * a node is sent in one iteration goes out in one write.
 *
 * Every write is send(..., MSG_NOSIGNAL): a node that closed its end makes it
 * fail with EPIPE instead of raising SIGPIPE, so the library never needs to
 * touch the process's signal dispositions. No other code of the library
 * writes to a socket or pipe. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "node.h"

/* Node-internal command kinds: the setup commands sent on every connect. */
enum { SETUP_AUTH = -1, SETUP_SELECT = -2, SETUP_INFO = -3, CHECK_ECHO = -4, LOAD_SCRIPT = -5 };

#define READ_CHUNK 16384

static void connect_now(rl_node *n);
static void connect_failed(rl_node *n);

/* libev runs an overdue timer before the I/O that arrived in the same loop
 * iteration (pending watchers are invoked last in, first out). A timer that
 * judges a connection looks at the socket itself first. */
static int socket_ready(int fd, short events) {
    struct pollfd p = {.fd = fd, .events = events};
    return poll(&p, 1, 0) == 1 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL)) && (p.revents & events);
}

/* errstr = prefix .. text, cut to fit. */
static void set_err(rl_node *n, const char *prefix, const char *text) {
    if (text == NULL || *text == '\0') text = "unknown error";
    size_t room = sizeof(n->errstr) - 1;
    size_t plen = strnlen(prefix, room);
    size_t tlen = strnlen(text, room - plen);
    memcpy(n->errstr, prefix, plen);
    memcpy(n->errstr + plen, text, tlen);
    n->errstr[plen + tlen] = '\0';
}

/* ---- the ticket ring ---- */

static rl_ticket ring_pop(rl_node *n) {
    rl_ticket t = n->ring[n->ring_head];
    n->ring_head = (n->ring_head + 1) % n->ring_cap;
    n->ring_count--;
    return t;
}

static int ring_push(rl_node *n, rl_ticket t) {
    if (n->ring_count == n->ring_cap) {
        unsigned cap = n->ring_cap ? n->ring_cap * 2 : 64;
        rl_ticket *ring = malloc(cap * sizeof(*ring));
        if (!ring) return -1;
        for (unsigned i = 0; i < n->ring_count; i++) ring[i] = n->ring[(n->ring_head + i) % n->ring_cap];
        free(n->ring);
        n->ring = ring;
        n->ring_cap = cap;
        n->ring_head = 0;
    }
    n->ring[(n->ring_head + n->ring_count) % n->ring_cap] = t;
    n->ring_count++;
    return 0;
}

/* ---- ending a connection ---- */

static void schedule_reconnect(rl_node *n) {
    n->link = RL_LINK_DOWN;
    if (n->closing) return;
    n->retry_at_ms = rl_now_ms() + n->backoff_ms;
    ev_timer_set(&n->retry_timer, n->backoff_ms / 1000.0, 0.);
    ev_now_update(n->loop);
    ev_timer_start(n->loop, &n->retry_timer);
    n->backoff_ms *= 2;
    if (n->backoff_ms > n->opts->reconnect_max_ms) n->backoff_ms = n->opts->reconnect_max_ms;
}

/* Close the socket and forget what was queued or half-read on it. */
static void close_socket(rl_node *n) {
    ev_io_stop(n->loop, &n->readable);
    ev_io_stop(n->loop, &n->writable);
    ev_timer_stop(n->loop, &n->connect_timer);
    if (n->fd >= 0) close(n->fd);
    n->fd = -1;
    n->conn++;
    n->out.len = n->out_off = n->hold_at = 0;
    n->setup_left = n->holding = 0;
    n->queued_total = n->written_total = 0;
    n->step_check = 0;
    n->step_nonce++;
    rl_reader_free(&n->reader);
}

/* The connection is gone: say why, answer every unanswered command with
 * that, and reconnect after the backoff. */
static void drop(rl_node *n, const char *why) {
    if (why != n->errstr) snprintf(n->errstr, sizeof(n->errstr), "%s", why);
    close_socket(n);
    schedule_reconnect(n);
    /* Callbacks may send to this node again, which may even reconnect it
     * (retry_at_ms passed meanwhile): answer only the tickets of this
     * connection, the oldest ring_count ones. */
    for (unsigned old = n->ring_count; old > 0; old--) {
        rl_ticket t = ring_pop(n);
        if (t.kind > 0) n->on_reply(n->owner, n->index, t, NULL, n->errstr);
    }
}

double rl_node_held_since(const rl_node *n) {
    return n->holding && n->hold_at < n->out.len ? n->setup_ms : 0;
}

void rl_node_reset(rl_node *n, const char *why) {
    if (n->fd >= 0) drop(n, why);
}

/* ---- writing ---- */

/* Where the bytes that may go out now end: until the setup has succeeded,
 * only the setup commands may. */
static size_t writable_end(const rl_node *n) {
    return n->holding ? n->hold_at : n->out.len;
}

/* Write what is queued and may go out. Return 0 when all of it is written,
 * 1 when the socket is full, -1 on an error (errno says which). */
static int write_out(rl_node *n) {
    size_t end = writable_end(n);
    while (n->out_off < end) {
        ssize_t w = send(n->fd, n->out.data + n->out_off, end - n->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            n->out_off += (size_t)w;
            n->written_total += (unsigned long long)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 1;
        } else {
            return -1;
        }
    }
    if (n->out_off == n->out.len) n->out.len = n->out_off = n->hold_at = 0;
    return 0;
}

void rl_node_flush(rl_node *n) {
    if (n->link != RL_LINK_UP || n->out.len == 0 || ev_is_active(&n->writable)) return;
    /* What does not fit, and errors, are the writable handler's. */
    if (write_out(n) != 0) ev_io_start(n->loop, &n->writable);
}

/* Append a command and its ticket, both or neither. */
static int queue_command(rl_node *n, const char *cmd, size_t len, rl_ticket t) {
    t.end = n->queued_total + len;
    if (rl_buf_reserve(&n->out, len) != 0 || ring_push(n, t) != 0) {
        snprintf(n->errstr, sizeof(n->errstr), "out of memory");
        return -1;
    }
    memcpy(n->out.data + n->out.len, cmd, len);
    n->out.len += len;
    n->queued_total += len;
    return 0;
}

/* ---- reading ---- */

/* The nonce the step check asks for: "rl-step-" and a number. */
static int step_nonce(const rl_node *n, char *buf, size_t len) {
    return snprintf(buf, len, "rl-step-%u", n->step_nonce);
}

/* The reply to a step check must be its own nonce: any other reply answers
 * some other command, so the replies are out of step with the commands. An
 * error proves nothing either way (a node may refuse ECHO, or answer errors
 * to everything: it fails its votes anyway); the next check will tell. */
static void step_reply(rl_node *n, const rl_reply *reply) {
    char nonce[32];
    size_t len = (size_t)step_nonce(n, nonce, sizeof(nonce));
    n->step_check = 0;
    if (reply->type == RL_REPLY_ERROR) return;
    if (reply->type == RL_REPLY_STRING && reply->len == len && memcmp(reply->str, nonce, len) == 0) return;
    drop(n, RL_OUT_OF_STEP);
}

/* The peer that already votes for server run_id, or -1. */
static int voter_of(const rl_node *n, const char *run_id) {
    for (int j = 0; j < n->npeers; j++)
        if (j != n->index && n->peers[j].run_id[0] && strcmp(n->peers[j].run_id, run_id) == 0) return j;
    return -1;
}

/* Every setup reply is in and none refused: the node votes for the server
 * INFO named, unless another node already does. Commands held back go out. */
static void setup_done(rl_node *n) {
    int other = n->seen_id[0] ? voter_of(n, n->seen_id) : -1;
    if (other >= 0) {
        snprintf(n->errstr, sizeof(n->errstr), "same server as node %d (run_id %s)", other + 1, n->seen_id);
        drop(n, n->errstr);
        return;
    }
    memcpy(n->run_id, n->seen_id, sizeof(n->run_id));
    n->backoff_ms = n->opts->reconnect_min_ms;
    n->holding = 0;
    rl_node_flush(n);
}

/* A reply to a step check or a script load (see above), or to AUTH,
 * SELECT or INFO. A refused AUTH or SELECT ends the
 * connection, and every command held behind it fails with the reason, never
 * having been sent. INFO says which server this is (a server that will not
 * say is taken as it is). */
static void setup_reply(rl_node *n, rl_ticket t, const rl_reply *reply) {
    if (t.kind == CHECK_ECHO) {
        step_reply(n, reply);
        return;
    }
    if (t.kind == LOAD_SCRIPT) {
        n->scripts_loading = 0; /* a refusal only means EVALSHA falls back to EVAL */
        return;
    }
    if (t.kind == SETUP_INFO) {
        memcpy(n->seen_id, reply->run_id, sizeof(n->seen_id));
    } else if (reply->type == RL_REPLY_ERROR) {
        set_err(n, t.kind == SETUP_AUTH ? "AUTH refused: " : "SELECT refused: ", reply->str);
        drop(n, n->errstr);
        return;
    }
    if (--n->setup_left == 0) setup_done(n);
}

/* Hand every complete reply to its ticket, until the connection ends. */
static void dispatch(rl_node *n) {
    unsigned conn = n->conn;
    while (n->conn == conn) {
        const rl_reply *reply;
        int got = rl_reader_next(&n->reader, &reply);
        if (got == 0) return;
        if (got < 0) {
            set_err(n, "connection reset: ", rl_reader_error(&n->reader));
            drop(n, n->errstr);
        } else if (n->ring_count == 0) {
            drop(n, "connection reset: a reply to no command");
        } else {
            rl_ticket t = ring_pop(n);
            if (t.kind > 0) n->on_reply(n->owner, n->index, t, reply, NULL);
            else setup_reply(n, t, reply);
        }
    }
}

static void on_readable(EV_P_ ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    rl_node *n = w->data;
    char buf[READ_CHUNK];
    const char *ended = NULL;
    unsigned conn = n->conn;
    for (;;) {
        ssize_t got = read(n->fd, buf, sizeof(buf));
        if (got > 0) {
            n->read_ms = rl_now_ms();
            if (rl_reader_feed(&n->reader, buf, (size_t)got) != 0) {
                ended = "out of memory";
                break;
            }
            /* Parse as the bytes come, so what is buffered stays within the
             * reader's limits; replies that arrived before an end still count. */
            dispatch(n);
            if (n->conn != conn) return; /* dropped: n->fd is no longer this connection */
            if (got == (ssize_t)sizeof(buf)) continue; /* there may be more */
        } else if (got == 0) {
            ended = "closed by the server";
        } else if (errno == EINTR) {
            continue;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
            ended = strerror(errno);
        }
        break;
    }
    if (ended) {
        set_err(n, "connection lost: ", ended);
        drop(n, n->errstr);
    }
}

/* ---- connecting ---- */

static void connected(rl_node *n) {
    ev_timer_stop(n->loop, &n->connect_timer);
    n->link = RL_LINK_UP;
    n->read_ms = n->acked_ms = rl_now_ms();
    n->acked = 0;
    n->head_end = ~0ull;
    n->errstr[0] = '\0';
    ev_io_start(n->loop, &n->readable);
    ev_io_stop(n->loop, &n->writable);
    rl_node_flush(n);
}

static void on_writable(EV_P_ ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    rl_node *n = w->data;
    if (n->link == RL_LINK_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(n->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err != 0) {
            set_err(n, "connect failed: ", strerror(err));
            connect_failed(n);
            drop(n, n->errstr);
        } else {
            connected(n);
        }
        return;
    }
    if (write_out(n) < 0) {
        set_err(n, "connection lost: ", strerror(errno));
        drop(n, n->errstr);
    } else if (n->out_off == writable_end(n)) {
        ev_io_stop(n->loop, &n->writable);
    }
}

static void on_connect_timeout(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    rl_node *n = w->data;
    if (n->link != RL_LINK_CONNECTING) return;
    if (socket_ready(n->fd, POLLOUT)) {
        on_writable(n->loop, &n->writable, EV_WRITE); /* connected while nobody drove the loop */
        return;
    }
    snprintf(n->errstr, sizeof(n->errstr), "connect timed out after %d ms", n->opts->connect_timeout_ms);
    connect_failed(n);
    drop(n, n->errstr);
}

static void on_retry_timer(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    connect_now(w->data);
}

/* Queue SCRIPT LOAD of the release and extend scripts (unless loads are in
 * flight), so EVALSHA finds them. A node that lost them (SCRIPT FLUSH, a
 * restart) answers NOSCRIPT; a round then falls back to EVAL, but a reply
 * that comes after its round is over has nobody to fall back for. Return 0,
 * or -1 when out of memory. */
static int queue_script_loads(rl_node *n) {
    if (n->scripts_loading) return 0;
    const char *scripts[2] = {rl_release_script, rl_extend_script};
    rl_buf cmd = {0};
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        const char *argv[3] = {"SCRIPT", "LOAD", scripts[i]};
        size_t lens[3] = {6, 4, strlen(scripts[i])};
        rl_ticket t = {-1, 0, LOAD_SCRIPT, rl_now_ms(), 0, 0};
        cmd.len = 0;
        rc = rl_cmd_append_argv(&cmd, 3, argv, lens);
        if (rc == 0) rc = queue_command(n, cmd.data, cmd.len, t);
    }
    rl_buf_free(&cmd);
    if (rc == 0) n->scripts_loading = 1;
    return rc;
}

/* Queue AUTH and SELECT as the URL asks, then INFO server; they go out
 * first on connect, and what is queued after them waits for their replies.
 * Return 0, or -1 when out of memory (the caller drops the connection). */
static int queue_setup(rl_node *n) {
    rl_buf cmd = {0};
    int rc = 0;
    n->seen_id[0] = '\0';
    n->setup_left = n->holding = 0;
    if (n->url.password[0]) {
        const char *argv[3] = {"AUTH"};
        size_t lens[3] = {4};
        int argc = 1;
        if (n->url.user[0]) argv[argc] = n->url.user, lens[argc++] = strlen(n->url.user);
        argv[argc] = n->url.password, lens[argc++] = strlen(n->url.password);
        rl_ticket t = {-1, 0, SETUP_AUTH, rl_now_ms(), 0, 0};
        rc = rl_cmd_append_argv(&cmd, argc, argv, lens);
        if (rc == 0) rc = queue_command(n, cmd.data, cmd.len, t);
        if (rc == 0) n->setup_left++;
        cmd.len = 0;
    }
    if (n->url.db && rc == 0) {
        char db[16];
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, (size_t)snprintf(db, sizeof(db), "%d", n->url.db)};
        rl_ticket t = {-1, 0, SETUP_SELECT, rl_now_ms(), 0, 0};
        rc = rl_cmd_append_argv(&cmd, 2, argv, lens);
        if (rc == 0) rc = queue_command(n, cmd.data, cmd.len, t);
        if (rc == 0) n->setup_left++;
        cmd.len = 0;
    }
    if (rc == 0) {
        const char *argv[2] = {"INFO", "server"};
        size_t lens[2] = {4, 6};
        rl_ticket t = {-1, 0, SETUP_INFO, rl_now_ms(), 0, 0};
        rc = rl_cmd_append_argv(&cmd, 2, argv, lens);
        if (rc == 0) rc = queue_command(n, cmd.data, cmd.len, t);
        if (rc == 0) n->setup_left++;
    }
    n->holding = n->setup_left > 0;
    n->hold_at = n->out.len;
    n->setup_ms = rl_now_ms();
    rl_buf_free(&cmd);
    n->scripts_loading = 0;
    if (rc == 0) rc = queue_script_loads(n);
    return rc;
}

/* Open a non-blocking socket and begin connecting it to the node's unix
 * path or current address. Return the fd, or -1 with the reason in errstr. */
static int open_socket(rl_node *n) {
    struct sockaddr_un un;
    const struct sockaddr *sa;
    socklen_t salen;
    if (n->url.kind == RL_URL_UNIX) {
        memset(&un, 0, sizeof(un));
        un.sun_family = AF_UNIX;
        memcpy(un.sun_path, n->url.path, strlen(n->url.path) + 1); /* url.c: shorter than sun_path */
        sa = (const struct sockaddr *)&un;
        salen = sizeof(un);
    } else {
        const rl_addr *a = &n->addrs.addr[n->addr_next];
        sa = &a->sa.any;
        salen = a->len;
    }
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        set_err(n, "connect failed: ", strerror(errno));
        return -1;
    }
    if (n->url.kind != RL_URL_UNIX) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    /* 0 (a unix socket, or loopback at once) is seen as writable like a
     * connect in progress; an interrupted connect goes on by itself. */
    if (connect(fd, sa, salen) != 0 && errno != EINPROGRESS && errno != EINTR) {
        set_err(n, "connect failed: ", strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Look the name up again on a thread of its own; the node keeps what it
 * has meanwhile. A node with no address says why it has none. */
static void start_lookup(rl_node *n) {
    char why[RL_NODE_ERR_LEN];
    n->lookup = rl_lookup_start(n->url.host, n->url.port, why, sizeof(why));
    if (n->lookup == NULL && n->addrs.n == 0) set_err(n, "name resolution failed: ", why);
}

/* Take what a finished lookup found. Return 1 if there is an address to
 * connect to. Never waits: a name still being looked up is not one, and a
 * name that has none is looked up again, in the background. */
static int have_address(rl_node *n) {
    if (n->url.kind == RL_URL_UNIX) return 1;
    if (n->lookup != NULL) {
        rl_addrs found;
        char why[RL_NODE_ERR_LEN];
        int got = rl_lookup_result(n->lookup, &found, why, sizeof(why));
        if (got != 0) {
            rl_lookup_drop(n->lookup);
            n->lookup = NULL;
        }
        if (got > 0) {
            n->addrs = found;
            n->addr_next = 0;
        } else if (got < 0 && n->addrs.n == 0) {
            set_err(n, "name resolution failed: ", why);
        }
    }
    if (n->addrs.n > 0) return 1;
    if (n->named && n->lookup == NULL) start_lookup(n);
    return 0;
}

/* A connect to the current address failed: the next attempt tries the next
 * address, and once every address has failed a name is looked up again
 * (its address may have moved). */
static void connect_failed(rl_node *n) {
    if (!n->named || n->addrs.n == 0) return;
    n->addr_next = (n->addr_next + 1) % n->addrs.n;
    if (n->addr_next == 0 && n->lookup == NULL) start_lookup(n);
}

static void connect_now(rl_node *n) {
    ev_timer_stop(n->loop, &n->retry_timer);
    if (!have_address(n)) {
        schedule_reconnect(n);
        return;
    }
    n->fd = open_socket(n);
    if (n->fd < 0) {
        connect_failed(n);
        schedule_reconnect(n);
        return;
    }
    if (rl_reader_reset(&n->reader) != 0 || queue_setup(n) != 0) {
        drop(n, "connect failed: out of memory");
        return;
    }
    n->link = RL_LINK_CONNECTING;
    snprintf(n->errstr, sizeof(n->errstr), "connecting");
    ev_io_set(&n->readable, n->fd, EV_READ);
    ev_io_set(&n->writable, n->fd, EV_WRITE);
    ev_io_start(n->loop, &n->writable);
    ev_timer_set(&n->connect_timer, n->opts->connect_timeout_ms / 1000.0, 0.);
    ev_now_update(n->loop);
    ev_timer_start(n->loop, &n->connect_timer);
}

/* ---- the stall watchdog ---- */

/* Commands unanswered and the node not keeping up for stall_reset_ms: a
 * reply was lost, or the node hangs (a stopped process), and the reply stream
 * cannot resynchronise. Only a reply proves the node's process alive: its
 * kernel takes our bytes whether or not the process runs. So the oldest
 * unanswered command is judged by where its bytes are:
 *   - not all at the node yet (a large batch, a slow link): stalled only if
 *     the node's end has taken no bytes at all for stall_reset_ms;
 *   - all at the node: stalled if no reply has come for stall_reset_ms since
 *     (the watchdog notices that on one of its looks, every stall_reset/2).
 * Drop the connection (its commands are answered with errors through
 * on_reply) and reconnect. */
static void on_watchdog(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    rl_node *n = w->data;
    if (n->link != RL_LINK_UP || n->ring_count == 0) return;
    double now = rl_now_ms();
    int outq = 0;
    if (ioctl(n->fd, SIOCOUTQ, &outq) != 0 || outq < 0) outq = 0;
    unsigned long long acked = n->written_total - (unsigned long long)outq;
    if (acked > n->acked) n->acked = acked, n->acked_ms = now;
    const rl_ticket *head = &n->ring[n->ring_head];
    double since;
    if (head->end > n->acked) {
        since = head->sent_ms > n->acked_ms ? head->sent_ms : n->acked_ms;
    } else {
        if (n->head_end != head->end) n->head_end = head->end, n->head_ms = now;
        since = n->head_ms > n->read_ms ? n->head_ms : n->read_ms;
    }
    if (now - since < n->opts->stall_reset_ms) return;
    if (socket_ready(n->fd, POLLIN)) return; /* replies are there, just not read yet */
    snprintf(n->errstr, sizeof(n->errstr), "connection reset: no reply for %d ms", n->opts->stall_reset_ms);
    drop(n, n->errstr);
}

/* ---- the interface ---- */

void rl_node_init(rl_node *n, const rl_url *url, int index, struct ev_loop *loop,
                  const rl_options *opts, rl_reply_fn on_reply_fn, void *owner, rl_node *peers, int npeers) {
    memset(n, 0, sizeof(*n));
    n->peers = peers;
    n->npeers = npeers;
    n->url = *url;
    n->index = index;
    n->loop = loop;
    n->opts = opts;
    n->on_reply = on_reply_fn;
    n->owner = owner;
    n->fd = -1;
    n->backoff_ms = opts->reconnect_min_ms;
    ev_io_init(&n->readable, on_readable, -1, EV_READ);
    ev_io_init(&n->writable, on_writable, -1, EV_WRITE);
    ev_timer_init(&n->connect_timer, on_connect_timeout, 0., 0.);
    ev_timer_init(&n->retry_timer, on_retry_timer, 0., 0.);
    double period = opts->stall_reset_ms / 2000.0;
    ev_timer_init(&n->watchdog, on_watchdog, period, period);
    n->readable.data = n->writable.data = n;
    n->connect_timer.data = n->retry_timer.data = n->watchdog.data = n;
    snprintf(n->errstr, sizeof(n->errstr), "not connected");
}

void rl_node_resolve(rl_node *n) {
    if (n->url.kind != RL_URL_TCP || rl_resolve_numeric(n->url.host, n->url.port, &n->addrs) == 0) return;
    n->named = 1;
    start_lookup(n);
}

void rl_node_start(rl_node *n, double deadline_ms) {
    if (n->lookup != NULL && !rl_lookup_wait(n->lookup, deadline_ms))
        snprintf(n->errstr, sizeof(n->errstr), "name resolution timed out after %d ms", n->opts->connect_timeout_ms);
    ev_timer_start(n->loop, &n->watchdog);
    connect_now(n);
}

int rl_node_send(rl_node *n, const char *cmd, size_t len, rl_ticket ticket) {
    if (n->fd < 0 && !n->closing && rl_now_ms() >= n->retry_at_ms) {
        /* The backoff is over but nobody drove the loop to fire the timer:
         * reconnect now and queue the command behind the connect. */
        connect_now(n);
    }
    if (n->fd < 0) return -1;
    return queue_command(n, cmd, len, ticket);
}

rl_mark rl_node_mark(const rl_node *n) {
    rl_mark m = {n->conn, n->queued_total};
    return m;
}

int rl_node_passed(const rl_node *n, rl_mark m) {
    return n->conn != m.conn || n->written_total >= m.end;
}

void rl_node_drop_if_unready(rl_node *n, const char *why) {
    if (n->fd >= 0 && n->holding) drop(n, why);
}

void rl_node_load_scripts(rl_node *n) {
    if (n->fd >= 0) queue_script_loads(n);
}

void rl_node_check_step(rl_node *n) {
    if (n->link == RL_LINK_DOWN || n->fd < 0 || n->step_check) return;
    char nonce[32], cmd[64];
    int nlen = step_nonce(n, nonce, sizeof(nonce));
    int len = snprintf(cmd, sizeof(cmd), "*2\r\n$4\r\nECHO\r\n$%d\r\n%s\r\n", nlen, nonce);
    rl_ticket t = {-1, 0, CHECK_ECHO, rl_now_ms(), 0, 0};
    if (queue_command(n, cmd, (size_t)len, t) == 0) n->step_check = 1;
}

void rl_node_close(rl_node *n) {
    n->closing = 1;
    rl_lookup_drop(n->lookup);
    n->lookup = NULL;
    close_socket(n);
    ev_timer_stop(n->loop, &n->retry_timer);
    ev_timer_stop(n->loop, &n->watchdog);
    free(n->ring);
    n->ring = NULL;
    n->ring_cap = n->ring_count = n->ring_head = 0;
    rl_buf_free(&n->out);
}
