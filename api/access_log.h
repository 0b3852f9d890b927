/* access_log.h: one log line per finished HTTP request (id, status, tokens,
 * TTFT, duration), written through dp_log so that journald keeps it whole. */
#ifndef DP_API_ACCESS_LOG_H
#define DP_API_ACCESS_LOG_H

#include "internal.h"

/* Called once per request when it ends, before h is freed; j is its job
 * (NULL for the small endpoints).
 * Completion requests and failures are logged at info, the small endpoints
 * (/health, /metrics, ...) that answered < 400 at debug. Prompt text appears
 * only at debug. */
void access_log_request(const dp_hreq *h, const dp_job *j, enum MHD_RequestTerminationCode toe);

#endif
