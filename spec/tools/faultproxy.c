/*
 * rl-faultproxy — a TCP proxy in front of one Redis node that injects faults.
 *
 *   rl-faultproxy PORTFILE UPSTREAM_PORT CONTROLFILE
 *
 * Listens on 127.0.0.1, port chosen by the kernel, writes that port to
 * PORTFILE (atomically), and forwards every accepted connection to
 * 127.0.0.1:UPSTREAM_PORT. What it does to the traffic is read from
 * CONTROLFILE, re-read every few milliseconds (write it atomically: to a
 * temporary name, then rename). Its first word is the mode:
 *
 *   pass        forward both ways (also when CONTROLFILE is missing)
 *   delay MS    hold every reply (upstream -> client) MS milliseconds
 *   stall       forward nothing, keep everything; when the mode changes the
 *               held bytes flow again, in order (a network that freezes)
 *   blackhole   read and discard everything, both ways (a partition)
 *   drop        forward requests, discard replies (replies lost after the
 *               command was applied)
 *   reset       close every connection with a RST, and each new one at once
 *   throttle N  forward requests at N bytes per millisecond, replies at once
 *               (a slow link: a large command takes a while to get through)
 *   cut N       forward requests, and only the first N bytes of replies on
 *               each connection; discard the rest, keeping the connection
 *               (a server that stops halfway through its first answer: a
 *               TLS ServerHello half sent)
 *
 * Byte order per direction is always preserved. Every connection accepted
 * is a line "accept" on stdout, so a spec can count connections. Exits on
 * SIGTERM/SIGINT.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "toolsock.h"

#define MAX_PAIRS 64
#define CHUNK 16384
#define TICK_MS 2

enum mode { M_PASS, M_DELAY, M_STALL, M_BLACKHOLE, M_DROP, M_RESET, M_THROTTLE, M_CUT };

/* A chunk of bytes waiting to be forwarded, due at a time (ms). */
struct chunk {
    struct chunk *next;
    double due;
    size_t off, len;
    char data[];
};

/* One direction of a connection: bytes read from src, queued for dst. */
struct pipe_dir {
    struct chunk *head, *tail;
};

struct pair {
    int client, upstream;
    struct pipe_dir up;   /* client -> upstream (requests) */
    struct pipe_dir down; /* upstream -> client (replies) */
    long replied;         /* reply bytes forwarded (or queued) so far */
};

static enum mode mode = M_PASS;
static int delay_ms;      /* delay: the delay; throttle: bytes per ms; cut: reply bytes per connection */
static double budget;     /* throttle: request bytes that may be read now */
static double budget_at;  /* when budget was last topped up */


static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

static void set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}


static void dir_clear(struct pipe_dir *d) {
    while (d->head) {
        struct chunk *c = d->head;
        d->head = c->next;
        free(c);
    }
    d->tail = NULL;
}

static void dir_push(struct pipe_dir *d, const char *data, size_t len, double due) {
    struct chunk *c = malloc(sizeof *c + len);
    if (!c) die("malloc");
    c->next = NULL;
    c->due = due;
    c->off = 0;
    c->len = len;
    memcpy(c->data, data, len);
    if (d->tail) d->tail->next = c;
    else d->head = c;
    d->tail = c;
}

/* Write the due chunks of d to fd; return -1 if fd failed. */
static int dir_flush(struct pipe_dir *d, int fd, double now) {
    while (d->head && d->head->due <= now) {
        struct chunk *c = d->head;
        ssize_t w = send(fd, c->data + c->off, c->len - c->off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
            return -1;
        }
        c->off += (size_t)w;
        if (c->off < c->len) return 0;
        d->head = c->next;
        if (!d->head) d->tail = NULL;
        free(c);
    }
    return 0;
}

static void close_pair(struct pair *p, int rst) {
    if (rst) {
        reset_close(p->client);
        reset_close(p->upstream);
    } else {
        close(p->client);
        close(p->upstream);
    }
    dir_clear(&p->up);
    dir_clear(&p->down);
}

/* Re-read the control file; return 1 if the mode changed. */
static int read_control(const char *path) {
    char buf[128] = {0};
    enum mode m = M_PASS;
    int d = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fclose(f);
        char word[32] = {0};
        if (sscanf(buf, "%31s %d", word, &d) < 1) word[0] = '\0';
        if (strcmp(word, "delay") == 0) m = M_DELAY;
        else if (strcmp(word, "stall") == 0) m = M_STALL;
        else if (strcmp(word, "blackhole") == 0) m = M_BLACKHOLE;
        else if (strcmp(word, "drop") == 0) m = M_DROP;
        else if (strcmp(word, "reset") == 0) m = M_RESET;
        else if (strcmp(word, "throttle") == 0) m = M_THROTTLE;
        else if (strcmp(word, "cut") == 0) m = M_CUT;
        else m = M_PASS;
        if (m != M_DELAY && m != M_THROTTLE && m != M_CUT) d = 0;
        if (m == M_THROTTLE && d < 1) d = 1;
        if (d < 0) d = 0;
    }
    int changed = (m != mode || d != delay_ms);
    mode = m;
    delay_ms = d;
    return changed;
}

/* Due time for bytes read now in one direction; < 0 means discard. */
static double due_for(int replies, double now) {
    switch (mode) {
    case M_PASS: return now;
    case M_DELAY: return replies ? now + delay_ms : now;
    case M_STALL: return 1e300;
    case M_BLACKHOLE: return -1;
    case M_DROP: return replies ? -1 : now;
    case M_RESET: return -1;
    case M_THROTTLE: return now;
    case M_CUT: return now;
    }
    return now;
}

static void release_held(struct pipe_dir *d, double now) {
    for (struct chunk *c = d->head; c; c = c->next)
        if (c->due > 1e299) c->due = now;
}

/* Throttle: add what the rate allows since the last top-up (at most a few
 * ticks' worth, so an idle spell does not let a burst through). */
static void top_up(double now) {
    double cap = (double)delay_ms * TICK_MS * 4;
    budget += (now - budget_at) * delay_ms;
    if (budget > cap) budget = cap;
    budget_at = now;
}

/* How many request bytes may be read now. */
static size_t request_room(void) {
    if (mode != M_THROTTLE) return CHUNK;
    return budget < 1 ? 0 : budget < CHUNK ? (size_t)budget : CHUNK;
}

/* Read what src has into d (the replies of p, or its requests); return -1
 * when the pair should close. */
static int pump(struct pair *p, int replies, double now) {
    char buf[CHUNK];
    int src = replies ? p->upstream : p->client;
    struct pipe_dir *d = replies ? &p->down : &p->up;
    size_t room = replies ? CHUNK : request_room();
    if (room == 0) return 0;
    ssize_t r = recv(src, buf, room, 0);
    if (r < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    if (r == 0) return -1;
    if (!replies && mode == M_THROTTLE) budget -= (double)r;
    if (replies && mode == M_CUT) {
        long left = delay_ms - p->replied;
        if (left < r) r = left > 0 ? left : 0;
    }
    if (replies) p->replied += r;
    double due = due_for(replies, now);
    if (due >= 0 && r > 0) dir_push(d, buf, (size_t)r, due);
    return 0;
}


/* How long poll may sleep: until the next tick (the control file is read
 * once a tick), or until the first held chunk falls due if that is sooner,
 * so a delay is held for its time and not up to a tick more. (A chunk
 * already due waits for its socket: POLLOUT.) */
static int poll_timeout(const struct pair *pairs, int npairs, double now) {
    double wake = now + TICK_MS;
    for (int i = 0; i < npairs; i++) {
        const struct chunk *heads[2] = {pairs[i].up.head, pairs[i].down.head};
        for (int k = 0; k < 2; k++)
            if (heads[k] && heads[k]->due > now && heads[k]->due < wake) wake = heads[k]->due;
    }
    double ms = wake - now;
    return ms <= 0 ? 0 : (int)ms + (ms > (int)ms);
}

static int connect_upstream(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((unsigned short)port);
    /* Loopback: a blocking connect is immediate (accepted or refused). */
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    set_nonblock(fd);
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: rl-faultproxy PORTFILE UPSTREAM_PORT CONTROLFILE\n");
        return 2;
    }
    int upstream_port = atoi(argv[2]);
    const char *control = argv[3];
    if (upstream_port <= 0 || upstream_port > 65535) {
        fprintf(stderr, "rl-faultproxy: bad upstream port %s\n", argv[2]);
        return 2;
    }
    tool_init("rl-faultproxy");

    int port;
    int lfd = listen_loopback(&port);
    read_control(control);
    write_portfile(argv[1], port);

    static struct pair pairs[MAX_PAIRS];
    int npairs = 0;
    struct pollfd pfds[1 + 2 * MAX_PAIRS];

    double control_at = 0; /* when the control file is read next: once a tick, not every wake-up */
    while (!stop_requested) {
        double now = now_ms();
        top_up(now);
        int changed = 0;
        if (now >= control_at) {
            changed = read_control(control);
            control_at = now + TICK_MS;
        }
        if (changed) {
            for (int i = 0; i < npairs; i++) {
                if (mode == M_RESET) {
                    close_pair(&pairs[i], 1);
                    continue;
                }
                if (mode != M_STALL) {
                    release_held(&pairs[i].up, now);
                    release_held(&pairs[i].down, now);
                }
            }
            if (mode == M_RESET) npairs = 0;
        }

        /* Forward what is due; drop pairs whose sockets failed. */
        for (int i = npairs - 1; i >= 0; i--) {
            struct pair *p = &pairs[i];
            if (dir_flush(&p->up, p->upstream, now) < 0 ||
                dir_flush(&p->down, p->client, now) < 0) {
                close_pair(p, 0);
                pairs[i] = pairs[--npairs];
            }
        }

        pfds[0].fd = lfd;
        pfds[0].events = POLLIN;
        for (int i = 0; i < npairs; i++) {
            pfds[1 + 2 * i].fd = pairs[i].client;
            pfds[1 + 2 * i].events = (request_room() > 0 ? POLLIN : 0) | (pairs[i].down.head ? POLLOUT : 0);
            pfds[2 + 2 * i].fd = pairs[i].upstream;
            pfds[2 + 2 * i].events = POLLIN | (pairs[i].up.head ? POLLOUT : 0);
        }
        int n = poll(pfds, (nfds_t)(1 + 2 * npairs), poll_timeout(pairs, npairs, now));
        if (n < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        now = now_ms();
        for (int i = npairs - 1; i >= 0; i--) {
            struct pair *p = &pairs[i];
            short cr = pfds[1 + 2 * i].revents, ur = pfds[2 + 2 * i].revents;
            int bad = 0;
            if (cr & (POLLIN | POLLHUP | POLLERR)) bad |= pump(p, 0, now) < 0;
            if (!bad && (ur & (POLLIN | POLLHUP | POLLERR))) bad |= pump(p, 1, now) < 0;
            if (bad) {
                /* Deliver what is already due before closing, like a real peer. */
                dir_flush(&p->down, p->client, now);
                dir_flush(&p->up, p->upstream, now);
                close_pair(p, 0);
                pairs[i] = pairs[--npairs];
            }
        }
        if (pfds[0].revents & POLLIN) {
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0) continue;
            printf("accept\n");
            fflush(stdout);
            if (mode == M_RESET || npairs == MAX_PAIRS) {
                reset_close(fd);
                continue;
            }
            int up = connect_upstream(upstream_port);
            if (up < 0) {
                reset_close(fd);
                continue;
            }
            set_nonblock(fd);
            memset(&pairs[npairs], 0, sizeof pairs[npairs]);
            pairs[npairs].client = fd;
            pairs[npairs].upstream = up;
            npairs++;
        }
    }
    for (int i = 0; i < npairs; i++) close_pair(&pairs[i], 0);
    close(lfd);
    return 0;
}
