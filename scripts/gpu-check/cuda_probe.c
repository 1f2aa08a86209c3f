/* The CUDA driver API, called the way a job's framework first does: cuInit, the device's name, a
 * cuMemAlloc and a memcpy there and back (no kernel, so no compiler for the GPU is needed). libcuda is
 * opened at run time (dlopen), so this builds with gcc alone, without CUDA's headers or libraries.
 * `cuda_probe N` repeats the copies for N seconds (load for the NVML samples). Exit 0: every call
 * answered CUDA_SUCCESS and the bytes came back. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define CALL(fn, ...)                                                            \
    do {                                                                         \
        CUresult rc_ = fn(__VA_ARGS__);                                          \
        if (rc_ != 0) {                                                          \
            fprintf(stderr, "FAIL cuda: %s returned %d\n", #fn, rc_);             \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 0;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, "FAIL cuda: dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    CUresult (*cuInit)(unsigned) = dlsym(cuda, "cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = dlsym(cuda, "cuDeviceGet");
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = dlsym(cuda, "cuDeviceGetName");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = dlsym(cuda, "cuCtxCreate_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = dlsym(cuda, "cuMemAlloc_v2");
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) = dlsym(cuda, "cuMemcpyHtoD_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = dlsym(cuda, "cuMemcpyDtoH_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = dlsym(cuda, "cuMemFree_v2");
    if (!cuInit || !cuDeviceGet || !cuDeviceGetName || !cuCtxCreate || !cuMemAlloc || !cuMemcpyHtoD ||
        !cuMemcpyDtoH || !cuMemFree) {
        fprintf(stderr, "FAIL cuda: a driver API symbol is missing from libcuda.so.1\n");
        return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr mem;
    char name[256];
    size_t size = 64u << 20;
    unsigned char *out = malloc(size), *back = malloc(size);
    for (size_t i = 0; i < size; i++) out[i] = (unsigned char)(i * 7);
    CALL(cuInit, 0);
    CALL(cuDeviceGet, &dev, 0);
    CALL(cuDeviceGetName, name, sizeof name, dev);
    CALL(cuCtxCreate, &ctx, 0, dev);
    CALL(cuMemAlloc, &mem, size);
    time_t end = time(NULL) + (time_t)seconds;
    unsigned long copies = 0;
    do {
        CALL(cuMemcpyHtoD, mem, out, size);
        CALL(cuMemcpyDtoH, back, mem, size);
        copies++;
    } while (time(NULL) < end);
    if (memcmp(out, back, size) != 0) {
        fprintf(stderr, "FAIL cuda: the bytes copied back differ\n");
        return 1;
    }
    CALL(cuMemFree, mem);
    printf("cuda ok: %s, %lu round trips of %zu MiB\n", name, copies, size >> 20);
    return 0;
}
