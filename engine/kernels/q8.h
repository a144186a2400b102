// What q8_gemm.cpp and q8_avx2.cpp share: whether the compiler gets their x86 code, and the AVX2 code's entry points.
#pragma once

// Their target attributes need gcc >= 8 or clang >= 7 (the first with AVX-512 VNNI); an older compiler, or another
// architecture, gets q8_gemm.cpp's stubs, and the rest of the library still builds.
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 7) || (!defined(__clang__) && __GNUC__ >= 8))
#define Q8_X86 1
#else
#define Q8_X86 0
#endif

#if Q8_X86
// q8_avx2.cpp: q8_gemm.cpp's quantize_row and q8_panels for AVX2 (bits 4 or 8), the same bits.
void q8_quantize_row_avx2(const float* x, long K, signed char* xq, float* dx, float* sx);
void q8_panels_avx2(int bits, const signed char* xq, const float* dx, const float* sx, long M, long K,
                    const unsigned char* Q, const float* D, const float* Mn, float* y, long N, long p0, long p1);
#endif

// q8_gemm.cpp: panel8_screened's bounds (panel_gemm.cpp; also called from tests); where there is no q8 code every
// row is marked full.
extern "C" void q8_screen8(const float* x, long M, long K, const unsigned char* Q, const float* D,
                           const float* S, float* hi, float* lo, int* full, long N, int threads);
