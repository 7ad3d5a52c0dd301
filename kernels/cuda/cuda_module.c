/*
 * The entry of libinfergate_cuda.so (cuda_module.h). The backend's code
 * logs with ig_log, which cuda_log.c forwards to the loading process's
 * logger, so that its level and format apply.
 */
#include "cuda_device.h"
#include "cuda_module.h"

__attribute__((visibility("default"))) int
ig__cuda_module_entry(const ig__cuda_host_t *h, ig__cuda_module_t *out)
{
    ig__cuda_log_host(h);
    out->abi = IG_CUDA_MODULE_ABI;
    out->create = ig_backend_cuda_create;
    out->device_uuid = ig__cuda_device_uuid;
    return IG_CUDA_MODULE_ABI;
}
