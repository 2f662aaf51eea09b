/*
 * rl-fakeserver — a TCP server that pretends to be a Redis node and is wrong.
 *
 *   rl-fakeserver MODE PORTFILE
 *
 * Listens on 127.0.0.1, port chosen by the kernel, and writes that port to
 * PORTFILE (atomically: written to PORTFILE.tmp, then renamed). Then serves
 * any number of connections according to MODE:
 *
 *   garbage   answers any input with bytes that are not RESP
 *   silent    accepts and reads, never answers
 *   reset     accepts, then closes at once with a RST (SO_LINGER 0)
 *   error     answers every command with  -ERR boom
 *   readonly  answers every command with  -READONLY You can't write against a read only replica.
 *   oom       answers every command with  -OOM command not allowed when used memory > 'maxmemory'.
 *   loading   answers every command with  -LOADING Redis is loading the dataset in memory
 *   ok        answers every command with  +OK (right for SET, wrong for everything else)
 *   noscript  answers every command with  -NOSCRIPT No matching script. Please use EVAL.
 *   huge      answers every command with a string declared 1 GB long
 *             ($1073741824), then sends its bytes for as long as the peer takes them
 *   nested    answers INFO as a server would, then every other command with
 *             an array of 1000 arrays of 1000 arrays of 1000 integers, sent
 *             as fast as it is taken (each array small, the reply 4 GB);
 *             a process a connection
 *   escape    answers every command with an error full of terminal escapes:
 *             -ERR ESC]0;pwned BEL ESC[2J ESC[31mRED
 *   integer   answers INFO as a server would, then every other command
 *             with :1 (right for EVAL, wrong for SET)
 *   drip      answers INFO as a server would, then every other command with
 *             a string declared 60000 bytes long ($60000), whose bytes come
 *             one every 10 ms (the reply would take 10 minutes to end);
 *             a process a connection
 *
 * Commands are counted by parsing RESP arrays (and inline commands), so a
 * pipeline of k commands gets exactly k replies. Every command is logged on
 * stdout as a line "cmd NAME" (its first word, upper-cased), so a spec can
 * count what the node was sent; every connection accepted is a line
 * "accept", so a spec can count connections. Exits on SIGTERM/SIGINT.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "toolsock.h"

#define MAX_CONNS 128
#define BUF_CAP 65536

enum mode { M_GARBAGE, M_SILENT, M_RESET, M_ERROR, M_READONLY, M_OOM, M_LOADING, M_OK, M_NOSCRIPT, M_HUGE, M_NESTED, M_ESCAPE, M_INTEGER, M_DRIP };

#define HUGE_LEN 1073741824L

static int listen_port; /* what INFO's run_id is made of */

struct conn {
    int fd;
    size_t len;
    char buf[BUF_CAP];
};

static int parse_mode(const char *s, enum mode *m) {
    static const struct { const char *name; enum mode m; } modes[] = {
        {"garbage", M_GARBAGE}, {"silent", M_SILENT},   {"reset", M_RESET},
        {"error", M_ERROR},     {"readonly", M_READONLY}, {"oom", M_OOM},
        {"loading", M_LOADING}, {"ok", M_OK},     {"noscript", M_NOSCRIPT},
        {"huge", M_HUGE},       {"nested", M_NESTED}, {"drip", M_DRIP},
        {"escape", M_ESCAPE},   {"integer", M_INTEGER},
    };
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (strcmp(s, modes[i].name) == 0) {
            *m = modes[i].m;
            return 0;
        }
    }
    return -1;
}

static const char *reply_for(enum mode m) {
    switch (m) {
    case M_ERROR: return "-ERR boom\r\n";
    case M_READONLY: return "-READONLY You can't write against a read only replica.\r\n";
    case M_OOM: return "-OOM command not allowed when used memory > 'maxmemory'.\r\n";
    case M_LOADING: return "-LOADING Redis is loading the dataset in memory\r\n";
    case M_OK: return "+OK\r\n";
    case M_NOSCRIPT: return "-NOSCRIPT No matching script. Please use EVAL.\r\n";
    case M_HUGE: return "$1073741824\r\n";
    case M_NESTED: return "*1000\r\n";
    case M_DRIP: return "$60000\r\n";
    case M_ESCAPE: return "-ERR \x1b]0;pwned\x07\x1b[2J\x1b[31mRED\r\n";
    case M_INTEGER: return ":1\r\n";
    default: return NULL;
    }
}

/* Write all of s (blocking socket); return -1 if the peer went away. */
static int write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR && !stop_requested) continue;
            return -1;
        }
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Find "\r\n" in p[0..n); return offset of '\r' or -1. */
static long find_crlf(const char *p, size_t n) {
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '\r' && p[i + 1] == '\n') return (long)i;
    return -1;
}

/*
 * Length of the first complete command in p[0..n): 0 if incomplete, -1 if
 * malformed. Understands RESP arrays of bulk strings and inline commands.
 */
static long command_length(const char *p, size_t n) {
    if (n == 0) return 0;
    long eol = find_crlf(p, n);
    if (eol < 0) return 0;
    if (p[0] != '*') return eol + 2; /* inline command */
    long count = strtol(p + 1, NULL, 10);
    size_t off = (size_t)eol + 2;
    for (long i = 0; i < count; i++) {
        if (off >= n) return 0;
        if (p[off] != '$') return -1;
        long e = find_crlf(p + off, n - off);
        if (e < 0) return 0;
        long blen = strtol(p + off + 1, NULL, 10);
        if (blen < 0) return -1;
        off += (size_t)e + 2;
        if (off + (size_t)blen + 2 > n) return 0;
        off += (size_t)blen + 2;
    }
    return (long)off;
}

/* Print "cmd NAME" for the command of k bytes at p: its first word. */
static void log_command(const char *p, long k) {
    const char *w = p;
    long n = 0;
    if (p[0] == '*') {
        /* *N\r\n$L\r\nNAME\r\n */
        long e = find_crlf(p, (size_t)k);
        if (e < 0 || e + 2 >= k || p[e + 2] != '$') return;
        long e2 = find_crlf(p + e + 2, (size_t)(k - e - 2));
        if (e2 < 0) return;
        w = p + e + 2 + e2 + 2;
        n = strtol(p + e + 3, NULL, 10);
        if (n < 0 || w + n > p + k) return;
    } else {
        while (n < k && p[n] != ' ' && p[n] != '\r') n++;
    }
    char name[32];
    long m = n < (long)sizeof(name) - 1 ? n : (long)sizeof(name) - 1;
    for (long i = 0; i < m; i++) name[i] = (char)toupper((unsigned char)w[i]);
    name[m] = '\0';
    printf("cmd %s\n", name);
    fflush(stdout);
}

/* The payload of a huge reply: as much of it as the peer takes. Return -1
 * once the peer has gone (it always goes: nobody wants 1 GB), or has taken
 * nothing for 200 ms (so one idle client cannot keep the others waiting). */
static int send_huge(int fd) {
    static char chunk[65536];
    memset(chunk, 'x', sizeof(chunk));
    for (long sent = 0; sent < HUGE_LEN; sent += (long)sizeof(chunk)) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 200) != 1 || stop_requested) return -1;
        if (write_all(fd, chunk, sizeof(chunk)) < 0) return -1;
    }
    return write_all(fd, "\r\n", 2);
}

/* A reply that never ends though each array in it is small: after the
 * reply's header (an array of 1000), its elements, each an array of 1000
 * arrays of 1000 integers (4 MB), as fast as the peer takes them, until it
 * goes (or takes nothing for 10 s, or 1 GB has gone). Its own process: it
 * may wait. */
static int send_nested(int fd) {
    enum { ARRAY = 7 + 1000 * 4, ELEMENT = 7 + 1000 * ARRAY };
    static char element[ELEMENT];
    memcpy(element, "*1000\r\n", 7);
    for (int a = 0; a < 1000; a++) {
        char *p = element + 7 + a * ARRAY;
        memcpy(p, "*1000\r\n", 7);
        for (int i = 0; i < 1000; i++) memcpy(p + 7 + 4 * i, ":1\r\n", 4);
    }
    for (long sent = 0; sent < HUGE_LEN; sent += (long)sizeof(element)) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 10000) != 1 || stop_requested) return -1;
        if (write_all(fd, element, sizeof(element)) < 0) return -1;
    }
    return -1;
}

/* The payload of a dripped reply: a byte every 10 ms, until the peer goes
 * (or 60000 bytes have gone). Its own process: it waits. */
static int send_drip(int fd) {
    for (int sent = 0; sent < 60000; sent++) {
        if (stop_requested || write_all(fd, "x", 1) < 0) return -1;
        usleep(10000);
    }
    return write_all(fd, "\r\n", 2);
}

/* Handle readable data on c; return -1 when the connection should close. */
static int serve(struct conn *c, enum mode m) {
    ssize_t r = recv(c->fd, c->buf + c->len, BUF_CAP - c->len, 0);
    if (r < 0 && errno == EINTR) return 0;
    if (r <= 0) return -1;
    c->len += (size_t)r;
    if (m == M_SILENT) {
        c->len = 0;
        return 0;
    }
    if (m == M_GARBAGE) {
        static const char junk[] = "HTTP/1.1 400 Bad Request\r\n\r\n\x01\x02\xff garbage";
        c->len = 0;
        return write_all(c->fd, junk, sizeof junk - 1);
    }
    const char *reply = reply_for(m);
    for (;;) {
        long k = command_length(c->buf, c->len);
        if (k < 0) return -1;
        if (k == 0) break;
        log_command(c->buf, k);
        int info = k > 14 && memcmp(c->buf, "*2\r\n$4\r\nINFO\r\n", 14) == 0;
        memmove(c->buf, c->buf + k, c->len - (size_t)k);
        c->len -= (size_t)k;
        if ((m == M_NESTED || m == M_DRIP || m == M_INTEGER) && info) { /* the setup passes: the trouble comes with the first real command */
            char server[80]; /* a run_id of its own: fake servers side by side are not one server */
            int n = snprintf(server, sizeof(server), "$59\r\n# Server\r\nrun_id:%040x\r\n\r\n", (unsigned)listen_port);
            if (write_all(c->fd, server, (size_t)n) < 0) return -1;
            continue;
        }
        if (write_all(c->fd, reply, strlen(reply)) < 0) return -1;
        if (m == M_HUGE && send_huge(c->fd) < 0) return -1;
        if (m == M_NESTED && send_nested(c->fd) < 0) return -1;
        if (m == M_DRIP && send_drip(c->fd) < 0) return -1;
    }
    if (c->len == BUF_CAP) return -1; /* a command larger than we care for */
    return 0;
}


int main(int argc, char **argv) {
    enum mode m;
    if (argc != 3 || parse_mode(argv[1], &m) != 0) {
        fprintf(stderr,
                "usage: rl-fakeserver garbage|silent|reset|error|readonly|oom|loading|ok|noscript|huge|nested|escape|integer|drip PORTFILE\n");
        return 2;
    }
    tool_init("rl-fakeserver");
    if (m == M_NESTED || m == M_DRIP) signal(SIGCHLD, SIG_IGN); /* its per-connection processes reap themselves */

    int port;
    int lfd = listen_loopback(&port);
    listen_port = port;
    write_portfile(argv[2], port);

    static struct conn conns[MAX_CONNS];
    int nconns = 0;
    struct pollfd pfds[MAX_CONNS + 1];

    while (!stop_requested) {
        pfds[0].fd = lfd;
        pfds[0].events = POLLIN;
        for (int i = 0; i < nconns; i++) {
            pfds[i + 1].fd = conns[i].fd;
            pfds[i + 1].events = POLLIN;
        }
        int n = poll(pfds, (nfds_t)nconns + 1, 200);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        /* Serve existing connections first; indexes shift when one closes. */
        for (int i = nconns - 1; i >= 0; i--) {
            if (!(pfds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (serve(&conns[i], m) < 0) {
                close(conns[i].fd);
                conns[i] = conns[nconns - 1];
                nconns--;
            }
        }
        if (pfds[0].revents & POLLIN) {
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0) continue;
            printf("accept\n");
            fflush(stdout);
            if (m == M_RESET || nconns == MAX_CONNS) {
                reset_close(fd);
                continue;
            }
            if (m == M_NESTED || m == M_DRIP) { /* a process per connection: each sends on its own, without pause */
                pid_t pid = fork();
                if (pid == 0) {
                    close(lfd);
                    struct conn *c = &conns[nconns];
                    c->fd = fd;
                    c->len = 0;
                    while (!stop_requested && serve(c, m) == 0) {}
                    _exit(0);
                }
                close(fd);
                continue;
            }
            conns[nconns].fd = fd;
            conns[nconns].len = 0;
            nconns++;
        }
    }
    for (int i = 0; i < nconns; i++) close(conns[i].fd);
    close(lfd);
    return 0;
}
