/* probe.cu: what the CUDA runtime itself says about this machine's GPUs,
 * for tests/gpu/check.sh (which must not depend on nvidia-smi). Host code
 * only: built with nvcc for any architecture. Prints
 *   runtime R driver D devices N
 *   device I: NAME, cc MAJOR.MINOR, TOTAL MiB, sm SMS
 * or "error: CALL: MESSAGE (CODE)". Exit 0 with a device, 1 without one. */
#include <stdio.h>

#include <cuda_runtime_api.h>

int main(void)
{
    int rt = 0, drv = 0, n = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv); /* 0: no driver */
    cudaError_t e = cudaGetDeviceCount(&n);
    printf("runtime %d driver %d devices %d\n", rt, drv, e == cudaSuccess ? n : 0);
    if (e != cudaSuccess) {
        printf("error: cudaGetDeviceCount: %s (%d)\n", cudaGetErrorString(e), (int)e);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, i);
        if (e != cudaSuccess) {
            printf("error: cudaGetDeviceProperties(%d): %s (%d)\n", i, cudaGetErrorString(e), (int)e);
            return 1;
        }
        printf("device %d: %s, cc %d.%d, %zu MiB, sm %d\n", i, p.name, p.major, p.minor,
               p.totalGlobalMem >> 20, p.multiProcessorCount);
    }
    return n > 0 ? 0 : 1;
}
