// Prepended to the kernel source for g++: CUDA's keywords empty, its built-ins declared.
#include <math.h>
#include <cmath>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__
#define __launch_bounds__(...)
struct dim3 { unsigned int x, y, z; };
typedef dim3 uint3;
static uint3 blockIdx, threadIdx;
static dim3 blockDim, gridDim;
extern "C" void riffle_set_index(unsigned bx, unsigned by, unsigned bz, unsigned tx, unsigned ty,
                                 unsigned tz) {
    blockIdx = {bx, by, bz};
    threadIdx = {tx, ty, tz};
}
using std::max;
using std::min;
