/* clock.c — the monotonic clock every timing decision uses, and the wall
 * clock of a semaphore's waiters' tickets.
 *
 * CLOCK_BOOTTIME, not CLOCK_MONOTONIC: both never go back, but only
 * BOOTTIME goes on while the machine is suspended (a laptop's lid, a VM
 * whose guest clock stops). The nodes' keys expire all the same meanwhile,
 * so a lock's validity counted on CLOCK_MONOTONIC would outlive them by
 * the time suspended. */
#include <time.h>

#include "redlock.h"

/* Return CLOCK_BOOTTIME in milliseconds (fractional). Never fails on Linux. */
double rl_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Return CLOCK_REALTIME in milliseconds (fractional) since the epoch. */
double rl_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
