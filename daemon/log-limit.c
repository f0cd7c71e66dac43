/* log-limit.c - see log-limit.h. */
#include "daemon/log-limit.h"

int dlog_limit_take(struct dlog_limit *l, double now, unsigned long long *held_before)
{
    *held_before = 0;
    if (!l->open || now - l->start >= l->window) {
        *held_before = l->held;
        l->open = 1;
        l->start = now;
        l->used = 0;
        l->held = 0;
    }
    if (l->used < l->burst) {
        l->used++;
        return 1;
    }
    l->held++;
    return 0;
}

unsigned long long dlog_limit_due(struct dlog_limit *l, double now)
{
    unsigned long long held = l->held;
    if (!l->open || !held || now - l->start < l->window)
        return 0;
    l->open = 0;
    l->held = 0;
    return held;
}
