/* kdots/neon_i8mm.h: K at 8 bits: the exact int8 dots of the q planes with K rows by SMMLA; the
 * neon_i8mm tier's, bit for bit kdots/scalar.h's rule. Included only by ../neon_i8mm.h, inside
 * the tier's target region: its pragma applies to every function here.
 *
 * SMMLA multiplies a 2 x 8 matrix of int8 by the transpose of another, accumulating the 2 x 2
 * int32 dots (exact: |q . k| <= 127 * 127 * 1024 < 2^24). Here its first operand is one query
 * head's two planes (q_hi's 8 bytes, then q_lo's: the head's packed q) and its second two K
 * rows' 8 bytes, so one instruction makes both planes' dots with two rows over 8 dims: half
 * SDOT's instructions for the same dots. Two rows' 16 bytes at a time become their two SMMLA
 * operands by a 64-bit zip, made once for every head of the group. */
#ifndef I8A_KDOTS_NEON_I8MM_H
#define I8A_KDOTS_NEON_I8MM_H

#ifndef I8A_NEON_I8MM_H
#error "kdots/neon_i8mm.h is included by ../neon_i8mm.h only"
#endif

/* Query heads whose packed q a block of K rows serves at once (4 x 4 accumulators, 8 zipped K
 * operands and 2 q operands: 26 of the 32 registers). */
#define I8A_I8MM_HEADS 4

/* Head j's packed q, qp [2 d]: per 8 dims, q_hi's 8 bytes then q_lo's (zeros with one plane). */
I8A_INLINE void i8a_qpack_neon_i8mm(const i8a_query *q, size_t j, int8_t *qp)
{
    const size_t d = q->d;
    const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
    for (size_t i = 0; i < d; i += 8)
        vst1q_s8(qp + 2 * i, vcombine_s8(vld1_s8(qh + i), q->two_planes ? vld1_s8(ql + i)
                                                                        : vdup_n_s8(0)));
}

/* The dots of NH heads' packed q (qp, 2 d bytes each) with 8 K rows (row r at rows8[r]):
 * dh[h * I8A_CHUNK + r], dl[...] for r < 8. Per 16 dims, each pair of rows zipped into the
 * operands of dims [i, i + 8) and [i + 8, i + 16), then two SMMLA per head and pair; a pair's
 * sums come out as (q_hi . k_a, q_hi . k_b, q_lo . k_a, q_lo . k_b). NH and TWO are constants
 * at every call. */
I8A_INLINE void i8a_kmm_block_neon_i8mm(const int8_t *const *rows8, const int8_t *qp, int nh,
                                        int two, size_t d, int32_t *dh, int32_t *dl)
{
    int32x4_t acc[I8A_I8MM_HEADS][4];
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            acc[h][p] = vdupq_n_s32(0);
    for (size_t i = 0; i < d; i += 16) {
        int8x16_t b[4][2];
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const int64x2_t x = vreinterpretq_s64_s8(vld1q_s8(rows8[2 * p] + i));
            const int64x2_t y = vreinterpretq_s64_s8(vld1q_s8(rows8[2 * p + 1] + i));
            b[p][0] = vreinterpretq_s8_s64(vzip1q_s64(x, y));
            b[p][1] = vreinterpretq_s8_s64(vzip2q_s64(x, y));
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) {
            const int8x16_t a0 = vld1q_s8(qp + (size_t)h * 2 * d + 2 * i);
            const int8x16_t a1 = vld1q_s8(qp + (size_t)h * 2 * d + 2 * i + 16);
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                acc[h][p] = vmmlaq_s32(vmmlaq_s32(acc[h][p], a0, b[p][0]), a1, b[p][1]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 2
        for (int p = 0; p < 4; p += 2) {        /* rows 2 p .. 2 p + 3 of each plane */
            const int64x2_t e = vreinterpretq_s64_s32(acc[h][p]);
            const int64x2_t f = vreinterpretq_s64_s32(acc[h][p + 1]);
            vst1q_s32(dh + (size_t)h * I8A_CHUNK + 2 * (size_t)p,
                      vreinterpretq_s32_s64(vzip1q_s64(e, f)));
            if (two)
                vst1q_s32(dl + (size_t)h * I8A_CHUNK + 2 * (size_t)p,
                          vreinterpretq_s32_s64(vzip2q_s64(e, f)));
        }
}

/* Exact dots of every query head's planes with rows [0, n): heads in blocks of I8A_I8MM_HEADS
 * (their packed q on the stack), rows 8 at a time, rows past n repeating row n - 1 (their dots,
 * up to the next multiple of 8, are stored and never read); prefetches the next chunk's K from
 * the first block of heads. */
I8A_INLINE void i8a_kdots_mm_neon_i8mm(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                       int32_t *dl, const int one_run)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    const int two = q->two_planes;
    const int8_t *rows[I8A_CHUNK];              /* rows in blocks: found once for all heads */
    if (!one_run)
        i8a_krows(kv, d, rows);
    _Alignas(16) int8_t qp[I8A_I8MM_HEADS * 2 * I8A_MAX_HEAD_DIM];
    for (size_t j0 = 0; j0 < nq; j0 += I8A_I8MM_HEADS) {
        const int nh = nq - j0 < I8A_I8MM_HEADS ? (int)(nq - j0) : I8A_I8MM_HEADS;
        for (int h = 0; h < nh; h++)
            i8a_qpack_neon_i8mm(q, j0 + (size_t)h, qp + (size_t)h * 2 * d);
        for (size_t s = 0; s < n; s += 8) {
            if (j0 == 0 && s < kv->next_n)
                i8a_prefetch_rows(i8a_next_krow_of(kv, s, d, one_run),
                                  (kv->next_n - s < 8 ? kv->next_n - s : 8) * d);
            const int8_t *rows8[8];
            for (size_t r = 0; r < 8; r++)
                rows8[r] = i8a_krow_of(kv, rows, s + r < n ? s + r : n - 1, d, one_run);
            int32_t *h0 = dh + j0 * I8A_CHUNK + s, *l0 = dl + j0 * I8A_CHUNK + s;
            switch (nh * 2 + two) {             /* NH and TWO as constants */
            case 9: i8a_kmm_block_neon_i8mm(rows8, qp, 4, 1, d, h0, l0); break;
            case 8: i8a_kmm_block_neon_i8mm(rows8, qp, 4, 0, d, h0, l0); break;
            case 7: i8a_kmm_block_neon_i8mm(rows8, qp, 3, 1, d, h0, l0); break;
            case 6: i8a_kmm_block_neon_i8mm(rows8, qp, 3, 0, d, h0, l0); break;
            case 5: i8a_kmm_block_neon_i8mm(rows8, qp, 2, 1, d, h0, l0); break;
            case 4: i8a_kmm_block_neon_i8mm(rows8, qp, 2, 0, d, h0, l0); break;
            case 3: i8a_kmm_block_neon_i8mm(rows8, qp, 1, 1, d, h0, l0); break;
            default: i8a_kmm_block_neon_i8mm(rows8, qp, 1, 0, d, h0, l0); break;
            }
        }
    }
}

/* The K pass of the neon_i8mm tier (attend's kdots), the span's layout a constant (one run: a
 * contiguous cache). */
I8A_INLINE void i8a_kdots_neon_i8mm(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                    int32_t *dl)
{
    if (i8a_one_run(kv))
        i8a_kdots_mm_neon_i8mm(q, kv, dh, dl, 1);
    else
        i8a_kdots_mm_neon_i8mm(q, kv, dh, dl, 0);
}

#endif
