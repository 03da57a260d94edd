// CPU launcher for staging_scatter.cu, called through ctypes by gpu_oracle.staging.
#include <cstddef>
#include <cstdlib>

#include "cuda_cpu_shim.h"
#include "staging_scatter.cu"

extern "C" {

void kvsim_staging_scatter(unsigned int grid_x, unsigned int grid_y, unsigned int block_x,
        unsigned char* kv, const unsigned char* staging, const int* page_indices,
        long long layer_stride, long long kv_stride, long long page_stride, long long token_stride,
        long long head_stride, long long head_bytes, int dst_head_start, int num_heads, int num_layers, int page_size,
        int num_tokens)
{
    kvsim_shim::launch({grid_x, grid_y, 1}, {block_x, 1, 1}, [&] {
        staging_scatter(kv, staging, page_indices, layer_stride, kv_stride, page_stride, token_stride, head_stride,
            head_bytes, dst_head_start, num_heads, num_layers, page_size, num_tokens);
    });
}

// One exact-size malloc per argument under ASan, so one byte past the staging slot is a red zone.
void* kvsim_malloc(size_t nbytes) { return std::malloc(nbytes); }
void kvsim_free(void* ptr) { std::free(ptr); }

}
