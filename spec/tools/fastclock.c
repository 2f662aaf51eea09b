/*
 * rl-fastclock.so — an LD_PRELOAD shim that makes a process's wall clock run
 * fast, for spec/safety_clock_spec.lua.
 *
 *   env LD_PRELOAD=build/spec/tools/rl-fastclock.so RL_FASTCLOCK_RATE=4 redis-server ...
 *
 * From the moment the library is loaded, CLOCK_REALTIME (and its _COARSE
 * variant), gettimeofday() and time() advance RL_FASTCLOCK_RATE times as fast
 * as the real clock (a positive number; 1 if unset or invalid). Other clocks
 * (CLOCK_MONOTONIC, ...) are left alone. Redis computes key expiry from the
 * wall clock, so on such a node a key with PX ttl expires after ttl/rate ms.
 *
 * libfaketime does the same with `faketime -f x4`, but it cannot start in a
 * process linked with jemalloc (Debian's redis-server is): both call
 * clock_gettime() while initialising and libfaketime gives up on the
 * recursion. This shim needs no dlsym(): it reads the real clock with the raw
 * system call, so it has nothing to initialise but two numbers.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static double rate = 1.0;
static struct timespec origin; /* the real wall clock when loaded */

static int real_clock_gettime(clockid_t clk, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

__attribute__((constructor)) static void fastclock_init(void) {
    const char *s = getenv("RL_FASTCLOCK_RATE");
    char *end = NULL;
    double r = s ? strtod(s, &end) : 1.0;
    if (s && end != s && *end == '\0' && r > 0) rate = r;
    real_clock_gettime(CLOCK_REALTIME, &origin);
}

/* The fast wall clock: origin + (real - origin) * rate. */
static void fast_now(clockid_t clk, struct timespec *ts) {
    struct timespec now;
    real_clock_gettime(clk, &now);
    double since = (double)(now.tv_sec - origin.tv_sec) * 1e9 + (double)(now.tv_nsec - origin.tv_nsec);
    double fake = since * rate;
    long long sec = (long long)(fake / 1e9);
    long long nsec = (long long)(fake - (double)sec * 1e9);
    sec += origin.tv_sec;
    nsec += origin.tv_nsec;
    while (nsec >= 1000000000LL) { nsec -= 1000000000LL; sec++; }
    while (nsec < 0) { nsec += 1000000000LL; sec--; }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)nsec;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    if (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE) {
        fast_now(clk, ts);
        return 0;
    }
    return real_clock_gettime(clk, ts);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    fast_now(CLOCK_REALTIME, &ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    fast_now(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
