// CPU launcher for gather_mla_context.cu, called through ctypes by gpu_oracle.mla.
#include <cstddef>
#include <cstdlib>

#include "cuda_cpu_shim.h"
#include "gather_mla_context.cu"

extern "C" {

void kvsim_gather_mla_context(unsigned int grid_x, unsigned int block_x, const unsigned char* kv_cache,
                              unsigned char* workspace, const int* block_table, const int* cu_seq_lens,
                              const int* token_to_seq, const int* seq_starts, long long block_table_stride,
                              long long block_stride_bytes, long long entry_stride_bytes, long long entry_bytes,
                              int block_size, int num_tokens)
{
    kvsim_shim::launch({grid_x, 1, 1}, {block_x, 1, 1}, [&] {
        gather_mla_context(kv_cache, workspace, block_table, cu_seq_lens, token_to_seq, seq_starts,
                           block_table_stride, block_stride_bytes, entry_stride_bytes, entry_bytes, block_size,
                           num_tokens);
    });
}

// One exact-size malloc per argument under ASan, so a read one element past the block table or the cache
// lands in a red zone instead of a neighbouring array.
void* kvsim_malloc(size_t nbytes) { return std::malloc(nbytes); }
void kvsim_free(void* ptr) { std::free(ptr); }

}
