// Run CUDA C kernels on the CPU: map the CUDA built-ins to a sequential loop over the grid.
//
// Enough for kernels that use only blockIdx/threadIdx/blockDim/gridDim: every (block, thread) pair runs to
// completion one after the other, so __syncthreads, shared memory and warp intrinsics cannot be supported
// and races are invisible. The point is indexing: built with -fsanitize=address, an out-of-bounds store
// stops with the kernel's source line.
#pragma once

#include <mutex>

struct kvsim_uint3 {
    unsigned int x, y, z;
};

// Plain globals, not thread_local: a TLS lookup per simulated thread halves the throughput in a shared
// library, and launches are serialised by the mutex below instead.
static kvsim_uint3 threadIdx, blockIdx, blockDim, gridDim;
static std::mutex kvsim_launch_mutex;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

namespace kvsim_shim {

template <class Kernel>
void launch(kvsim_uint3 grid, kvsim_uint3 block, Kernel&& kernel)
{
    std::lock_guard<std::mutex> guard(kvsim_launch_mutex);
    gridDim = grid;
    blockDim = block;
    for (unsigned int bz = 0; bz < grid.z; ++bz)
        for (unsigned int by = 0; by < grid.y; ++by)
            for (unsigned int bx = 0; bx < grid.x; ++bx) {
                blockIdx = {bx, by, bz};
                for (unsigned int tz = 0; tz < block.z; ++tz)
                    for (unsigned int ty = 0; ty < block.y; ++ty)
                        for (unsigned int tx = 0; tx < block.x; ++tx) {
                            threadIdx = {tx, ty, tz};
                            kernel();
                        }
            }
}

}  // namespace kvsim_shim
