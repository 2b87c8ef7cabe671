// A module with 64 MiB of device globals (tests/gpu/programs/load_beside.cu loads it).
__device__ char big_globals[64 << 20];
extern "C" __global__ void touch_globals() { big_globals[threadIdx.x] = 1; }
