// Merge two attention states with base-2 LSEs, in fp32: FlashInfer's merge_state (include/flashinfer/attention/
// cascade.cuh, state_t::merge; research note trtllm_flashinfer.md 2.5), as kvsim.models.mla_backends.merge states it.
//
//   m = max(s_a, s_b);  w_a = 2^(s_a - m);  w_b = 2^(s_b - m)
//   v = (v_a w_a + v_b w_b) / (w_a + w_b);  s = m + log2(w_a + w_b)
//
// Layout: v [T, H, D] dense, s [T, H] dense (FlashInfer's layout, not vLLM's [H, T]).
// Empty-state guard (FlashInfer #4401, vLLM #28181): when both sides are -inf, m - m would be NaN; shift by 0
// instead, so both weights are 2^-inf = 0, the output is 0 and the LSE is 0 + log2(0) = -inf.
//
// Grid: x = token, y = head; blockDim.x threads stride over D, each recomputing the two weights (no shared
// memory or barrier, which the CPU shim cannot run). Plain CUDA C, no includes: NVRTC and nvcc provide
// exp2f/log2f/fmaxf; the shim's launcher includes <math.h>.

extern "C" __global__ void merge_state(const float* __restrict__ v_a,
                                       const float* __restrict__ s_a,
                                       const float* __restrict__ v_b,
                                       const float* __restrict__ s_b,
                                       float* __restrict__ v_merged,
                                       float* __restrict__ s_merged,
                                       int num_tokens,
                                       int num_heads,
                                       int head_dim)
{
    const long long t = blockIdx.x;
    const long long h = blockIdx.y;
    if (t >= num_tokens || h >= num_heads) {
        return;
    }
    const long long row = t * num_heads + h;
    const float sa = s_a[row];
    const float sb = s_b[row];
    const float m = fmaxf(sa, sb);
    const float shift = m < -3.402823466e+38f ? 0.0f : m;  // both empty: -inf - -inf would be NaN
    const float wa = exp2f(sa - shift);
    const float wb = exp2f(sb - shift);
    const float total = wa + wb;
    const float denom = total > 0.0f ? total : 1.0f;
    const long long base = row * head_dim;
    for (long long d = threadIdx.x; d < head_dim; d += blockDim.x) {
        v_merged[base + d] = (v_a[base + d] * wa + v_b[base + d] * wb) / denom;
    }
    if (threadIdx.x == 0) {
        s_merged[row] = shift + log2f(total);
    }
}
