/*
 * rt_dot: dot products of one weight row kept in its GGUF block type against one
 * activation row quantised per block, the way ggml's CPU backend multiplies
 * (ggml-org/llama.cpp, ggml/src/ggml-cpu/quants.c and arch/x86/quants.c): the row of
 * activations x[n] is quantised once per matmul to 8-bit blocks matching the weight's
 * block size, and each weight row is dotted against it in integer arithmetic per block,
 * scaled by the two blocks' scales.
 *
 *   weight type   activation blocks      per-block product (d = scale, q = 8-bit code)
 *   Q4_0          Q8_0 (32)              dw·dx · Σ (nib - 8)·qx
 *   Q4_1          Q8_1 (32, with s)      dw·dx · Σ nib·qx + mw·sx,   sx = dx·Σ qx
 *   Q5_0          Q8_0 (32, with s)      dw·(dx · Σ code·qx - 16·sx)  (code: 5 bits)
 *   Q5_1          Q8_1 (32, with s)      dw·dx · Σ code·qx + mw·sx
 *   Q8_0          Q8_0 (32)              dw·dx · Σ qw·qx
 *   Q4_K          Q8_K (256, bsums)      d·dx · Σ_j sc_j Σ nib·qx - dmin·dx · Σ_j m_j·bsum_j
 *   Q5_K          Q8_K (256, bsums)      as Q4_K with 5-bit codes
 *   Q6_K          Q8_K (256, bsums)      d·dx · Σ_g sc_g (Σ q6·qx - 32·bsum_g)
 *   F16, F32      none (x stays f32)     Σ w·x in f32
 * Activation codes are round(x / d) with d = max|x| / 127 over the block (Q8_K: d =
 * max / -127 for the signed value of largest magnitude, codes clamped to 127, as
 * quantize_row_q8_K_ref does). Unlike ggml, d and s are kept in f32 (ggml rounds Q8_0 and
 * Q8_1 scales to f16), and the codes, the per-block scales and the block sums are stored
 * in separate arrays of the activation buffer (so wide loads of the codes are contiguous):
 *   [nb floats d][nb floats s (Q8_1 only)][n int8 codes][n/16 int16 sums (Q8_K only)].
 *
 * Each kernel exists as portable scalar C (the reference) and in AVX2 (+FMA, F16C) and
 * AVX-512 (F, BW, VL, VNNI) versions, compiled with target attributes in this one file
 * and chosen at run time from CPUID (rt_dot_isa_best). At the AVX-512 level the legacy
 * formats (Q4_0, Q4_1, Q8_0) and F16/F32 take 512-bit VNNI code (two blocks per step);
 * the legacy ones also have a rows kernel (up to RT_DOT_ROWS weight rows per call sharing
 * the activation loads, the weight scales gathered and converted 16 blocks at a time,
 * for decode's matrix-vector products); Q5_0, Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K) run their AVX2 code there. A CPU with AVX-512 but without
 * VNNI (Skylake-X) runs the AVX2 level. Integer block sums are exact in every version; the versions differ
 * only in the order of the f32 additions across blocks.
 */
#ifndef RT_DOT_H
#define RT_DOT_H

#include <stddef.h>
#include <stdint.h>

enum rt_dot_isa {
	RT_ISA_SCALAR = 0,
	RT_ISA_AVX2 = 1,    /* AVX2 + FMA + F16C */
	RT_ISA_AVX512 = 2,  /* AVX-512 F, BW, VL, DQ + VNNI (+ F16C) */
};

/* The best level this CPU supports (CPUID, cached after the first call), lowered by the
 * environment variable KVRT_ISA=scalar|avx2|avx512 when set to a lower level. */
int rt_dot_isa_best(void);
/* "scalar", "avx2", "avx512". */
const char *rt_dot_isa_name(int isa);

/* Dot of one weight row w (n values, GGUF type wtype) with an activation row xa prepared
 * by the matching rt_dot_quant: returns Σ_i w_i·x_i as described above. */
typedef float (*rt_dot_fn)(const void *w, const void *xa, int n);
/* Quantise x[n] into the activation buffer xa (rt_dot_act_bytes bytes). */
typedef void (*rt_dot_quant_fn)(const float *x, void *xa, int n);

/* Rows kept together by a rows kernel (rt_dot_rows_fn). */
#define RT_DOT_ROWS 4

/* Dots of nr (1..RT_DOT_ROWS) consecutive weight rows, row r at w + r·row_bytes, with one
 * activation row xa: out[r] = Σ_i w_r,i·x_i, each bit for bit the value the kernel's dot
 * returns for that row alone (the rows only share the activation loads). */
typedef void (*rt_dot_rows_fn)(const void *w, size_t row_bytes, const void *xa, int n, int nr,
                               float *out);

/* Activation rows kept together by an xrows kernel (rt_dot_xrows_fn). */
#define RT_DOT_XROWS 4

/* Dots of one weight row w with nx (1..RT_DOT_XROWS) activation rows, row c at
 * xa + c·xstride bytes: out[c] = Σ_i w_i·x_c,i, each bit for bit the value the kernel's
 * dot returns for that row alone (the rows only share the decoding of the weight
 * blocks): a decode step's rows of several sequences (runtime/model/rt_matmul.c). */
typedef void (*rt_dot_xrows_fn)(const void *w, const void *xa, size_t xstride, int n, int nx,
                                float *out);

typedef struct rt_dot_kernel {
	uint32_t wtype;          /* GGUF weight type */
	int block;               /* values per activation block (1 for F16/F32) */
	int isa;                 /* the level this kernel was compiled for */
	rt_dot_quant_fn quant;   /* activation preparation (F16/F32: a copy) */
	rt_dot_fn dot;
	rt_dot_rows_fn rows;     /* several rows per call, or NULL (call dot per row) */
	rt_dot_xrows_fn xrows;   /* several activation rows per call (AVX2 Q4_1 and Q8_0), or
	                            NULL (call dot per activation row) */
} rt_dot_kernel;

/* The kernel for weights of type wtype at ISA level isa (clamped to rt_dot_isa_best()), or
 * NULL when wtype is not one of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, F32.
 * The table is static: the pointer stays valid for the process. */
const rt_dot_kernel *rt_dot_kernel_get(uint32_t wtype, int isa);

/* Bytes of the activation buffer for a row of n values in front of weights of type
 * wtype (64-byte multiple); 0 when wtype is unsupported or n is not a whole number of
 * its blocks. */
size_t rt_dot_act_bytes(uint32_t wtype, int n);

#endif
