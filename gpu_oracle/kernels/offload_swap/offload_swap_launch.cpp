// CPU launcher for offload_swap.cu, called through ctypes by gpu_oracle.kernels.offload_swap.
#include <cstddef>
#include <cstdlib>

#include "cuda_cpu_shim.h"
#include "offload_swap.cu"

extern "C" {

void kvsim_offload_swap(unsigned int grid_x, unsigned int block_x, const long long* segments, int num_segments)
{
    kvsim_shim::launch({grid_x, 1, 1}, {block_x, 1, 1}, [&] { offload_swap(segments, num_segments); });
}

// One exact-size malloc per tensor and per id list under ASan, so one id past a group's list is a red zone.
void* kvsim_malloc(size_t nbytes) { return std::malloc(nbytes); }
void kvsim_free(void* ptr) { std::free(ptr); }

}
