// Copies of residual streams and the arithmetic policies do on them (residuals, relative L1).
#pragma once

#include <string>
#include <vector>

#include "cache/hooks.h"

namespace flowkv::cache {

// One stream's values, batch-major, contiguous: [batch * seq * cols].
struct StreamCopy {
  int64_t batch = 0, seq = 0, cols = 0;
  std::vector<float> v;
  std::string name;  // the stream it was copied from
  bool empty() const { return v.empty(); }
};
// Copies of several streams. Streams are matched by name: a stream may be absent from some
// calls (FLUX.2's text once its K/V come from a memory), and what was stored for it is then
// left alone.
using Snapshot = std::vector<StreamCopy>;

StreamCopy copy_stream(const Stream& s, int64_t batch);
// The same into `out`, reusing its storage (the per-call copies of the step loop).
void copy_into(StreamCopy& out, const Stream& s, int64_t batch);
// out = s - base (base copied from a stream of the same shape), reusing out's storage.
void residual_into(StreamCopy& out, const Stream& s, int64_t batch, const StreamCopy& base);
StreamCopy copy_mat(Mat m);  // a [rows, cols] matrix as batch 1
Snapshot snapshot(const Streams& s);
// a - b, stream by stream (same names and shapes).
Snapshot minus(const Snapshot& a, const Snapshot& b);
StreamCopy minus(const StreamCopy& a, const StreamCopy& b);
// s += r, s = v: for every stream of s (each must have its entry in r / v).
void add_into(Streams& s, const Snapshot& r);
void assign(Streams& s, const Snapshot& v);
void add_into(Stream& s, int64_t batch, const StreamCopy& r);
bool same_shape(const StreamCopy& a, const StreamCopy& b);
// Whether a snapshot has an entry of the right shape for every stream of s (a token count may
// change between calls: the policies then compute instead of applying what they stored).
bool fits(const Snapshot& v, const Streams& s);
// mean |a - ref| / mean |ref| (infinite when the shapes differ) (FirstBlockCache, TeaCache,
// DBCache), in double.
double relative_l1(const StreamCopy& a, const StreamCopy& ref);
// mean over tokens of ||a_t||_2 / (||b_t||_2 + 1e-8) (MagCache calibration).
double mean_norm_ratio(const StreamCopy& a, const StreamCopy& b);

}  // namespace flowkv::cache
