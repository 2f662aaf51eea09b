/* clock.c — the monotonic clock every timing decision uses. */
#include <time.h>

#include "redlock.h"

/* Return CLOCK_MONOTONIC in milliseconds (fractional). Never fails on Linux. */
double rl_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
