/* nodes.h — real redis-server processes for the C tests that need a network:
 * a free loopback port, a node started on it, and stopping it by pid. */
#ifndef RL_TEST_NODES_H
#define RL_TEST_NODES_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* 1 if redis-server is on PATH (tests skip with exit 77 otherwise). */
static int have_redis_server(void) {
    return system("command -v redis-server >/dev/null 2>&1") == 0;
}

/* A loopback port nothing listens on right now, or -1. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* Start redis-server on 127.0.0.1:port, without persistence; return its pid. */
static pid_t start_node(int port) {
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL) _exit(127);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Start n nodes on free loopback ports: ports[i], pids[i], their URLs in
 * urls[i] ("redis://127.0.0.1:port") and url_list[i] pointing at each. */
static inline void start_nodes(int n, int *ports, pid_t *pids, char (*urls)[64], const char **url_list) {
    for (int i = 0; i < n; i++) {
        ports[i] = free_port();
        pids[i] = start_node(ports[i]);
        snprintf(urls[i], sizeof(urls[i]), "redis://127.0.0.1:%d", ports[i]);
        url_list[i] = urls[i];
    }
}

/* Stop the node with pid *pid (also when it is SIGSTOPped) and reap it. */
static void kill_node(pid_t *pid) {
    if (*pid > 0) {
        kill(*pid, SIGCONT);
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
        *pid = 0;
    }
}

#endif
