// kernels/profiled.cu with every in-kernel record compiled out: kernels named `<name>_off`.
#define ASYNCGPU_PROFILE 0
#include "profiled.cu"
