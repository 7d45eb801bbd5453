/* The CUDA driver API on a real GPU, for bench/gpu_check.py. No CUDA header: the few types are
 * declared here. libcuda.so.1 is opened with dlopen; most entry points come from dlsym, the rest
 * from cuGetProcAddress_v2 (the path cudart takes). It leaks one 32 MiB block, allocates and
 * frees an 8 MiB one, asks for 4 TiB (CUDA_ERROR_OUT_OF_MEMORY), maps and unmaps physical
 * memory through the virtual memory API, and launches a kernel JIT-compiled from PTX.
 * Build: gcc -O1 -g -o gpu_cuda_driver bench/gpu_cuda_driver.c -ldl */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

typedef struct {
    unsigned type, requestedHandleTypes;
    struct { unsigned type; int id; } location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

static const char ptx[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry noop_kernel()\n{\n\tret;\n}\n";

#define LOAD(name, args) \
    CUresult(*name) args = (CUresult(*) args)dlsym(h, #name); \
    if (!name) { printf("missing %s\n", #name); return 1; }

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("no driver: %s\n", dlerror()); return 1; }
    LOAD(cuInit, (unsigned))
    LOAD(cuDeviceGet, (int *, int))
    LOAD(cuDevicePrimaryCtxRetain, (CUcontext *, int))
    LOAD(cuCtxSetCurrent, (CUcontext))
    LOAD(cuMemAlloc_v2, (CUdeviceptr *, size_t))
    LOAD(cuGetProcAddress_v2, (const char *, void **, int, unsigned long long, int *))
    LOAD(cuModuleLoadData, (CUmodule *, const void *))
    LOAD(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))
    LOAD(cuCtxSynchronize, (void))
    LOAD(cuMemGetAllocationGranularity, (size_t *, const CUmemAllocationProp *, int))
    LOAD(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))
    LOAD(cuMemAddressFree, (CUdeviceptr, size_t))

    int dev = 0, st = 0;
    CUcontext ctx = NULL;
    printf("init %d\n", cuInit(0));
    printf("device %d\n", cuDeviceGet(&dev, 0));
    printf("ctx %d\n", cuDevicePrimaryCtxRetain(&ctx, dev));
    printf("current %d\n", cuCtxSetCurrent(ctx));

    CUdeviceptr leaked = 0, temp = 0, huge = 0;
    printf("alloc_dlsym %d\n", cuMemAlloc_v2(&leaked, 32u << 20));

    CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
    CUresult (*mem_free)(CUdeviceptr) = NULL;
    cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, &st);
    cuGetProcAddress_v2("cuMemFree", (void **)&mem_free, 12000, 0, &st);
    printf("alloc_procaddr %d\n", alloc(&temp, 8u << 20));
    printf("free_procaddr %d\n", mem_free(temp));
    printf("oom %d\n", cuMemAlloc_v2(&huge, 1ull << 42));

    CUresult (*mem_create)(uint64_t *, size_t, const CUmemAllocationProp *, unsigned long long) = NULL;
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, uint64_t, unsigned long long) = NULL;
    CUresult (*mem_unmap)(CUdeviceptr, size_t) = NULL;
    CUresult (*mem_release)(uint64_t) = NULL;
    cuGetProcAddress_v2("cuMemCreate", (void **)&mem_create, 12000, 0, &st);
    cuGetProcAddress_v2("cuMemMap", (void **)&mem_map, 12000, 0, &st);
    cuGetProcAddress_v2("cuMemUnmap", (void **)&mem_unmap, 12000, 0, &st);
    cuGetProcAddress_v2("cuMemRelease", (void **)&mem_release, 12000, 0, &st);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
    prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
    prop.location.id = dev;
    size_t granularity = 0;
    printf("granularity %d\n", cuMemGetAllocationGranularity(&granularity, &prop, 0));
    size_t size = granularity * 2;
    CUdeviceptr va = 0;
    uint64_t handle = 0;
    printf("reserve %d\n", cuMemAddressReserve(&va, size, 0, 0, 0));
    printf("create %d size %zu\n", mem_create(&handle, size, &prop, 0), size);
    printf("map %d\n", mem_map(va, size, 0, handle, 0));
    printf("release %d\n", mem_release(handle));
    printf("unmap %d\n", mem_unmap(va, size));
    printf("address_free %d\n", cuMemAddressFree(va, size));

    CUmodule module = NULL;
    CUfunction fn = NULL;
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **) = NULL;
    cuGetProcAddress_v2("cuLaunchKernel", (void **)&launch, 12000, 0, &st);
    printf("module %d\n", cuModuleLoadData(&module, ptx));
    printf("function %d\n", cuModuleGetFunction(&fn, module, "noop_kernel"));
    printf("launch %d\n", launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    printf("sync %d\n", cuCtxSynchronize());
    return 0;
}
