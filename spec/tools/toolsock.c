/* toolsock.c — see toolsock.h. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "toolsock.h"

volatile sig_atomic_t stop_requested;
static const char *tool_name = "rl-tool";

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

void tool_init(const char *name) {
    tool_name = name;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void die(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", tool_name, what, strerror(errno));
    exit(1);
}

int listen_loopback(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0) die("bind");
    if (listen(fd, 64) != 0) die("listen");
    socklen_t alen = sizeof addr;
    if (getsockname(fd, (struct sockaddr *)&addr, &alen) != 0) die("getsockname");
    *port = ntohs(addr.sin_port);
    return fd;
}

void write_file_atomic(const char *path, const char *text) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) die(tmp);
    fputs(text, f);
    if (fclose(f) != 0) die(tmp);
    if (rename(tmp, path) != 0) die(path);
}

void write_portfile(const char *path, int port) {
    char line[16];
    snprintf(line, sizeof line, "%d\n", port);
    write_file_atomic(path, line);
}

void reset_close(int fd) {
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}
