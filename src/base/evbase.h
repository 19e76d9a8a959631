/* evbase.h - the event loops of long-running threads (the API server, the
 * cluster): a libevent base whose timers wake the loop once, on time. */
#ifndef RC_EVBASE_H
#define RC_EVBASE_H

struct event_base;

/* NULL when libevent cannot set one up. */
struct event_base *rc_event_base_new(void);

#endif
