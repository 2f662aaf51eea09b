/*
 * rl-fakedns — a DNS server on UDP port 53 that is slow on purpose.
 *
 *   rl-fakedns ADDRFILE CONTROLFILE
 *
 * Binds UDP port 53 (needs root) on a loopback address 127.53.X.Y picked at
 * random, so that runs side by side do not collide, and writes that address
 * to ADDRFILE (atomically). A resolv.conf naming it as the nameserver then
 * sends every lookup here. What it does with a query is read from
 * CONTROLFILE each time one arrives (write it atomically). Its first word:
 *
 *   deaf         read the query and never answer (also when CONTROLFILE is
 *                missing): the resolver waits out its whole timeout
 *   answer ADDR  answer an A query with the IPv4 address ADDR, and any other
 *                query with no records
 *
 * Every query is logged on stdout, one line each: "query NAME TYPE deaf" or
 * "query NAME TYPE answered". Exits on SIGTERM/SIGINT.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "toolsock.h"

#define DNS_HEADER 12
#define TYPE_A 1
#define CLASS_IN 1

/* Bind UDP port 53 on some 127.53.X.Y; put the address in text. Dies on failure. */
static int bind_dns(char *text, size_t len) {
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    for (int tries = 0; tries < 64; tries++) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket");
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons(53);
        a.sin_addr.s_addr = htonl((127u << 24) | (53u << 16) | (unsigned)(rand() % 250 + 1) << 8 |
                                  (unsigned)(rand() % 250 + 1));
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            inet_ntop(AF_INET, &a.sin_addr, text, (socklen_t)len);
            return fd;
        }
        if (errno != EADDRINUSE) die("bind 127.53.X.Y:53");
        close(fd);
    }
    die("bind 127.53.X.Y:53 (every address tried was taken)");
    return -1;
}

/* The control file's mode: 1 and *addr set for "answer ADDR", else 0 (deaf). */
static int read_control(const char *path, struct in_addr *addr) {
    char buf[128] = {0}, word[32] = {0}, ip[64] = {0};
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    if (sscanf(buf, "%31s %63s", word, ip) == 2 && strcmp(word, "answer") == 0 && inet_pton(AF_INET, ip, addr) == 1)
        return 1;
    return 0;
}

/* Walk the question's name from off; write it dotted into name. Return the
 * offset just past it, or -1 if the packet is malformed (or compressed). */
static int read_name(const unsigned char *p, int len, int off, char *name, size_t cap) {
    size_t o = 0;
    name[0] = '\0';
    while (off < len) {
        int label = p[off++];
        if (label == 0) return off;
        if (label > 63 || off + label > len) return -1;
        if (o + (size_t)label + 2 > cap) return -1;
        if (o > 0) name[o++] = '.';
        memcpy(name + o, p + off, (size_t)label);
        o += (size_t)label;
        name[o] = '\0';
        off += label;
    }
    return -1;
}

static void put16(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: rl-fakedns ADDRFILE CONTROLFILE\n");
        return 2;
    }
    tool_init("rl-fakedns");
    setvbuf(stdout, NULL, _IOLBF, 0);
    char where[INET_ADDRSTRLEN];
    int fd = bind_dns(where, sizeof where);
    char line[64];
    snprintf(line, sizeof line, "%s\n", where);
    write_file_atomic(argv[1], line);

    unsigned char q[512], r[512 + 16];
    while (!stop_requested) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ready = poll(&pfd, 1, 100);
        if (ready < 0 && errno != EINTR) die("poll");
        if (ready <= 0) continue;
        struct sockaddr_in from;
        socklen_t flen = sizeof from;
        ssize_t got = recvfrom(fd, q, sizeof q, 0, (struct sockaddr *)&from, &flen);
        if (got < DNS_HEADER + 5) continue;
        char name[256];
        int end = read_name(q, (int)got, DNS_HEADER, name, sizeof name);
        if (end < 0 || end + 4 > got) continue;
        unsigned qtype = (unsigned)q[end] << 8 | q[end + 1];
        end += 4; /* type and class */

        struct in_addr addr;
        if (!read_control(argv[2], &addr)) {
            printf("query %s %u deaf\n", name, qtype);
            continue;
        }
        /* The reply: the query's id and question, "response, authoritative,
         * recursion available, no error", and one A record or none. */
        memcpy(r, q, (size_t)end);
        r[2] = (unsigned char)(0x80 | (q[2] & 0x79) | 0x04); /* QR, opcode and RD kept, AA */
        r[3] = 0x80;                                         /* RA, RCODE 0 */
        put16(r + 4, 1);
        int answers = qtype == TYPE_A;
        put16(r + 6, (unsigned)answers);
        put16(r + 8, 0);
        put16(r + 10, 0);
        int len = end;
        if (answers) {
            static const unsigned char rr[] = {0xc0, DNS_HEADER, 0, TYPE_A, 0, CLASS_IN, 0, 0, 0, 0, 0, 4};
            memcpy(r + len, rr, sizeof rr);
            len += (int)sizeof rr;
            memcpy(r + len, &addr, 4);
            len += 4;
        }
        sendto(fd, r, (size_t)len, 0, (struct sockaddr *)&from, flen);
        printf("query %s %u answered\n", name, qtype);
    }
    close(fd);
    return 0;
}
