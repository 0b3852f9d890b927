/* backend.c: picks and creates a backend from a device string
 * ("auto" | "cpu" | "cuda" | "cuda:N"). */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "common/dp.h"

int backend_create(dp_backend **out, const char *device, int n_threads, char *err, size_t errsz)
{
    if (!device || !*device)
        device = "auto";
    if (strcmp(device, "cpu") == 0)
        return backend_cpu_create(out, n_threads, err, errsz);
    int index = 0;
    bool want_cuda = false;
    if (strcmp(device, "cuda") == 0) {
        want_cuda = true;
    } else if (strncmp(device, "cuda:", 5) == 0) {
        char *end;
        long v = strtol(device + 5, &end, 10);
        if (*end || end == device + 5 || v < 0 || v > 255)
            return dp_err(err, errsz, DP_EINVAL, "bad device '%s' (expected cuda:N)", device);
        index = (int)v;
        want_cuda = true;
    } else if (strcmp(device, "auto") != 0) {
        return dp_err(err, errsz, DP_EINVAL, "unknown device '%s' (expected auto, cpu, cuda or cuda:N)",
                      device);
    }
#ifdef DP_HAVE_CUDA
    char cerr[DP_ERRLEN] = "";
    int rc = backend_cuda_create(out, index, cerr, sizeof cerr);
    if (rc == 0)
        return 0;
    if (want_cuda)
        return dp_err(err, errsz, rc, "device %s: %s", device, cerr);
    dp_log(DP_LOG_INFO, "no usable CUDA device (%s); using the CPU", cerr);
#else
    if (want_cuda)
        return dp_err(err, errsz, DP_EUNSUPPORTED,
                      "device %s: this build has no CUDA backend (configure with -Dcuda=enabled)",
                      device);
    (void)index;
#endif
    return backend_cpu_create(out, n_threads, err, errsz);
}

void backend_destroy(dp_backend *be)
{
    if (be)
        be->ops->destroy(be);
}
