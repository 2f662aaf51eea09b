/* toolsock.h — what the fault tools share: stop signals, a loopback
 * listener on a kernel-chosen port, the port file (or any small file written
 * atomically), fatal errors, RST closes. */
#ifndef RL_TOOLSOCK_H
#define RL_TOOLSOCK_H

#include <signal.h>

/* Set once SIGTERM or SIGINT arrived; the tool's loop then exits. */
extern volatile sig_atomic_t stop_requested;

/* Name the tool for messages, catch SIGTERM/SIGINT, ignore SIGPIPE. */
void tool_init(const char *name);

/* Print "name: what: strerror(errno)" and exit 1. */
void die(const char *what);

/* Listen on 127.0.0.1 at a port the kernel picks; return the socket and put
 * the port in *port. Dies on failure. */
int listen_loopback(int *port);

/* Write text to path atomically (a temporary name, then rename). Dies on failure. */
void write_file_atomic(const char *path, const char *text);

/* Write port to path atomically, as a line. Dies on failure. */
void write_portfile(const char *path, int port);

/* Close fd with a TCP RST (SO_LINGER 0). */
void reset_close(int fd);

#endif
