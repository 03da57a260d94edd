// Gather MLA context rows from a paged latent cache into the chunk's workspace: the row mapping of vLLM's
// gather_and_maybe_dequant_cache / cp_gather_cache (b38e111d, research note vllm.md 1.6), without dequant.
//
// Workspace row t belongs to request b = token_to_seq[t] and reads that request's cache position
//   pos = seq_starts[b] + (t - cu_seq_lens[b])
// from block block_table[b, pos / block_size], slot pos % block_size. seq_starts need not be block aligned:
// the block index comes from the absolute position, which is what lets per-request chunks start anywhere.
//
// Entries are moved as bytes (entry_bytes per row), so one kernel serves fp32/fp16/bf16/fp8 caches and the
// result must equal the reference bit for bit. Cache strides are in bytes so padded layouts work too.
//
// Grid: x = workspace row (one program per row, as upstream); blockDim.x threads stride over the entry.
// Nothing is bounds-checked on purpose: like the upstream kernel it trusts the metadata, so a wrong
// cu_seq_lens or block table reads out of bounds, which the ASan build of the CPU shim reports.
//
// Plain CUDA C, no includes: NVRTC (cupy.RawModule) and nvcc compile it, cuda_cpu_shim.h runs it under g++.

extern "C" __global__ void gather_mla_context(const unsigned char* __restrict__ kv_cache,
                                              unsigned char* __restrict__ workspace,
                                              const int* __restrict__ block_table,
                                              const int* __restrict__ cu_seq_lens,
                                              const int* __restrict__ token_to_seq,
                                              const int* __restrict__ seq_starts,
                                              long long block_table_stride,
                                              long long block_stride_bytes,
                                              long long entry_stride_bytes,
                                              long long entry_bytes,
                                              int block_size,
                                              int num_tokens)
{
    const long long t = blockIdx.x;
    if (t >= num_tokens) {
        return;
    }
    const int b = token_to_seq[t];
    // 64-bit from here on: block * block_stride overflows 32 bits on caches past 2 GiB.
    const long long pos = (long long)seq_starts[b] + (t - (long long)cu_seq_lens[b]);
    const long long block = block_table[(long long)b * block_table_stride + pos / block_size];
    const unsigned char* src = kv_cache + block * block_stride_bytes + (pos % block_size) * entry_stride_bytes;
    unsigned char* dst = workspace + t * entry_bytes;
    for (long long i = threadIdx.x; i < entry_bytes; i += blockDim.x) {
        dst[i] = src[i];
    }
}
