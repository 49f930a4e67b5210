// `bench reach` (bench/src/reach.rs): random 128-byte requests over a host region read
// through its buffer device address, the way `reach.wgsl` reads it through storage windows.
// WGSL has no device addresses, so this kernel is GLSL, compiled once to the SPIR-V beside it
// and passed through to the driver:
//   glslangValidator -V --target-env vulkan1.2 reach_address.comp -o reach_address.spv
// Twin: `reach.wgsl`'s `main` (the same invocations, lines, words and sink).
#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

// gphash_gpu::shader::WORKGROUP.
layout(local_size_x = 128) in;

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Word {
    uint w;
};

layout(push_constant) uniform Params {
    uint64_t base;  // the region's device address
    uint lines;     // 128-byte lines in the region
    uint iters;     // requests per 32 invocations
    uint seed;
    uint check;     // nonzero: every invocation writes what it read
} params;

layout(set = 0, binding = 0) buffer Sink {
    uint sink[];
};

// `fmix` of shaders/common/hash.wgsl.
uint fmix(uint h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

void main() {
    uint me = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 128u + gl_LocalInvocationIndex;
    uint request = me / 32u;
    uint acc = 0u;
    for (uint it = 0u; it < params.iters; it++) {
        uint line = fmix(request * 0x9e3779b9u ^ fmix(it + params.seed)) % params.lines;
        acc ^= Word(params.base + (uint64_t(line) * 32ul + uint64_t(me % 32u)) * 4ul).w;
    }
    if (params.check != 0u || acc == 0x12345678u) {
        sink[me] = acc;
    }
}
