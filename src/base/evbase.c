/* evbase.c - see evbase.h.
 *
 * Why not event_base_new(): on Linux libevent then reads time from
 * CLOCK_MONOTONIC_COARSE, which moves once per kernel tick (4 ms at
 * HZ=250).  A timer due in 100 ms wakes the loop after 97 ms, the coarse
 * clock says it is not due yet, and the loop waits 1 ms at a time until the
 * clock catches up: three or four wake-ups for every timer instead of one,
 * which was most of an idle node's system time (measured with strace:
 * epoll_wait(..., 1) three times after each timeout).  The precise timer
 * reads CLOCK_MONOTONIC and lets the epoll backend sleep on a timerfd. */
#include "base/evbase.h"

#include <event2/event.h>

struct event_base *rc_event_base_new(void)
{
    struct event_config *cfg = event_config_new();
    if (!cfg)
        return NULL;
    event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    struct event_base *b = event_base_new_with_config(cfg);
    event_config_free(cfg);
    return b ? b : event_base_new();
}
