// Zero KV-cache blocks by segment table: vLLM KVBlockZeroer after d6af803 (PR #50276).
//
// Segment s clears, for logical block b, the int32 words
//   [seg_addrs[s] + 4 * b * seg_block_strides[s], + 4 * seg_page_sizes[s])
// (addresses in bytes, strides and pages in int32 words). Before the fix the page doubled as the stride,
// which is the same kernel fed a different table, so this one kernel serves both variants.
//
// Grid: x = chunk of the page, y = segment, z = index into block_ids (x is the only axis CUDA allows past
// 65,535, and a page of up to 64 Mi words needs that many chunks). blockDim.x threads each store one word;
// the store is masked to the page, so a page need not be a multiple of the chunk width.
//
// Plain CUDA C with no includes: NVRTC (cupy.RawModule) compiles it on a GPU, nvcc compile-checks it here,
// and cuda_cpu_shim.h lets g++ run it on the CPU (no shared memory, barriers or warp intrinsics allowed).

extern "C" __global__ void zero_kv_blocks(const unsigned long long* __restrict__ seg_addrs,
                                          const long long* __restrict__ seg_block_strides,
                                          const long long* __restrict__ seg_page_sizes,
                                          const long long* __restrict__ block_ids)
{
    const unsigned int seg = blockIdx.y;
    const long long word = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (word >= seg_page_sizes[seg]) {
        return;  // past the page: the mask that keeps padding and neighbouring layers intact
    }
    // 64-bit offsets: block_id * stride overflows 32 bits on caches of a few GiB.
    int* const base = reinterpret_cast<int*>(seg_addrs[seg]);
    const long long offset = block_ids[blockIdx.z] * seg_block_strides[seg] + word;
    base[offset] = 0;
}
