// Decode side of the SGLang PD staging path (05c7ebf, PR #30545; research note sglang.md 2.3 "Decode scatter"):
// copy one writer's region of a staging slot into its heads of the destination pages of the paged KV pool.
//
// The destination pages are req_to_token[token_start:token_end][::page_size] / page_size, where the rows
// start at the decode prefix (models.pd_staging_plan.scatter_token_range); the caller resolves them, so the
// kernel only sees pages. `staging` points at the writer's first byte, laid out as in
// staging_gather_head_slice.cu: region y = kv * num_layers + layer, token-major, then head, then byte.
// The writer's heads land at local heads [dst_head_start, dst_head_start + num_heads) of the pool.
//
// Grid: x = token of the slot, y = kv * num_layers + layer; blockDim.x threads stride over the token's
// num_heads * head_bytes bytes. Unchecked: a layout larger than the slot reads past it (ASan reports it).
//
// Plain CUDA C, no includes: NVRTC (cupy.RawModule) and nvcc compile it, cuda_cpu_shim.h runs it under g++.

extern "C" __global__ void staging_scatter(unsigned char* __restrict__ kv,
                                           const unsigned char* __restrict__ staging,
                                           const int* __restrict__ page_indices,
                                           long long layer_stride,
                                           long long kv_stride,
                                           long long page_stride,
                                           long long token_stride,
                                           long long head_stride,
                                           long long head_bytes,
                                           int dst_head_start,
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
    const long long which = region / num_layers;  // 0 = K, 1 = V
    const long long page = page_indices[t / page_size];
    unsigned char* dst = kv + layer * layer_stride + which * kv_stride + page * page_stride
                         + (t % page_size) * token_stride + (long long)dst_head_start * head_stride;
    const long long row_bytes = (long long)num_heads * head_bytes;
    const unsigned char* src = staging + region * num_tokens * row_bytes + t * row_bytes;
    for (long long i = threadIdx.x; i < row_bytes; i += blockDim.x) {
        dst[(i / head_bytes) * head_stride + i % head_bytes] = src[i];
    }
}
