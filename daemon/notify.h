/* notify.h: systemd's service notification protocol (sd_notify(3)) without
 * libsystemd: one datagram to $NOTIFY_SOCKET, and the watchdog settings. */
#ifndef DP_DAEMON_NOTIFY_H
#define DP_DAEMON_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* True when $NOTIFY_SOCKET is set (the service manager listens). */
bool notify_enabled(void);

/* Sends msg ("READY=1", "STATUS=...", several lines joined by '\n') as one
 * datagram. Returns 1 when sent, 0 when $NOTIFY_SOCKET is unset, or a
 * negative DP_E* code (the reason is logged at debug level). */
int notify_send(const char *msg);
int notify_sendf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The watchdog interval in microseconds from $WATCHDOG_USEC, or 0 when the
 * watchdog is off for this process ($WATCHDOG_USEC unset or invalid, or
 * $WATCHDOG_PID set to another process's pid). */
uint64_t notify_watchdog_usec(void);

#endif
