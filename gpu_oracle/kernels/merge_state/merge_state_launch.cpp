// CPU launcher for merge_state.cu, called through ctypes by kvsim.gpu_oracle.kernels.merge_state.
#include <math.h>

#include <cstddef>
#include <cstdlib>

#include "cuda_cpu_shim.h"
#include "merge_state.cu"

extern "C" {

void kvsim_merge_state(unsigned int grid_x, unsigned int grid_y, unsigned int block_x, const float* v_a,
                       const float* s_a, const float* v_b, const float* s_b, float* v_merged, float* s_merged,
                       int num_tokens, int num_heads, int head_dim)
{
    kvsim_shim::launch({grid_x, grid_y, 1}, {block_x, 1, 1}, [&] {
        merge_state(v_a, s_a, v_b, s_b, v_merged, s_merged, num_tokens, num_heads, head_dim);
    });
}

void* kvsim_malloc(size_t nbytes) { return std::malloc(nbytes); }
void kvsim_free(void* ptr) { std::free(ptr); }

}
