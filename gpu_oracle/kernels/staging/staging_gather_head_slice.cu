// Prefill side of the SGLang PD staging path (05c7ebf, PR #30545; research note sglang.md 2.3 "Layout of one
// slot"): pack one writer's head slice of every layer, K then V, from the paged KV pool into the staging buffer.
//
// The pool is addressed by byte strides (layer, K/V, page, row in page, head), so any dtype and any padded
// layout works and the copy is exact. `staging` points at the writer's first byte; inside it region
// y = kv * num_layers + layer holds num_tokens x num_heads x head_bytes, token-major, then head, then byte,
// which is models.pd_staging_layout.StagingLayout.region shifted by the writer's offset.
//
// Grid: x = token of the send (num_pages * page_size), y = kv * num_layers + layer; blockDim.x threads stride
// over the token's num_heads * head_bytes bytes. Unchecked, like the other oracle kernels: a send
// larger than the slot it was named for writes past the buffer, which the ASan build of the CPU shim reports.
//
// Plain CUDA C, no includes: NVRTC (cupy.RawModule) and nvcc compile it, cuda_cpu_shim.h runs it under g++.

extern "C" __global__ void staging_gather_head_slice(const unsigned char* __restrict__ kv,
                                                     unsigned char* __restrict__ staging,
                                                     const int* __restrict__ page_indices,
                                                     long long layer_stride,
                                                     long long kv_stride,
                                                     long long page_stride,
                                                     long long token_stride,
                                                     long long head_stride,
                                                     long long head_bytes,
                                                     int src_head_start,
                                                     int num_heads,
                                                     int num_layers,
                                                     int page_size,
                                                     int num_tokens)
{
    const long long t = blockIdx.x;
    const long long region = blockIdx.y;
    if (t >= num_tokens || region >= 2LL * num_layers) {
        return;
    }
    const long long layer = region % num_layers;
    const long long which = region / num_layers;  // 0 = K, 1 = V: every K layer precedes every V layer
    const long long page = page_indices[t / page_size];
    // 64-bit offsets: a page stride times a page id passes 2 GiB on real pools.
    const unsigned char* src = kv + layer * layer_stride + which * kv_stride + page * page_stride
                               + (t % page_size) * token_stride + (long long)src_head_start * head_stride;
    const long long row_bytes = (long long)num_heads * head_bytes;
    unsigned char* dst = staging + region * num_tokens * row_bytes + t * row_bytes;
    for (long long i = threadIdx.x; i < row_bytes; i += blockDim.x) {
        dst[i] = src[(i / head_bytes) * head_stride + i % head_bytes];
    }
}
