// Attention driver: packs each source per (batch element, head) once, then runs query tiles
// in parallel. Tiles and key blocks are fixed by the shapes, so results do not depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/attention.h"
#include "ops/cpu/attention_kernels.h"

namespace flowkv::ops {

namespace {
constexpr int64_t kQueryTile = 64;
constexpr int64_t kMaxSources = 16;
}  // namespace

double attention_flops(const AttnShape& s, std::span<const KVSource> sources) {
  double pairs = 0;  // allowed (query, key) pairs per batch element and head (masks ignored)
  for (const KVSource& src : sources) {
    if (!src.causal) {
      pairs += double(s.seq_q) * double(src.len);
      continue;
    }
    for (int64_t i = 0; i < s.seq_q; ++i) {
      pairs += double(std::clamp<int64_t>(i + src.causal_offset + 1, 0, src.len));
    }
  }
  return 4.0 * double(s.head_dim) * double(s.heads) * double(s.batch) * pairs;
}

void attention(const ExecContext& ctx, const AttnShape& s, Mat q, std::span<const KVSource> sources,
               Mat out) {
  FLOWKV_CHECK(q.cols == s.heads * s.head_dim && out.cols == q.cols &&
                   q.rows >= s.q_rows(s.batch - 1) + s.seq_q && out.rows == q.rows,
               "attention: query/output shapes do not match ", s.batch, "x", s.seq_q, "x", s.heads,
               "x", s.head_dim);
  FLOWKV_CHECK(s.kv_head_count() >= 1 && s.heads % s.kv_head_count() == 0, "attention: ", s.heads,
               " query heads cannot share ", s.kv_head_count(), " key/value heads");
  const auto& kern = cpu::attn_kernels();
  if (ctx.kernels == KernelPath::kReference || s.head_dim % kern.lanes != 0 || !ctx.arena) {
    return ref::attention(s, q, sources, out);
  }
  ScopedOpTimer timer(ctx.profile ? &ctx.profile->attention : nullptr,
                      ctx.profile ? attention_flops(s, sources) : 0.0);
  Arena& ws = *ctx.arena;
  ArenaScope scope(ws);
  const int64_t hd = s.head_dim, bk = kern.key_block;
  const float scale = s.scale > 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t nsrc = static_cast<int64_t>(sources.size());
  FLOWKV_CHECK(nsrc <= kMaxSources, "attention: at most ", kMaxSources, " key sources");
  // Packed storage: per source, per (b, key/value head), nb*bk keys of hd floats for K and V.
  const int64_t kvh = s.kv_head_count();
  std::vector<int64_t> per_head(static_cast<size_t>(nsrc));
  std::vector<float*> base(static_cast<size_t>(nsrc));
  for (int64_t i = 0; i < nsrc; ++i) {
    const int64_t nb = (sources[i].len + bk - 1) / bk;
    per_head[i] = nb * bk * hd;
    base[i] = ws.floats(2 * per_head[i] * s.batch * kvh);
  }
  const int64_t bkv = s.batch * kvh;
  parallel_for(nsrc * bkv, [&](int64_t t) {
    const int64_t i = t / bkv, b = (t % bkv) / kvh, h = t % kvh;
    const KVSource& src = sources[i];
    const int64_t es = src.dtype == DType::kBF16 ? 2 : 4;
    const int64_t row0 = b * src.batch_stride();
    const auto* k = static_cast<const std::byte*>(src.k) + (row0 * src.k_stride + h * hd) * es;
    const auto* v = static_cast<const std::byte*>(src.v) + (row0 * src.v_stride + h * hd) * es;
    float* kt = base[i] + (b * kvh + h) * 2 * per_head[i];
    kern.pack(k, v, src.dtype == DType::kBF16, src.len, src.k_stride, src.v_stride, hd, kt,
              kt + per_head[i]);
  });
  const int64_t tiles = (s.seq_q + kQueryTile - 1) / kQueryTile;
  const int64_t scratch_floats = cpu::attn_scratch_floats(kQueryTile, hd, bk);
  const int threads = num_threads();  // once: the scratch is sized for this team
  float* scratch = ws.floats(scratch_floats * threads);
  const int64_t bh = s.batch * s.heads;
  parallel_for_on(threads, bh * tiles, [&](int64_t t) {
    const int64_t b = t / (s.heads * tiles), h = (t / tiles) % s.heads, tile = t % tiles;
    const int64_t i0 = tile * kQueryTile, nq = std::min(kQueryTile, s.seq_q - i0);
    cpu::PackedSource packed[kMaxSources];
    for (int64_t i = 0; i < nsrc; ++i) {
      const KVSource& src = sources[i];
      const float* kt = base[i] + (b * kvh + s.kv_head(h)) * 2 * per_head[i];
      packed[i] = {kt, kt + per_head[i], src.len, src.causal, src.causal_offset, src.valid_row(b)};
    }
    const int64_t row = s.q_rows(b) + i0;
    kern.block(q.row(row) + h * hd, q.stride, nq, i0, hd, scale, packed, static_cast<int>(nsrc),
               out.row(row) + h * hd, out.stride, scratch + thread_index() * scratch_floats);
  });
}

}  // namespace flowkv::ops
