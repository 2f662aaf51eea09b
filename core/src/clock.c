/* clock.c — the monotonic clock every timing decision uses, and the wall
 * clock of a semaphore's waiters' tickets. */
#include <time.h>

#include "redlock.h"

/* Return CLOCK_MONOTONIC in milliseconds (fractional). Never fails on Linux. */
double rl_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Return CLOCK_REALTIME in milliseconds (fractional) since the epoch. */
double rl_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
