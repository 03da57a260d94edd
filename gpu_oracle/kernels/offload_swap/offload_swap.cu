// The batched GPU<->CPU swap of vLLM's KV offload worker (0.33.0 vllm/v1/kv_offload/cpu/gpu_worker.py, research
// note vllm.md 3.2): the sub-block pointer arithmetic of compute_sub_block_ptrs fused with the copies of
// swap_blocks_batch, one thread block per (src, dst, size) triple.
//
// `segments` holds num_segments rows of SEGMENT_FIELDS int64 each, one per (KV cache group, data reference),
// in batch order (models/kv_offload/mapping.py SwapSegment):
//   0 first     index of the segment's first triple in the batch (prefix sum of the counts)
//   1 count     triples of the segment (the group's size)
//   2 src_base  3 dst_base     byte addresses of the tensor on each side
//   4 src_ids   5 dst_ids      int32 block / chunk id lists (GPU block ids, or CPU chunk slots)
//   6 src_row   7 dst_row      row strides in bytes
//   8 src_sub   9 dst_sub      sub-block strides (the GPU page on both sides)
//  10 src_bpc  11 dst_bpc      sub-blocks per id (1 on the GPU side, blocks_per_chunk on the CPU side)
//  12 src_skip 13 dst_skip     skip_count: sub-blocks of the first id before the group's first block
//  14 size                     bytes per triple (the data reference's page_size_bytes)
// Triple k of a segment copies `size` bytes from sub-block src_skip + k of the src ids to sub-block
// dst_skip + k of the dst ids: position p lands in id p / bpc at row offset (p % bpc) * sub. Unchecked, like
// the other oracle kernels: a skip_count one too high on a group whose last chunk is full reads one id past
// the list, which the ASan build of the CPU shim reports.
//
// Grid: x = triple of the batch; blockDim.x threads stride over its bytes.
// Plain CUDA C, no includes: NVRTC (cupy.RawModule) and nvcc compile it, cuda_cpu_shim.h runs it under g++.

#define SEGMENT_FIELDS 15

extern "C" __global__ void offload_swap(const long long* __restrict__ segments, int num_segments)
{
    const long long triple = blockIdx.x;
    int s = 0;
    while (s < num_segments && triple >= segments[s * SEGMENT_FIELDS] + segments[s * SEGMENT_FIELDS + 1]) {
        ++s;
    }
    if (s == num_segments) {
        return;
    }
    const long long* seg = segments + (long long)s * SEGMENT_FIELDS;
    const long long k = triple - seg[0];
    const long long src_pos = seg[12] + k;
    const long long dst_pos = seg[13] + k;
    const int* src_ids = reinterpret_cast<const int*>(seg[4]);
    const int* dst_ids = reinterpret_cast<const int*>(seg[5]);
    // 64-bit offsets: an id times a row stride passes 2 GiB on real caches.
    const unsigned char* src = reinterpret_cast<const unsigned char*>(seg[2])
                               + (long long)src_ids[src_pos / seg[10]] * seg[6] + (src_pos % seg[10]) * seg[8];
    unsigned char* dst = reinterpret_cast<unsigned char*>(seg[3])
                         + (long long)dst_ids[dst_pos / seg[11]] * seg[7] + (dst_pos % seg[11]) * seg[9];
    const long long size = seg[14];
    for (long long i = threadIdx.x; i < size; i += blockDim.x) {
        dst[i] = src[i];
    }
}
