/* emu_attention.cpp: runs the CUDA attention kernels themselves (from
 * kernels/cuda/cuda_attention_kernels.cuh) on the CPU emulator (emu.h), against
 * a double-precision reference on the same fp16 KV.
 *
 * Beyond check_kernels under the emulator, it forces the split-K plans (one
 * pass, as planned for an H200, many splits) and runs every case under two
 * thread orders that must agree bit for bit, so a shared-memory race shows. */
#include "emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

/* The kernels under test. */
#include "kernels/cuda/cuda_attention_kernels.cuh"

/* ---- the checks ----------------------------------------------------------------- */

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
}

typedef struct seq_spec {
    int32_t store, n_slots_before, n_new;
} seq_spec;

typedef struct cfg_spec {
    const char *name;
    int32_t n_kv, hd, n_heads, n_layers;
    int32_t bt[2], nb[2]; /* nb[1] == 0: one store */
    int32_t window;       /* > 0: a sliding-window layer's last slots only */
} cfg_spec;

static int g_failed;

/* Runs one case with the kernels and returns the output; ref receives the
 * double-precision reference. */
static std::vector<float> run_case(const cfg_spec &c, const std::vector<seq_spec> &seqs,
                                   const std::vector<int32_t> &order, int32_t sm_count,
                                   uint64_t data_seed, uint64_t order_seed, std::vector<double> *ref,
                                   cuda_att_plan *plan_out)
{
    rs = data_seed;
    emu_order_seed = order_seed;
    const int32_t n_stores = c.nb[1] ? 2 : 1, layer = c.n_layers - 1;
    const int32_t n_seqs = (int32_t)seqs.size();
    /* Stores, with every slot of every sequence filled with random fp16. */
    std::vector<__half> K[2], V[2];
    for (int s = 0; s < n_stores; s++) {
        size_t n = (size_t)c.n_layers * c.nb[s] * c.n_kv * c.bt[s] * c.hd;
        K[s].resize(n);
        V[s].resize(n);
        for (size_t i = 0; i < n; i++) {
            K[s][i] = __float2half_rn(frand());
            V[s][i] = __float2half_rn(frand());
        }
    }
    /* Fragmented block tables. */
    std::vector<int32_t> ids[2];
    int32_t next[2] = {0, 0}, max_blocks = 1;
    for (int s = 0; s < n_stores; s++) {
        for (int32_t i = 0; i < c.nb[s]; i++)
            ids[s].push_back(i);
        for (int32_t i = c.nb[s] - 1; i > 0; i--) {
            int32_t j = (int32_t)(rs % (uint64_t)(i + 1));
            frand();
            std::swap(ids[s][i], ids[s][j]);
        }
    }
    for (const seq_spec &q : seqs) {
        int32_t nb = (q.n_slots_before + q.n_new + c.bt[q.store] - 1) / c.bt[q.store];
        if (nb > max_blocks)
            max_blocks = nb;
    }
    std::vector<int32_t> tables((size_t)n_seqs * max_blocks, 0), seq_store(n_seqs);
    for (int32_t i = 0; i < n_seqs; i++) {
        const int s = seqs[i].store;
        int32_t nb = (seqs[i].n_slots_before + seqs[i].n_new + c.bt[s] - 1) / c.bt[s];
        if (next[s] + nb > c.nb[s]) {
            fprintf(stderr, "emu_attention: case needs more blocks than store %d has\n", s);
            exit(2);
        }
        for (int32_t j = 0; j < nb; j++)
            tables[(size_t)i * max_blocks + j] = ids[s][next[s]++];
        seq_store[i] = s;
    }
    std::vector<int32_t> tok_seq, tok_slot;
    for (int32_t oi : order)
        for (int32_t p = 0; p < seqs[oi].n_new; p++) {
            tok_seq.push_back(oi);
            tok_slot.push_back(seqs[oi].n_slots_before + p);
        }
    const int32_t n_tokens = (int32_t)tok_seq.size();
    std::vector<int32_t> tile_start(n_tokens + 1), zeros(n_tokens, 0);
    int32_t max_len = 0, max_slots = 0;
    const int32_t n_tiles = cuda_att_tiles(tok_seq.data(), n_tokens, tile_start.data(), &max_len);
    for (int32_t s : tok_slot)
        if (s + 1 > max_slots)
            max_slots = s + 1;
    const size_t qw = (size_t)c.n_heads * c.hd;
    std::vector<float> q((size_t)n_tokens * qw);
    for (float &x : q)
        x = 3.0f * frand();
    const float scale = 1.0f / sqrtf((float)c.hd);

    cuda_kv_desc kd;
    memset(&kd, 0, sizeof kd);
    for (int s = 0; s < n_stores; s++) {
        kd.k[s] = (uint8_t *)K[s].data();
        kd.v[s] = (uint8_t *)V[s].data();
        kd.n_blocks[s] = c.nb[s];
        kd.block_tokens[s] = c.bt[s];
        kd.type[s] = DP_KV_F16;
        kd.row_bytes[s] = c.hd * (int32_t)sizeof(__half);
        kd.blk_bytes[s] = (int64_t)c.n_kv * c.bt[s] * kd.row_bytes[s];
    }
    kd.n_kv = c.n_kv;
    kd.head_dim = c.hd;
    cuda_batch_dev bd;
    memset(&bd, 0, sizeof bd);
    bd.tokens = zeros.data();
    bd.pos = tok_slot.data();
    bd.seq = tok_seq.data();
    bd.slot = tok_slot.data();
    bd.block_tables = tables.data();
    bd.out_tokens = zeros.data();
    bd.seq_store = seq_store.data();
    bd.tile_start = tile_start.data();

    cuda_att_plan p = cuda_att_make_plan(n_tiles, max_len, max_slots, n_tokens, c.n_heads, c.n_kv,
                                         c.hd, sm_count);
    *plan_out = p;
    std::vector<float> out((size_t)n_tokens * qw, NAN);
    std::vector<float> part(p.splits > 1 ? cuda_att_part_floats(&p, n_tokens, c.n_heads, c.hd) : 1, NAN);
    float *qp = q.data(), *op = out.data(), *pp = part.data();
    dim3 grid((unsigned)n_tiles, (unsigned)(c.n_kv * p.n_rchunks), (unsigned)p.splits);
    emu_launch(grid, NT, cuda_att_smem(c.hd), [&]() {
        cuda_attn_kernel(kd, layer, bd, max_blocks, n_tokens, c.n_heads, p.n_rchunks, scale,
                         c.window, qp, op, pp, p.split_len, p.splits);
    });
    if (p.splits > 1) {
        const int32_t n_rows = n_tokens * c.n_heads;
        emu_launch(dim3((unsigned)n_rows, 1, 1), 128, 0,
                   [&]() { cuda_attn_combine(pp, op, n_rows, c.hd, p.splits); });
    }

    /* Reference: softmax over slots 0..slot of the token's sequence (its
     * last window of them where the case has a window). */
    ref->assign(out.size(), 0.0);
    const int32_t group = c.n_heads / c.n_kv;
    std::vector<double> sc;
    for (int32_t t = 0; t < n_tokens; t++) {
        const int32_t s = tok_seq[t], st = seq_store[s], bt = c.bt[st], n = tok_slot[t] + 1;
        const int32_t p0 = c.window > 0 && n > c.window ? n - c.window : 0;
        sc.assign(n, 0.0);
        for (int32_t h = 0; h < c.n_heads; h++) {
            const int32_t kvh = h / group;
            const float *qh = q.data() + ((size_t)t * c.n_heads + h) * c.hd;
            double mx = -INFINITY, sum = 0;
            for (int32_t pidx = p0; pidx < n; pidx++) {
                const int32_t blk = tables[(size_t)s * max_blocks + pidx / bt];
                const size_t row =
                    ((((size_t)layer * c.nb[st] + blk) * c.n_kv + kvh) * bt + pidx % bt) * c.hd;
                double d = 0;
                for (int32_t e = 0; e < c.hd; e++)
                    d += (double)qh[e] * (double)__half2float(K[st][row + e]);
                sc[pidx] = d * scale;
                mx = sc[pidx] > mx ? sc[pidx] : mx;
            }
            for (int32_t pidx = p0; pidx < n; pidx++) {
                sc[pidx] = exp(sc[pidx] - mx);
                sum += sc[pidx];
            }
            double *o = ref->data() + ((size_t)t * c.n_heads + h) * c.hd;
            for (int32_t pidx = p0; pidx < n; pidx++) {
                const int32_t blk = tables[(size_t)s * max_blocks + pidx / bt];
                const size_t row =
                    ((((size_t)layer * c.nb[st] + blk) * c.n_kv + kvh) * bt + pidx % bt) * c.hd;
                for (int32_t e = 0; e < c.hd; e++)
                    o[e] += sc[pidx] / sum * (double)__half2float(V[st][row + e]);
            }
        }
    }
    return out;
}

static void check(const cfg_spec &c, const char *label, const std::vector<seq_spec> &seqs,
                  const std::vector<int32_t> &order, int32_t sm_count)
{
    std::vector<double> ref, ref2;
    cuda_att_plan p, p2;
    const uint64_t data_seed = 0x1234567ull + (uint64_t)sm_count * 7919u + seqs.size();
    std::vector<float> a = run_case(c, seqs, order, sm_count, data_seed, 0xabcdefull, &ref, &p);
    std::vector<float> b = run_case(c, seqs, order, sm_count, data_seed, 0x7777123ull, &ref2, &p2);
    double num = 0, den = 0;
    size_t bad = 0, differ = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!isfinite(a[i])) {
            bad++;
            continue;
        }
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            differ++;
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    const bool ok = bad == 0 && differ == 0 && rel < 1e-5;
    if (!ok)
        g_failed++;
    printf("  %-22s %-30s sms %4d: %zu rows, %d row chunks, %d splits of %d: rel %.2e%s%s%s\n", c.name,
           label, sm_count, a.size() / (size_t)c.hd, p.n_rchunks, p.splits, p.split_len, rel,
           bad ? " NON-FINITE" : "", differ ? " ORDER-DEPENDENT" : "", ok ? " ok" : " FAIL");
}

int main(void)
{
    const cfg_spec cfgs[] = {
        {"hd64 gqa 8/2, 2 stores", 2, 64, 8, 2, {16, 8}, {48, 160}, 0},
        {"hd128 mha 2", 2, 128, 2, 1, {16, 0}, {160, 0}, 0},
        {"hd256 gqa 3/1", 1, 256, 3, 1, {32, 0}, {80, 0}, 0},
        {"hd80 gqa 12/2, 2 stores", 2, 80, 12, 2, {16, 4}, {48, 400}, 0},
        /* Sliding-window layers: windows that start inside a key tile and a
         * split, and Gemma 3's head and window. */
        {"hd64 gqa 8/2, window 45", 2, 64, 8, 2, {16, 8}, {48, 160}, 45},
        {"hd256 gqa 4/1, window 512", 1, 256, 4, 1, {16, 0}, {160, 0}, 512},
    };
    printf("emu_attention: the CUDA attention kernels, emulated on the CPU\n");
    for (const cfg_spec &c : cfgs) {
        const int32_t s1 = c.nb[1] ? 1 : 0;
        /* A prefill chunk over history crossing blocks, a long decode, short
         * ones, a chunk from slot 0 and a first token. */
        const std::vector<seq_spec> mixed = {{0, 70, 37}, {s1, 1100, 1}, {s1, 5, 1}, {0, 0, 19}, {0, 0, 1}};
        const std::vector<int32_t> morder = {1, 0, 2, 3, 4};
        check(c, "mixed, planned as on an H200", mixed, morder, 132);
        check(c, "mixed, one pass", mixed, morder, 1);
        check(c, "mixed, many splits", mixed, morder, 100000);
        const std::vector<seq_spec> dec = {{s1, 600, 1}, {0, 64, 1}, {0, 63, 1}, {s1, 0, 1}};
        const std::vector<int32_t> dorder = {0, 1, 2, 3};
        check(c, "decode, many splits", dec, dorder, 100000);
    }
    printf("emu_attention: %s\n", g_failed ? "FAILED" : "all cases passed");
    return g_failed ? 1 : 0;
}
