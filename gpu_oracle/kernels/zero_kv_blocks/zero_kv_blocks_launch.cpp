// CPU launcher for zero_kv_blocks.cu, called through ctypes by gpu_oracle.zeroing.
#include <cstddef>
#include <cstdlib>

#include "cuda_cpu_shim.h"
#include "zero_kv_blocks.cu"

extern "C" {

void kvsim_zero_kv_blocks(unsigned int grid_x, unsigned int grid_y, unsigned int grid_z, unsigned int block_x,
                          const unsigned long long* seg_addrs, const long long* seg_block_strides,
                          const long long* seg_page_sizes, const long long* block_ids)
{
    kvsim_shim::launch({grid_x, grid_y, grid_z}, {block_x, 1, 1}, [&] {
        zero_kv_blocks(seg_addrs, seg_block_strides, seg_page_sizes, block_ids);
    });
}

// Allocations made here come from the sanitizer's malloc when libasan is preloaded, with red zones
// right after the requested size: that is what lets ASan see a store one word past an allocation.
void* kvsim_malloc(size_t nbytes) { return std::malloc(nbytes); }
void kvsim_free(void* ptr) { std::free(ptr); }

}
