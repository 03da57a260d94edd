// Merge two partial attention states by log-sum-exp, in fp32: vLLM's merge_attn_states (csrc/attention/
// merge_attn_states.cu after #28181; research notes vllm.md 1.6, trtllm_flashinfer.md 2.5).
//
//   M = max(lp, ls);  wp = exp(lp - M);  ws = exp(ls - M)
//   out = op * wp / (wp + ws) + os * ws / (wp + ws);  lse = M + log(wp + ws)
//
// Outputs are [T, H, D] with element strides (token_stride, head_stride), so a padded head stride works;
// LSEs are dense [H, T], natural log. An LSE of +inf (FA2's empty row) is read as -inf (#15492).
// Empty-state guard: when both sides are -inf, M - M would be NaN; the merged state is the identity
// (0, -inf) instead. A side with LSE -inf still multiplies its output by weight 0, as the kernels do, so a
// NaN output there poisons the result exactly as in models.mla_attention.merge_attn_states.
//
// Grid: x = token, y = head; blockDim.x threads stride over D, each recomputing the two weights (cheaper
// than sharing them, and no shared memory or barrier, which the CPU shim cannot run).
// Plain CUDA C, no includes: NVRTC and nvcc provide expf/logf/fmaxf; the shim's launcher includes <math.h>.

extern "C" __global__ void merge_attn_states(float* __restrict__ output,
                                             float* __restrict__ output_lse,  // may be null
                                             const float* __restrict__ prefix_output,
                                             const float* __restrict__ prefix_lse,
                                             const float* __restrict__ suffix_output,
                                             const float* __restrict__ suffix_lse,
                                             int num_tokens,
                                             int head_size,
                                             long long token_stride,
                                             long long head_stride)
{
    const long long t = blockIdx.x;
    const long long h = blockIdx.y;
    if (t >= num_tokens) {
        return;
    }
    float lp = prefix_lse[h * num_tokens + t];
    float ls = suffix_lse[h * num_tokens + t];
    // +inf -> -inf without an INFINITY macro (NVRTC has no math.h): only +inf exceeds FLT_MAX.
    if (lp > 3.402823466e+38f) lp = -lp;
    if (ls > 3.402823466e+38f) ls = -ls;
    const float m = fmaxf(lp, ls);
    const long long base = t * token_stride + h * head_stride;
    if (m < -3.402823466e+38f) {  // both empty: -inf - -inf would be NaN
        for (long long d = threadIdx.x; d < head_size; d += blockDim.x) {
            output[base + d] = 0.0f;
        }
        if (output_lse != 0 && threadIdx.x == 0) {
            output_lse[h * num_tokens + t] = m;  // m is -inf here
        }
        return;
    }
    const float wp = expf(lp - m);
    const float ws = expf(ls - m);
    const float total = wp + ws;  // >= 1: the larger side has weight exp(0)
    const float sp = wp / total;
    const float ss = ws / total;
    for (long long d = threadIdx.x; d < head_size; d += blockDim.x) {
        output[base + d] = prefix_output[base + d] * sp + suffix_output[base + d] * ss;
    }
    if (output_lse != 0 && threadIdx.x == 0) {
        output_lse[h * num_tokens + t] = m + logf(total);
    }
}
