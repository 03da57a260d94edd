// CPU launcher for merge_attn_states.cu, called through ctypes by gpu_oracle.mla.
#include <math.h>

#include <cstddef>
#include <cstdlib>

#include "cuda_cpu_shim.h"
#include "merge_attn_states.cu"

extern "C" {

void kvsim_merge_attn_states(unsigned int grid_x, unsigned int grid_y, unsigned int block_x, float* output,
                             float* output_lse, const float* prefix_output, const float* prefix_lse,
                             const float* suffix_output, const float* suffix_lse, int num_tokens, int head_size,
                             long long token_stride, long long head_stride)
{
    kvsim_shim::launch({grid_x, grid_y, 1}, {block_x, 1, 1}, [&] {
        merge_attn_states(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, num_tokens,
                          head_size, token_stride, head_stride);
    });
}

void* kvsim_malloc(size_t nbytes) { return std::malloc(nbytes); }
void kvsim_free(void* ptr) { std::free(ptr); }

}
