/*
 * rt_quant: dequantisation of ggml block formats to f32, following the block layouts of
 * ggml (ggml-org/ggml src/ggml-common.h, the block structs, and src/ggml-quants.c,
 * dequantize_row_*).
 * Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K (and any added later).
 */
#ifndef RT_QUANT_H
#define RT_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Values per block (1 for F32/F16/BF16) and bytes per block; both 0 for types this
 * build cannot decode. */
int rt_quant_block_values(uint32_t type);
size_t rt_quant_block_bytes(uint32_t type);
/* 1 when rt_dequant can decode this type. */
int rt_quant_supported(uint32_t type);

/* Bytes taken by n values of the given type; 0 when n is not a multiple of the block
 * size or the type is unsupported. */
size_t rt_quant_row_bytes(uint32_t type, int64_t n);

/* Decode n values (n a multiple of the block size) from src into dst[n]. Returns 0, or
 * -1 when the type is unsupported or n is not a whole number of blocks. */
int rt_dequant(uint32_t type, const void *src, float *dst, int64_t n);

#endif
